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
