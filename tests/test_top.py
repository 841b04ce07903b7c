"""bkctl top: figures computed from two scrapes (rates, the bucket holding
the 99th percentile), and a real run against bookies with metrics."""

from __future__ import annotations

import json
import threading

import appliance
from cli.top import quantile_bound, rows
from tests.support.bkctl import bkctl
from tests.support.launch import wait_registered

H = "bookkeeper_bookie_add_latency_seconds"


def _hist(counts: dict[str, float]) -> dict[str, float]:
    return {f"{H}_bucket{{le={le}}}": v for le, v in counts.items()}


def test_the_quantile_is_the_bucket_of_the_interval_s_observations():
    before = _hist({"0.001": 100, "0.005": 100, "0.01": 100, "+Inf": 100})
    after = _hist({"0.001": 150, "0.005": 197, "0.01": 199, "+Inf": 200})  # 100 new
    assert quantile_bound(before, after, H, 0.5) == 0.001   # 50 of 100 by 1 ms
    assert quantile_bound(before, after, H, 0.9) == 0.005   # 97 by 5 ms
    assert quantile_bound(before, after, H, 0.99) == 0.01   # 99 by 10 ms
    assert quantile_bound(after, after, H, 0.99) is None    # nothing new


def test_rates_are_per_second_between_scrapes_and_errors_apart():
    before = {"bookkeeper_bookie_add_entries_total{code=OK}": 1000,
              "bookkeeper_bookie_add_entries_total{code=LedgerFencedError}": 5}
    after = {"bookkeeper_bookie_add_entries_total{code=OK}": 3000,
             "bookkeeper_bookie_add_entries_total{code=LedgerFencedError}": 9,
             "bookkeeper_bookie_read_entries_total{code=OK}": 500,
             "bookkeeper_disk_used_ratio{dir=/a}": 0.25, "bookkeeper_disk_used_ratio{dir=/b}": 0.5}
    f = rows(before, after, 2.0)
    assert f["adds_per_s"] == 1000 and f["add_errors_per_s"] == 2 and f["reads_per_s"] == 250
    assert f["disk_used"] == 0.5 and f["add_p99_ms"] is None


def test_top_shows_the_adds_of_a_real_writer(make_cluster):
    cluster = make_cluster(3, quorums=(3, 3, 2), every_bookie={"metrics_address": "127.0.0.1:0"})
    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 3)
        lh = bk.create_ledger(3, 3, 2)
        stop = threading.Event()

        def writer():
            while not stop.is_set():
                lh.add(b"t" * 100)

        t = threading.Thread(target=writer)
        t.start()
        try:
            out = bkctl("top", "--iterations", "2", "--interval", "0.5", "--json",
                        config=cluster.config_path, text=True)
            shown = bkctl("top", "--iterations", "1", "--interval", "0.5",
                          config=cluster.config_path, text=True)
        finally:
            stop.set()
            t.join(30)
    assert out.returncode == 0, out.stderr
    assert shown.returncode == 0, shown.stderr
    header, *lines = shown.stdout.split("log server")[0].splitlines()
    assert header.split()[:3] == ["bookie", "adds/s", "err/s"] and len(lines) == 3
    assert all(line.split()[0].startswith("bookie-") and " ms " in line for line in lines)
    docs = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(docs) == 2 and set(docs[-1]["bookies"]) == {"bookie-1", "bookie-2", "bookie-3"}
    for figures in docs[-1]["bookies"].values():
        assert figures["adds_per_s"] > 0 and figures["add_p99_ms"] > 0


def test_top_without_metrics_says_how_to_turn_them_on(make_cluster):
    cluster = make_cluster(3)
    out = bkctl("top", "--iterations", "1", config=cluster.config_path, text=True)
    assert out.returncode != 0 and "metrics_address" in out.stderr
