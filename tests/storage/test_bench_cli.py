"""``bkctl bench storage``: click's runner and a real subprocess, on tiny runs
(speed itself is measured by the bench, never asserted here)."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from cli.main import cli
from tests.support.bkctl import bkctl

KEYS = {"adds_per_s", "mb_per_s", "p50_ms", "p99_ms", "disk_fdatasync_per_s",
        "disk_direct_mb_per_s"}


def test_bench_storage_json_has_the_contract_keys(tmp_path):
    result = CliRunner().invoke(cli, ["bench", "storage", "--size", "1024", "--entries", "3000",
                                      "--baseline-s", "0.05", "--dir", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert KEYS <= set(doc)
    assert doc["entries"] == 3000 and doc["size"] == 1024
    assert doc["adds_per_s"] > 0 and doc["p99_ms"] >= doc["p50_ms"] > 0
    assert doc["mb_per_s"] == pytest.approx(doc["adds_per_s"] * 1024 / 1e6)
    assert os.listdir(tmp_path) == []  # the run cleaned up after itself


def test_bench_storage_subprocess_text_output(tmp_path):
    proc = bkctl("bench", "storage", "--size", "4096", "--entries", "500", "--baseline-s",
                 "0.05", "--dir", str(tmp_path), text=True)
    assert proc.returncode == 0, proc.stderr
    assert "adds/s" in proc.stdout and "fdatasync/s" in proc.stdout


def test_bench_storage_bad_dir_is_one_line_error(tmp_path):
    result = CliRunner().invoke(cli, ["bench", "storage", "--dir", str(tmp_path / "missing")])
    assert result.exit_code != 0
    assert "does not exist" in result.output
