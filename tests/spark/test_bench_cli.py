"""``bkctl bench spark`` on a tiny run (its own temporary appliance): the
JSON document has every figure, for both sources and the ceiling, and the
run cleans up.  Speed itself is measured by the bench, never asserted."""

from __future__ import annotations

import json
import os

import psutil
import pytest
from click.testing import CliRunner

from cli.main import cli


def test_bench_spark_json_reports_every_source(spark, tmp_path):
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    result = CliRunner().invoke(cli, ["bench", "spark", "--sizes", "100", "--entries", "300",
                                      "--ledgers", "2", "--repeat", "1", "--dir", str(tmp_path),
                                      "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output.strip().splitlines()[-1])
    (run,) = doc["sizes"]
    assert (run["size"], run["rows"], len(run["ledgers"])) == (100, 600, 2)
    assert run["payload_mb"] == 600 * 100 / 1e6
    for name in ("bookkeeper", "parquet", "python_memory_source"):
        m = run[name]
        assert len(m["runs_s"]) == 1 and m["best_s"] == min(m["runs_s"]) > 0
        assert m["rows_per_s"] == pytest.approx(600 / m["best_s"], rel=1e-3)  # best_s rounded
        cpu = m["cpu_us_per_row"]  # per process kind, over the timed runs
        assert set(cpu) == {"bookies", "spark_jvm", "python_workers"}
        assert min(cpu.values()) >= 0 and cpu["spark_jvm"] > 0
    assert run["ratio_to_parquet"] == run["bookkeeper"]["rows_per_s"] / \
        run["parquet"]["rows_per_s"]
    assert run["ratio_to_memory_source"] == run["bookkeeper"]["rows_per_s"] / \
        run["python_memory_source"]["rows_per_s"]
    assert doc["read_batch_entries"] == 8192  # the appliance's default
    assert os.listdir(tmp_path) == []  # appliance, Parquet files: all removed
    leftover = {p.pid for p in psutil.Process().children(recursive=True)} - before
    assert not [p for p in leftover if psutil.pid_exists(p) and "appliance" in " ".join(
        psutil.Process(p).cmdline())]  # the temporary supervisor and bookies are gone


def test_bench_spark_read_batch_is_for_the_temporary_appliance_only(tmp_path):
    config = tmp_path / "a.toml"
    config.write_text("")
    result = CliRunner().invoke(cli, ["bench", "spark", "--config", str(config),
                                      "--read-batch-entries", "8192"])
    assert result.exit_code != 0 and "server.batch_entries_max" in result.output


def test_bench_spark_refuses_bad_sizes():
    result = CliRunner().invoke(cli, ["bench", "spark", "--sizes", "100,x"])
    assert result.exit_code != 0 and "comma-separated list of byte sizes" in result.output


def test_bench_spark_log_reads_the_same_log_hot_then_cold(spark, tmp_path):
    result = CliRunner().invoke(cli, ["bench", "spark-log", "--records", "600", "--size", "50",
                                      "--segments", "2", "--repeat", "1", "--dir",
                                      str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output.strip().splitlines()[-1])
    assert (doc["records"], doc["size"]) == (600, 50)
    # segments roll at an entry's end: 600 records may be one entry
    assert doc["hot"]["segments"] == doc["cold"]["segments"] >= 1
    for m in (doc["hot"]["bookkeeper"], doc["cold"]["bookkeeper"],
              doc["cold"]["parquet_direct"]):
        assert len(m["runs_s"]) == len(m["load_avg_1m"]) == 1
        assert m["rows_per_s"] == pytest.approx(600 / m["best_s"], rel=1e-3)
    assert doc["cold_to_hot"] == doc["cold"]["bookkeeper"]["rows_per_s"] / \
        doc["hot"]["bookkeeper"]["rows_per_s"]
    assert doc["source"]["worker"] == doc["source"]["driver"]  # the tree measured
    assert os.listdir(tmp_path) == []


def test_bench_spark_log_refuses_unknown_tiers():
    result = CliRunner().invoke(cli, ["bench", "spark-log", "--tiers", "warm"])
    assert result.exit_code != 0 and "hot, cold or hot,cold" in result.output
