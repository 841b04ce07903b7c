"""``bkctl bench metadata`` runs on both backends and checks its own result
(no lost update); speed is reported, never asserted."""

from __future__ import annotations

import json

from click.testing import CliRunner

from cli.main import cli


def test_bench_metadata_json_on_both_backends(backend):
    result = CliRunner().invoke(cli, ["bench", "metadata", "--uri", backend.uri, "--ops", "40",
                                      "--processes", "1,2", "--warmup", "10", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    rows = doc["results"]
    assert [(r["processes"], r["node"]) for r in rows] == [(1, "shared"), (2, "shared"),
                                                          (2, "own")]
    for row in rows:
        assert row["store"] == backend.uri
        assert row["ops"] == 40 * row["processes"]
        assert row["cas_per_s"] > 0 and row["seconds"] > 0
    assert rows[0]["conflicts"] == 0 and rows[2]["conflicts"] == 0


def test_bench_metadata_refuses_bad_process_counts():
    result = CliRunner().invoke(cli, ["bench", "metadata", "--processes", "0,x"])
    assert result.exit_code != 0
    assert "Invalid value for '--processes'" in result.output
