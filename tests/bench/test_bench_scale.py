"""``bkctl bench scale``: tiny sweeps report one row per size with what
really happened (ledgers listed, stored and booted, handles opened, adds
made), a growth exponent, a plot; their temporary folders are removed.
The figures themselves are the bench's, not asserted."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from appliance.bench.scale import growth_exponent
from cli.main import cli


def _run(tmp_path, *args) -> dict:
    work = tmp_path / "work"
    work.mkdir()
    result = CliRunner().invoke(cli, ["bench", "scale", *args, "--dir", str(work), "--json"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert list(work.iterdir()) == []  # every temporary folder is gone
    return json.loads(result.output)


def test_growth_exponent_tells_constant_from_linear_and_square():
    rows = [{"n": n, "flat": 5.0, "lin": 3.0 * n, "sq": n * n} for n in (10, 100, 1000)]
    assert growth_exponent(rows, "n", "flat") == 0.0
    assert growth_exponent(rows, "n", "lin") == pytest.approx(1.0)
    assert growth_exponent(rows, "n", "sq") == pytest.approx(2.0)
    assert growth_exponent(rows[:1], "n", "lin") is None  # one point: no slope


def test_stored_sweep_boots_a_bookie_holding_every_ledger(tmp_path):
    plot = tmp_path / "stored.png"
    doc = _run(tmp_path, "stored", "--points", "10,300", "--plot", str(plot))
    assert [r["ledgers"] for r in doc["rows"]] == [10, 300]
    for row in doc["rows"]:
        assert row["ledgers_reported"] == row["ledgers"]  # the booted bookie holds them all
        assert row["boot_to_serving_s"] > 0 and row["rss_mb"] > 10
        assert row["index_snapshot_bytes"] > 0
    assert set(doc["growth_exponent"]) == {"boot_to_serving_s", "rss_mb"}
    assert plot.stat().st_size > 1000


def test_metadata_sweep_counts_what_it_created_on_both_stores(tmp_path):
    doc = _run(tmp_path, "metadata", "--points", "20,60")
    rows = {(r["backend"], r["ledgers"]): r for r in doc["rows"]}
    assert set(rows) == {("sqlite", 20), ("sqlite", 60), ("zk", 20), ("zk", 60)}
    for row in rows.values():
        assert row["create_ms"] > 0 and row["open_ms"] > 0 and row["list_ms"] >= 0
    assert "zk:create_ms" in doc["growth_exponent"]


def test_handles_sweep_measures_memory_per_open_handle(tmp_path):
    doc = _run(tmp_path, "handles", "--points", "5,40")
    assert [r["handles"] for r in doc["rows"]] == [5, 40]
    assert all(r["added_mb"] == pytest.approx(r["kb_per_handle"] * r["handles"] / 1000, abs=0.01)
               for r in doc["rows"])


def test_ledgers_sweep_writes_to_each_number_of_ledgers(tmp_path):
    doc = _run(tmp_path, "ledgers", "--points", "1,5", "--entries", "500", "--rate", "500",
               "--duration-s", "0.5", "--gc-threshold", "40000",
               "--switch-interval-us", "20000", "--add-messages-inflight", "3")
    assert [r["ledgers"] for r in doc["rows"]] == [1, 5]
    for row in doc["rows"]:
        assert row["adds_per_s"] > 0 and row["open_p99_ms"] > 0
        assert row["open_adds_per_s"] <= 500 * 1.1  # the open loop kept its schedule
        assert row["client_gc_threshold0"] == 40_000  # the client processes raised it
        assert row["client_switch_interval_us"] == 20_000  # and this one
        assert row["client_add_messages_inflight"] == 3  # and the driver's hold


def test_points_must_be_positive_integers(tmp_path):
    result = CliRunner().invoke(cli, ["bench", "scale", "handles", "--points", "10,x"])
    assert result.exit_code != 0 and "comma-separated list of integers" in result.output
