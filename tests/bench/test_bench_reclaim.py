"""``bkctl bench reclaim``: a tiny run reports each phase and the space
really comes back (the figures themselves are the bench's, not asserted)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from cli.main import cli


def test_reclaim_reports_phases_and_gives_the_space_back(tmp_path):
    result = CliRunner().invoke(cli, ["bench", "reclaim", "--mb", "8", "--entry-bytes", "4096",
                                      "--keep", "0.25", "--gc-interval-ms", "200",
                                      "--dir", str(tmp_path), "--json"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["compaction"] == "major"  # 0.25 kept: over the minor threshold
    assert 0 < doc["gc_s"] <= doc["space_back_s"] and doc["compact_s"] > 0
    assert doc["space_back_s"] >= doc["gc_s"] + doc["compact_s"] - 0.01
    for bookie, after in doc["ledger_dir_bytes_after"].items():
        assert after < doc["ledger_dir_bytes_before"][bookie] / 2, bookie
    assert doc["after_over_live"] < 1.5
    assert all(run["logs_removed"] >= 1 for run in doc["runs"].values())
    assert list(tmp_path.iterdir()) == []  # its temp dir is gone


def test_reclaim_cold_moves_a_log_and_sees_the_bookies_disk_come_back(tmp_path):
    result = CliRunner().invoke(cli, ["bench", "reclaim", "--cold", "--mb", "4",
                                      "--entry-bytes", "1024", "--gc-interval-ms", "200",
                                      "--dir", str(tmp_path), "--json"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["segments_moved"] >= 1 and doc["ledgers_deleted"] == doc["segments_moved"]
    assert doc["bytes_moved"] >= 0.9 * doc["bytes_written"]  # random records: no shrinking
    for bookie, after in doc["ledger_dir_bytes_after"].items():
        assert after <= doc["ledger_dir_bytes_before"][bookie] - 0.9 * doc["bytes_written"]
    assert doc["space_back_s"] > 0 and len(doc["load_average_before"]) == 3
    assert list(tmp_path.iterdir()) == []  # its temp dir is gone
