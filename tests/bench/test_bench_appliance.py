"""``bkctl bench write|read``: what a user sees from tiny runs (the keys, the
cleanup, the plot, the open-loop pacing, a running appliance, bad options).
Speed itself is measured by the bench, never asserted here."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from click.testing import CliRunner

from appliance.config import ClientConfig
from cli.main import cli
from tests.support.bkctl import bkctl

CONTRACT_KEYS = {"mb_per_s", "p50_ms", "p95_ms", "p99_ms", "p999_ms",
                 "client_cpu_s_per_1000_entries", "bookie_cpu_s_per_1000_entries",
                 "bookie_peak_rss_mb"}


def _bench(*args: str) -> dict:
    result = CliRunner().invoke(cli, ["bench", *args, "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def _check_figures(doc: dict, rate_key: str, entries: int, size: int) -> None:
    assert CONTRACT_KEYS | {rate_key} <= set(doc)
    assert doc["entries"] == entries and doc["size"] == size
    assert doc[rate_key] > 0
    assert doc["mb_per_s"] == pytest.approx(doc[rate_key] * size / 1e6, rel=1e-6)
    assert 0 < doc["p50_ms"] <= doc["p95_ms"] <= doc["p99_ms"] <= doc["p999_ms"]
    assert doc["client_cpu_s_per_1000_entries"] > 0
    assert doc["bookie_cpu_s_per_1000_entries"] > 0
    assert 1 < doc["bookie_peak_rss_mb"] < 10_000


def test_write_on_a_temporary_appliance_reports_every_figure_and_cleans_up(tmp_path):
    doc = _bench("write", "--entries", "3000", "--size", "512", "--baseline-s", "0.05",
                 "--dir", str(tmp_path))
    _check_figures(doc, "adds_per_s", 3000, 512)
    assert (doc["ensemble"], doc["write_quorum"], doc["ack_quorum"]) == (3, 3, 2)
    assert doc["journal"] is True and doc["loop"] == "closed"
    assert doc["bookies_measured"] == 4
    assert doc["disk_fdatasync_per_s"] > 0
    assert os.listdir(tmp_path) == []  # the appliance and its data are gone


def test_read_checks_what_it_reads_and_plots(tmp_path):
    png = tmp_path / "read.png"
    work = tmp_path / "work"
    work.mkdir()
    # 20,000 entries: enough that the bookies' read CPU spans several 10 ms clock ticks
    doc = _bench("read", "--entries", "20000", "--read-batch", "5000", "-e", "2", "-w", "2",
                 "-a", "2", "--baseline-s", "0", "--dir", str(work), "--plot", str(png))
    _check_figures(doc, "reads_per_s", 20000, 1024)
    assert doc["latency_samples"] == 4  # one per read() call of 5,000 entries
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and doc["plot"] == str(png)
    assert doc["disk_fdatasync_per_s"] is None
    assert os.listdir(work) == []


def test_write_with_add_many_batches(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    doc = _bench("write", "--add-batch", "256", "--entries", "5000", "--sample-every", "7",
                 "--baseline-s", "0", "--dir", str(work))
    _check_figures(doc, "adds_per_s", 5000, 1024)
    assert doc["add_batch"] == 256 and doc["latency_samples"] == len(range(0, 5000, 7))
    assert os.listdir(work) == []


def test_write_over_many_ledgers_with_per_ledger_entry_logs(tmp_path):
    """BP-32 comparison runs: adds round robin over --ledgers handles, on
    bookies in per-ledger entry-log mode."""
    work = tmp_path / "work"
    work.mkdir()
    doc = _bench("write", "--ledgers", "8", "--entry-log-per-ledger", "--entries", "3000",
                 "--baseline-s", "0", "--dir", str(work))
    _check_figures(doc, "adds_per_s", 3000, 1024)
    assert doc["ledgers"] == 8 and doc["entry_log_per_ledger"] is True
    assert os.listdir(work) == []


def test_read_with_the_bulk_chunks_api(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    doc = _bench("read", "--chunks", "--entries", "20000", "-e", "2", "-w", "2", "-a", "2",
                 "--baseline-s", "0", "--dir", str(work))
    _check_figures(doc, "reads_per_s", 20000, 1024)
    assert doc["read_chunks"] is True and doc["latency_unit"] == "read_chunks() chunk"
    batch = ClientConfig().read_batch_entries_max  # a chunk holds at most this many entries
    assert doc["latency_samples"] >= 20000 // batch  # one per chunk
    assert os.listdir(work) == []


def test_open_loop_paces_adds_at_the_rate(tmp_path):
    doc = _bench("write", "--entries", "1500", "--rate", "1000", "--inflight", "100",
                 "--no-journal", "--baseline-s", "0", "--dir", str(tmp_path))
    assert doc["loop"] == "open" and doc["journal"] is False and doc["entries"] == 1500
    # 1,500 adds scheduled at 1,000/s cannot finish before the last one is due
    assert doc["wall_s"] >= 1.499 and doc["adds_per_s"] <= 1000 * 1.001


def test_against_a_running_appliance_with_two_clients(make_cluster):
    import appliance

    cluster = make_cluster(3)
    config = str(cluster.config_path)
    # enough entries that the bookies' CPU time spans several 10 ms clock
    # ticks (2,000 small adds measured 0.0 s once in CI)
    doc = _bench("write", "--config", config, "--entries", "10000", "--clients", "2",
                 "--size", "100")
    _check_figures(doc, "adds_per_s", 20000, 100)
    assert doc["clients"] == 2 and doc["disk_fdatasync_per_s"] is None
    with appliance.connect(config) as bk:
        assert bk.list_ledgers() == []  # the bench deleted its ledgers


@pytest.mark.parametrize(("args", "message"), [
    (["write", "-e", "3", "-w", "2", "-a", "3"], "ack_quorum"),
    (["read", "--plot", "out.txt"], ".png"),
    (["write", "-e", "5"], "5 live bookies"),
    (["write", "--add-batch", "4", "--rate", "100"], "add_batch"),
])
def test_bad_options_are_one_line_errors(tmp_path, args, message):
    result = CliRunner().invoke(cli, ["bench", *args, "--entries", "10", "--baseline-s", "0",
                                      "--dir", str(tmp_path)])
    assert result.exit_code != 0
    assert message in result.output and "Traceback" not in result.output
    assert os.listdir(tmp_path) == []


def test_journal_flag_is_refused_with_a_running_appliance(make_cluster):
    cluster = make_cluster(3)
    result = CliRunner().invoke(cli, ["bench", "write", "--config", str(cluster.config_path),
                                      "--no-journal"])
    assert result.exit_code == 2 and "journal_write_data" in result.output


def test_text_output_from_a_real_subprocess(tmp_path):
    proc = bkctl("bench", "write", "--entries", "1000", "--baseline-s", "0", "--dir",
                 str(tmp_path), text=True)
    assert proc.returncode == 0, proc.stderr
    assert "adds/s" in proc.stdout and "per 1,000 entries" in proc.stdout


def test_a_run_that_would_fill_the_disk_is_refused_before_it_starts(tmp_path):
    free_gb = shutil.disk_usage(tmp_path).free / 1e9
    entries = int(free_gb * 1e9 / (65536 * 6)) + 1000  # more than the disk holds, six copies
    result = CliRunner().invoke(cli, ["bench", "write", "--size", "65536", "--entries",
                                      str(entries), "--baseline-s", "0", "--dir", str(tmp_path)])
    assert result.exit_code != 0
    assert "GB are free" in result.output and "Traceback" not in result.output
    assert os.listdir(tmp_path) == []  # nothing was started or written
