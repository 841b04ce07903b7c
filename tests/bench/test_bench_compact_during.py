"""``bkctl bench write --compact-during``: a tiny run makes garbage, every
bookie compacts during it, and the document says when and what the adds
sent meanwhile saw (the figures are the bench's, not asserted here)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from click.testing import CliRunner

from appliance.bench.compact_during import CompactionDuring, during_figures
from cli.main import cli


def test_write_with_a_major_compaction_during_the_run(tmp_path):
    result = CliRunner().invoke(cli, [
        "bench", "write", "--rate", "1000", "--duration-s", "4", "--compact-during", "20",
        "--compact-after-s", "0.5", "--compaction-rate", "0", "--baseline-s", "0",
        "--dir", str(tmp_path), "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    c = doc["compaction"]
    assert c["error"] is None and c["bookies_done"] == 4
    assert 0.5 <= c["asked_s"] <= c["done_s"]
    assert c["ledgers_forgotten"] >= 8  # 8 deleted ledgers, on three bookies each
    assert c["bytes_copied"] > 0 and c["garbage_written_bytes"] >= 20_000_000
    assert doc["compaction_rate"] == 0
    during, outside = doc["during_compaction"], doc["outside_compaction"]
    assert during["samples"] + outside["samples"] == doc["latency_samples"]
    assert outside["samples"] > 0
    assert os.listdir(tmp_path) == []


def test_text_output_names_the_compaction(tmp_path):
    result = CliRunner().invoke(cli, [
        "bench", "write", "--entries", "2000", "--compact-during", "10",
        "--compact-after-s", "0", "--baseline-s", "0", "--dir", str(tmp_path)],
        catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "compaction  asked at" in result.output and "MB copied" in result.output


def test_compaction_rate_is_refused_with_a_running_appliance(tmp_path):
    config = tmp_path / "a.toml"
    config.write_text("")
    result = CliRunner().invoke(cli, ["bench", "write", "--config", str(config),
                                      "--compaction-rate", "1000"])
    assert result.exit_code == 2 and "--compaction-rate applies" in result.output


def test_adds_are_split_by_their_send_time():
    watch = CompactionDuring.__new__(CompactionDuring)
    watch.asked_at, watch.done_at, watch.error = 12.0, 14.0, None
    watch.runs = {"b1": {"bytes_copied": 5, "throttled_s": 0.5, "ledgers_forgotten": 2}}
    sent = np.array([10.0, 11.0, 12.5, 13.0, 15.0])
    results = [{"start": 10.0, "sent": sent, "done": sent + np.array([.001, .001, .1, .1, .001])}]
    doc = during_figures(results, watch, 100)
    assert doc["compaction"]["asked_s"] == 2.0 and doc["compaction"]["done_s"] == 4.0
    assert doc["during_compaction"]["samples"] == 2
    assert doc["during_compaction"]["p50_ms"] == pytest.approx(100.0)
    assert doc["outside_compaction"]["samples"] == 3
    assert doc["outside_compaction"]["p99_ms"] == pytest.approx(1.0)
    watch.done_at = None  # still running at the end: every add sent after the ask
    assert during_figures(results, watch, 100)["during_compaction"]["samples"] == 3


def test_a_running_appliance_keeps_nothing_of_the_bench(make_cluster):
    import appliance

    cluster = make_cluster(3)
    config = str(cluster.config_path)
    result = CliRunner().invoke(cli, [
        "bench", "write", "--config", config, "--entries", "1000", "--compact-during", "5",
        "--compact-after-s", "0", "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["compaction"]["asked_s"] is not None
    with appliance.connect(config) as bk:
        assert bk.list_ledgers() == []
