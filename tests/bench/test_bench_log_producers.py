"""``bkctl bench log --producers N``: what a user sees from tiny runs (the
keys, both modes, the peer's ratio, bad options).  Speed itself is measured
by the bench, never asserted here."""

from __future__ import annotations

import json

from click.testing import CliRunner

from cli.main import cli

KEYS = {"mode", "records_per_s", "p50_ms", "p99_ms", "p999_ms", "errors", "vs_writer",
        "cpu_us_per_record"}


def _bench(*args: str) -> dict:
    result = CliRunner().invoke(cli, ["bench", "log", *args, "--json"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)  # progress lines go to stderr


def test_producers_sync_and_async_on_a_temporary_appliance(tmp_path):
    peer = tmp_path / "peer.sh"  # a stand-in for the Redis script: its output format
    peer.write_text('echo "redis_stream 1000 records/s write 2000 records/s read '
                    'p50 1.00 p99 2.50 ($*)"\n')
    doc = _bench("--producers", "2", "--records", "300", "--size", "64", "--peer", str(peer),
                 "--baseline-records", "200", "--dir", str(tmp_path))
    assert [r["mode"] for r in doc["runs"]] == ["sync", "async"]
    assert doc["producers"] == 2 and doc["records"] == 300 and doc["size"] == 64
    # a baseline floor below --records leaves the writer at --records
    assert doc["writer_records"] == 300
    assert doc["writer_records_per_s"] > 0 and len(doc["load_average"]) == 3
    for run in doc["runs"]:
        assert KEYS <= set(run)
        assert run["errors"] == 0 and run["records_per_s"] > 0
        assert 0 < run["p50_ms"] <= run["p99_ms"] <= run["p999_ms"]
        assert set(run["cpu_us_per_record"]) == {"producers", "log_servers", "bookies"}
        # CPU times tick in 10 ms steps: a role of a 300-record run may show 0
        assert all(isinstance(v, (int, float)) and v >= 0
                   for v in run["cpu_us_per_record"].values())
        assert run["peer"]["records_per_s"] == 1000 and run["peer"]["p99_ms"] == 2.5
        assert run["vs_peer"] == round(run["records_per_s"] / 1000, 2)
        assert 1 <= run["records_per_entry"] <= 300  # from the log servers' counters
    # the peer ran with the producers' client count, pipeline 1 for sync
    assert [(r["peer"]["clients"], r["peer"]["pipeline"]) for r in doc["runs"]] == \
        [(2, 1), (2, 1000)]
    assert doc["records_per_s"] == doc["runs"][0]["records_per_s"]
    assert list(tmp_path.iterdir()) == [peer]  # the temporary appliance is gone


def test_async_at_an_offered_rate_without_the_peer(tmp_path):
    doc = _bench("--producers", "3", "--async", "--window", "16", "--rate", "600",
                 "--records", "300", "--baseline-records", "300", "--no-peer",
                 "--dir", str(tmp_path))
    (run,) = doc["runs"]
    assert run["mode"] == "async" and run["errors"] == 0 and "peer" not in run
    # 300 records offered at 600/s: the last one is not due before 0.49 s
    assert run["wall_s"] >= 0.49 and doc["rate"] == 600 and doc["window"] == 16


def test_sync_and_async_need_producers():
    result = CliRunner().invoke(cli, ["bench", "log", "--sync"])
    assert result.exit_code == 2 and "--producers" in result.output


def test_many_logs_against_one_log_through_one_log_server(tmp_path):
    doc = _bench("--producers", "2", "--async", "--logs", "5", "--window", "8",
                 "--records", "300", "--baseline-records", "1000", "--no-peer",
                 "--dir", str(tmp_path))
    (run,) = doc["runs"]
    assert doc["logs"] == 5 and run["logs"] == 5 and run["errors"] == 0
    one = run["one_log"]  # the same mode with one log, first, on the same appliance
    assert one["logs"] == 1 and one["errors"] == 0 and one["records_per_s"] > 0
    # the baselines run the floor's records, the measured run --records
    assert doc["writer_records"] == one["records"] == 1000 and doc["records"] == 300
    assert run["vs_one_log"] == round(run["records_per_s"] / one["records_per_s"], 2)
    assert len(run["load_average"]) == len(one["load_average"]) == 3
    assert list(tmp_path.iterdir()) == []  # the temporary appliance is gone


def test_logs_needs_producers():
    result = CliRunner().invoke(cli, ["bench", "log", "--logs", "3"])
    assert result.exit_code != 0 and "go with --producers" in result.output
    result = CliRunner().invoke(cli, ["bench", "log", "--baseline-records", "1000"])
    assert result.exit_code == 2 and "--baseline-records go with --producers" in result.output
