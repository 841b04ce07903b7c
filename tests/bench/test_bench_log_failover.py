"""``bkctl bench log --producers N --kill-owner``: what a user sees from a
tiny run (the figures, the log read back, where the time went, the words).
The stall itself is measured by the bench, never asserted here."""

from __future__ import annotations

import json

from click.testing import CliRunner

from cli.bench_log import failover_lines
from cli.main import cli

KEYS = {"longest_stall_ms", "stall_ms_per_producer", "usual_gap_p99_ms",
        "first_ack_after_kill_ms", "all_resumed_ms", "lost", "duplicated", "out_of_order",
        "records_acknowledged", "records_stored", "owner_killed", "timeline", "kill_after_s",
        "take_over_ms"}


def test_kill_owner_on_a_temporary_appliance(tmp_path):
    result = CliRunner().invoke(cli, ["bench", "log", "--producers", "2", "--kill-owner",
                                      "--kill-after-seconds", "0.5", "--size", "64",
                                      "--dir", str(tmp_path), "--json"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)  # progress lines go to stderr
    assert KEYS <= set(doc) and doc["producers"] == 2 and doc["size"] == 64
    assert doc["lost"] == 0 and doc["duplicated"] == 0 and doc["out_of_order"] == []
    assert doc["records_stored"] == doc["records_acknowledged"] > 2
    assert len(doc["stall_ms_per_producer"]) == 2
    assert doc["longest_stall_ms"] == max(doc["stall_ms_per_producer"]) > 0
    assert 0 < doc["first_ack_after_kill_ms"] <= doc["all_resumed_ms"]
    t = doc["timeline"]
    # the supervisor saw the exit and released the lease; the registry showed it go
    assert t["supervisor_released"] is not None
    assert "lease" in [what for _, what, value in t["registry"] if value is None]
    assert any(what == "owned" for sid in ("logserver-1", "logserver-2")
               for _, what in t[sid])
    steps = doc["take_over_ms"]
    assert set(steps) == {"ownership", "recovery", "complete", "new_ledger", "rebuild",
                          "records_learnt"}
    # the log's records are all in the last two minutes: the rebuild learns them all
    assert steps["records_learnt"] == doc["records_stored"]
    assert all(steps[k] > 0 for k in ("ownership", "recovery", "new_ledger", "rebuild"))
    assert list(tmp_path.iterdir()) == []  # the temporary appliance is gone
    text = "\n".join(failover_lines(doc))
    assert f"longest stall of a producer {doc['longest_stall_ms']:,} ms" in text
    assert "0 lost, 0 stored twice" in text and doc["owner_killed"] in text


def test_kill_owner_needs_producers():
    result = CliRunner().invoke(cli, ["bench", "log", "--kill-owner"])
    assert result.exit_code == 2 and "--kill-owner goes with --producers" in result.output
