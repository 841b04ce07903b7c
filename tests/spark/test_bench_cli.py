"""``bkctl bench spark``, ``spark-log`` and ``spark-stream`` on tiny runs
(their own temporary appliance): the JSON document has every figure, for
every source, part and ceiling (``spark-stream``: its sink's target logs
hold exactly the backlog's records), and the run cleans up.  Speed itself
is measured by the bench, never asserted."""

from __future__ import annotations

import json
import os
import shutil
import tempfile

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


def test_bench_spark_log_reads_a_hot_and_a_cold_log_in_turn(spark, tmp_path):
    result = CliRunner().invoke(cli, ["bench", "spark-log", "--records", "600", "--size", "50",
                                      "--segments", "2", "--repeat", "1", "--dir",
                                      str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output.strip().splitlines()[-1])
    assert (doc["records"], doc["size"]) == (600, 50)
    assert doc["logs"] == {"hot": doc["log"] + "-hot", "cold": doc["log"]}
    # segments roll at an entry's end: 600 records may be one entry
    assert doc["hot"]["segments"] == doc["cold"]["segments"] >= 1
    for m in (doc["hot"]["bookkeeper"], doc["hot"]["read_log"], doc["cold"]["bookkeeper"],
              doc["cold"]["read_log"], doc["cold"]["parquet_direct"]):
        assert len(m["runs_s"]) == len(m["load_avg_1m"]) == 1
        assert m["rows_per_s"] == pytest.approx(600 / m["best_s"], rel=1e-3)
    assert set(doc["cold"]["read_log_call_s"]) == {"first", "cached"}
    assert doc["cold_to_hot"] == doc["cold"]["bookkeeper"]["rows_per_s"] / \
        doc["hot"]["bookkeeper"]["rows_per_s"]
    assert doc["cold_native_to_hot"] == doc["cold"]["read_log"]["rows_per_s"] / \
        doc["hot"]["bookkeeper"]["rows_per_s"]
    assert doc["source"]["worker"] == doc["source"]["driver"]  # the tree measured
    assert os.listdir(tmp_path) == []


def test_bench_spark_log_refuses_unknown_tiers():
    result = CliRunner().invoke(cli, ["bench", "spark-log", "--tiers", "warm"])
    assert result.exit_code != 0 and "hot, cold or hot,cold" in result.output


@pytest.fixture
def short_dir():
    """A folder with a short path: the log server's ipc:// socket lives
    under it (a Unix socket path has at most 107 bytes)."""
    path = tempfile.mkdtemp(prefix="bkt")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_bench_spark_stream_reports_every_figure(spark, short_dir):
    result = CliRunner().invoke(cli, ["bench", "spark-stream", "--records", "3000", "--size",
                                      "100", "--rate", "200", "--duration-s", "3", "--dir",
                                      short_dir, "--json"])
    assert result.exit_code == 0, (result.output, result.exception)
    doc = json.loads(result.output.strip().splitlines()[-1])
    backlog, latency, sink = doc["backlog"], doc["latency"], doc["sink"]
    figures = [backlog["batch"]["rows_per_s"], backlog["stream"]["rows_per_s"],
               backlog["stream_to_batch"], latency["p50_ms"], latency["p99_ms"],
               sink["batch"]["rows_per_s"], sink["stream"]["rows_per_s"]]
    assert all(isinstance(f, float) and f > 0 for f in figures), figures
    assert latency["p50_ms"] <= latency["p99_ms"] <= latency["max_ms"]
    assert (latency["records"], latency["warmup_s"]) == (600, 0.75)
    assert 0 < latency["rows_measured"] <= 600
    assert backlog["stream_to_batch"] == backlog["stream"]["rows_per_s"] / \
        backlog["batch"]["rows_per_s"]
    # each target log holds every backlog record once (counted by a log reader)
    assert sink["batch"]["records_in_log"] == sink["stream"]["records_in_log"] == 3000
    assert sink["batch"]["log"] != sink["stream"]["log"]
    for part in (backlog, latency, sink):
        assert part["load_avg_1m"] >= 0
    assert os.listdir(short_dir) == []  # appliance, checkpoints: all removed


def test_bench_spark_stream_help_and_bad_parts():
    result = CliRunner().invoke(cli, ["bench", "spark-stream", "--help"])
    assert result.exit_code == 0
    for option in ("--records", "--size", "--rate", "--duration-s", "--master", "--dir",
                   "--config", "--parts", "--json"):
        assert option in result.output
    assert "foreachBatch" in result.output and "availableNow" in result.output
    result = CliRunner().invoke(cli, ["bench", "spark-stream", "--parts", "backlog,warm"])
    assert result.exit_code != 0 and "backlog, latency, sink" in result.output
