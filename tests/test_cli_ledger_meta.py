"""`bkctl ledger meta` shows where a ledger's fragments are: on an appliance
of one host it says once that write sets cannot be spread, instead of a
warning-looking "SHARED" on every fragment; --json is the same either way."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

import cli.ledger as ledger_cli
from appliance.protocol.placement import Location
from cli.main import cli

ENSEMBLES = [(0, ("bookie-1", "bookie-2", "bookie-3")), (40, ("bookie-1", "bookie-2", "bookie-4"))]


class _Connection:
    def __init__(self, hosts):
        self.driver = SimpleNamespace(locations={b: Location(h) for b, h in hosts.items()})

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def ledger_metadata(self, ledger_id):
        return SimpleNamespace(state="CLOSED", last_entry_id=99, ensemble_size=3,
                               write_quorum=3, ack_quorum=2, ensembles=ENSEMBLES)


def _meta(monkeypatch, hosts, *args):
    monkeypatch.setattr(ledger_cli, "_connect", lambda config_path: _Connection(hosts))
    result = CliRunner().invoke(cli, ["ledger", "meta", "7", *args])
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("spread", [False, True])
def test_one_host_is_said_once_and_the_json_is_unchanged(monkeypatch, spread):
    one = {b: "box" for b in ("bookie-1", "bookie-2", "bookie-3", "bookie-4")}
    many = {"bookie-1": "a", "bookie-2": "b", "bookie-3": "c", "bookie-4": "c"}
    out = _meta(monkeypatch, many if spread else one)
    if spread:
        assert "one host" not in out and out.count("write sets on distinct hosts") == 2
    else:
        assert "SHARED" not in out and out.count("one host (box)") == 1
        assert "write sets cannot be spread" in out
        assert "  from entry 40: bookie-1, bookie-2, bookie-4\n" in out
    doc = json.loads(_meta(monkeypatch, many if spread else one, "--json"))
    assert [p["write_sets_on_distinct_hosts"] for p in doc["placement"]] == [spread, spread]
    assert doc["placement"][0]["hosts"] == (["a", "b", "c"] if spread else ["box"] * 3)


def test_shared_hosts_on_an_appliance_of_several_are_still_flagged(monkeypatch):
    out = _meta(monkeypatch, {"bookie-1": "a", "bookie-2": "a", "bookie-3": "b",
                              "bookie-4": "b"})
    assert "one host" not in out and out.count("write sets on SHARED hosts") == 2
