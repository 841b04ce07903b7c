"""Prometheus metrics of real bookies: scraped with prometheus_client's own
text parser, the add counter grows by exactly the adds made and the add
latency histogram counts each of them; the metrics URL is where bkctl
status says; a bookie without metrics_address serves none."""

from __future__ import annotations

import json
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

import appliance
from appliance.errors import UnauthorizedError
from ipc.client import Transport
from ipc.requests import ReadRequest
from tests.support.bkctl import bkctl
from tests.support.launch import wait_for, wait_registered

PW = b"pw"
ADDS = 250


def _scrape(url: str) -> dict[str, dict]:
    """{family name: {sample name + labels: value}}."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.status == 200
        text = resp.read().decode()
    out: dict[str, dict] = {}
    for fam in text_string_to_metric_families(text):
        samples = out.setdefault(fam.name, {})
        for s in fam.samples:
            key = s.name + "".join(f",{k}={v}" for k, v in sorted(s.labels.items()))
            samples[key] = s.value
    return out


def _adds_ok(m: dict) -> float:
    return m.get("bookkeeper_bookie_add_entries", {}).get(
        "bookkeeper_bookie_add_entries_total,code=OK", 0.0)


def _scrape_once_grown(url: str, adds_ok: float) -> dict | None:
    """The bookie's metrics once its OK adds reached ``adds_ok``, else None."""
    m = _scrape(url)
    return m if _adds_ok(m) >= adds_ok else None


def _add_latency_count(m: dict) -> float:
    return m["bookkeeper_bookie_add_latency_seconds"]["bookkeeper_bookie_add_latency_seconds_count"]


def test_a_bookie_s_metrics_count_exactly_the_adds_made(make_cluster):
    cluster = make_cluster(3, quorums=(3, 3, 2), every_bookie={"metrics_address": "127.0.0.1:0"})
    status = bkctl("status", "--json", config=cluster.config_path, text=True)
    assert status.returncode == 0, status.stderr
    urls = {b["id"]: b["metrics_url"] for b in json.loads(status.stdout)["bookies"]}
    assert all(u and u.startswith("http://127.0.0.1:") and u.endswith("/metrics")
               for u in urls.values()), urls
    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 3)
        assert {b: bk.registry.get(b)["info"].get("metrics_url") for b in urls} == urls
        before = {b: _scrape(u) for b, u in urls.items()}
        lh = bk.create_ledger(3, 3, 2, password=PW)
        for f in [lh.add_async(b"m%d" % i) for i in range(ADDS)]:
            f.result(timeout=60)
        lh.close()
        rh = bk.open_ledger(lh.id, password=PW)
        assert len(rh.read(0, ADDS - 1)) == ADDS
    for b, url in urls.items():
        # every bookie of E3/W3 stores every entry, but the third copy may
        # lag the two acks (and the read above, which two bookies can serve)
        # by as long as that bookie is descheduled on a busy machine: wait
        # for its count to stop short of ADDS, then require it exactly
        m = wait_for(lambda url=url, b=b: _scrape_once_grown(url, _adds_ok(before[b]) + ADDS),
                     60, what=f"{b} to count its {ADDS} adds")
        grown = _adds_ok(m) - _adds_ok(before[b])
        assert grown == ADDS, (b, grown)
        assert _add_latency_count(m) - _add_latency_count(before[b]) == ADDS
        hist = m["bookkeeper_bookie_add_latency_seconds"]
        inf = hist["bookkeeper_bookie_add_latency_seconds_bucket,le=+Inf"]
        assert inf == _add_latency_count(m) and hist[
            "bookkeeper_bookie_add_latency_seconds_sum"] > 0
        # the rest is there and plausible
        assert m["bookkeeper_journal_syncs"]["bookkeeper_journal_syncs_total"] >= 1
        assert m["bookkeeper_journal_sync_latency_seconds"][
            "bookkeeper_journal_sync_latency_seconds_count"] >= 1
        assert m["bookkeeper_bookie_limbo_ledgers"]["bookkeeper_bookie_limbo_ledgers"] == 0
        assert m["bookkeeper_process_resident_memory_bytes"][
            "bookkeeper_process_resident_memory_bytes"] > 10e6
        assert m["bookkeeper_bookie_ledgers"]["bookkeeper_bookie_ledgers"] >= 1
        assert m["bookkeeper_entrylog_files"]["bookkeeper_entrylog_files"] >= 1
        assert any(k.startswith("bookkeeper_disk_used_ratio,dir=")
                   for k in m["bookkeeper_disk_used_ratio"])


def test_reads_and_refused_adds_are_counted_by_code(make_cluster):
    cluster = make_cluster(3, quorums=(3, 3, 3), every_bookie={"metrics_address": "127.0.0.1:0"})
    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 3)
        urls = {b: bk.registry.get(b)["info"]["metrics_url"] for b in ("bookie-1", "bookie-2",
                                                                 "bookie-3")}
        lh = bk.create_ledger(3, 3, 3, password=PW)
        for f in [lh.add_async(b"r%d" % i) for i in range(40)]:
            f.result(timeout=60)
        rh = bk.open_ledger(lh.id, password=PW)  # recovery: fences, closes
        assert len(rh.read(0, 39)) == 40
        fenced_before = {b: _scrape(u) for b, u in urls.items()}
        try:
            lh.add(b"too late")  # the writer is fenced everywhere
        except appliance.errors.BKError:
            pass
        with Transport() as transport:  # a read without the ledger's key: refused
            transport.add_bookie("b", bk.registry.get("bookie-1")["endpoint"])
            transport.send("b", ReadRequest(lh.id, 0), 10_000)
            (event,) = wait_for(lambda: transport.next_events(100), 15, what="read reply")
            assert event.status == UnauthorizedError.code
    refused = {b: _scrape(u)["bookkeeper_bookie_reads_refused"][
        "bookkeeper_bookie_reads_refused_total"] for b, u in urls.items()}
    assert refused == {"bookie-1": 1, "bookie-2": 0, "bookie-3": 0}  # the client sent keys
    assert _scrape(urls["bookie-1"])["bookkeeper_bookie_read_entries"][
        "bookkeeper_bookie_read_entries_total,code=UnauthorizedError"] == 1
    total_reads = total_fenced = 0
    for b, url in urls.items():
        m = _scrape(url)
        reads = m.get("bookkeeper_bookie_read_entries", {})
        total_reads += reads.get("bookkeeper_bookie_read_entries_total,code=OK", 0)
        adds = m.get("bookkeeper_bookie_add_entries", {})
        was = fenced_before[b].get("bookkeeper_bookie_add_entries", {})
        key = "bookkeeper_bookie_add_entries_total,code=LedgerFencedError"
        total_fenced += adds.get(key, 0) - was.get(key, 0)
    assert total_reads >= 40  # the reads (and recovery's) were served and counted
    assert total_fenced >= 1  # the fenced writer's add was refused and counted as such


def test_no_metrics_address_no_metrics(make_cluster):
    cluster = make_cluster(3)
    status = bkctl("status", "--json", config=cluster.config_path, text=True)
    assert [b["metrics_url"] for b in json.loads(status.stdout)["bookies"]] == [None] * 3


def test_the_grafana_dashboard_uses_only_metrics_the_bookies_serve(make_cluster):
    """Every bookkeeper_* name in configs/grafana-dashboard.json is one a real
    bookie exposes (histograms through their _bucket series)."""
    import re
    from pathlib import Path

    dashboard = json.loads((Path(__file__).resolve().parents[2] / "configs" /
                            "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {n for e in exprs for n in re.findall(r"bookkeeper_[a-z_]+", e)}
    cluster = make_cluster(3, quorums=(3, 3, 2), every_bookie={"metrics_address": "127.0.0.1:0"})
    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 3)
        lh = bk.create_ledger(3, 3, 2, password=PW)
        lh.add(b"x")
        bk.open_ledger(lh.id, password=PW).read(0, 0)
        url = bk.registry.get("bookie-1")["info"]["metrics_url"]
    with urllib.request.urlopen(url, timeout=10) as resp:
        served = {s.name for fam in text_string_to_metric_families(resp.read().decode())
                  for s in fam.samples}
    assert used and used <= served, used - served


def _client_samples(registry) -> dict[str, float]:
    from prometheus_client import generate_latest

    out = {}
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in fam.samples:
            key = s.name + "".join(f",{k}={v}" for k, v in sorted(s.labels.items()))
            out[key] = s.value
    return out


def test_the_client_s_metrics_when_asked_for(make_cluster):
    from prometheus_client import REGISTRY, CollectorRegistry

    cluster = make_cluster(4, quorums=(3, 3, 2))
    registry = CollectorRegistry()
    with appliance.connect(str(cluster.config_path), metrics=registry) as bk:
        wait_registered(bk, 4)
        lh = bk.create_ledger(3, 3, 2, password=PW)
        lh.add(b"one")
        for f in [lh.add_async(b"a%d" % i) for i in range(49)]:
            f.result(timeout=60)
        for f in lh.add_many_async([b"m%d" % i for i in range(50)]):
            f.result(timeout=60)
        m = _client_samples(registry)
        assert m["bookkeeper_client_adds_total,result=ok"] == 100
        assert m["bookkeeper_client_add_latency_seconds_count"] == 100
        assert m["bookkeeper_client_add_latency_seconds_sum"] > 0
        assert m["bookkeeper_client_inflight_adds"] == 0
        assert m["bookkeeper_client_open_write_handles"] == 1
        # a bookie of the ensemble dies: the writer replaces it (an ensemble change)
        cluster.kill(bk.ledger_metadata(lh.id).ensembles[0][1][0])
        for f in [lh.add_async(b"after %d" % i) for i in range(20)]:
            f.result(timeout=60)
        assert _client_samples(registry)["bookkeeper_client_ensemble_changes_total"] >= 1
        lh.close()
        m = _client_samples(registry)
        assert m["bookkeeper_client_open_write_handles"] == 0
        assert m["bookkeeper_client_ensemble_changes_total"] >= 1  # kept after the close
        writer = bk.create_ledger(3, 3, 2, password=PW)
        writer.add(b"x")  # left OPEN: the open below fences and recovers it
        bk.open_ledger(writer.id, password=PW)
        assert _client_samples(registry)["bookkeeper_client_recoveries_total"] == 1
    # unregistered with the client; and off by default: nothing in the default registry
    assert list(registry.collect()) == []
    with appliance.connect(str(cluster.config_path)) as bk:
        assert bk.metrics is None
    assert not any(fam.name.startswith("bookkeeper_client") for fam in REGISTRY.collect())


def _gauge(m: dict, name: str) -> float:
    return m[name][name]


def _every_bookie_sees(urls, count: int) -> list[dict] | None:
    """Every bookie's metrics, once each shows ``count`` under-replicated ledgers."""
    ms = [_scrape(u) for u in urls]
    ok = all(_gauge(m, "bookkeeper_autorecovery_underreplicated_ledgers") == count for m in ms)
    return ms if ok else None


def test_under_replicated_ledgers_are_served_by_every_bookie(make_cluster):
    """A mark made 700 s ago shows on every bookie's /metrics (the marks live in
    the metadata store, autorecovery disabled or not): one ledger, the oldest
    mark at least 700 s old; one bookie is the auditor; unmarked, both go to 0."""
    from appliance.autorecovery.marks import Marks

    cluster = make_cluster(3, quorums=(3, 3, 2), every_bookie={"metrics_address": "127.0.0.1:0"})
    # disabled: no worker heals (and so removes) the mark below
    assert bkctl("autorecovery", "disable", config=cluster.config_path).returncode == 0
    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 3)
        urls = [bk.registry.get(b)["info"]["metrics_url"] for b in ("bookie-1", "bookie-2",
                                                                   "bookie-3")]
        marks = Marks(bk.ledgers.store)
        assert marks.mark(12345, ["bookie-9"], "test", int(time.time() * 1000) - 700_000)
        ms = wait_for(lambda: _every_bookie_sees(urls, 1), 30, what="the mark on every bookie")
        for m in ms:
            assert 700 <= _gauge(m, "bookkeeper_autorecovery_underreplicated_oldest_seconds") < 800
        wait_for(lambda: sum(_gauge(_scrape(u), "bookkeeper_autorecovery_auditor")
                             for u in urls) == 1, 30, what="one auditor")
        marks.unmark(12345)
        ms = wait_for(lambda: _every_bookie_sees(urls, 0), 30, what="no mark on any bookie")
        assert all(_gauge(m, "bookkeeper_autorecovery_underreplicated_oldest_seconds") == 0
                   for m in ms)


def _served_names(text: str) -> set[str]:
    """Family and sample names of an exposition (a histogram's own name too)."""
    fams = list(text_string_to_metric_families(text))
    return {f.name for f in fams} | {s.name for f in fams for s in f.samples}


def test_the_alert_rules_use_only_metrics_the_appliance_serves(make_cluster):
    """Every bookkeeper_* name in configs/prometheus/alerts.yml (expressions
    and advice) is one a real bookie or the client binding serves."""
    import re
    from pathlib import Path

    from prometheus_client import CollectorRegistry, generate_latest

    rules = (Path(__file__).resolve().parents[2] / "configs" / "prometheus" /
             "alerts.yml").read_text()
    used = set(re.findall(r"bookkeeper_[a-z_]+", rules))
    cluster = make_cluster(3, quorums=(3, 3, 2), every_bookie={"metrics_address": "127.0.0.1:0"})
    registry = CollectorRegistry()
    with appliance.connect(str(cluster.config_path), metrics=registry) as bk:
        wait_registered(bk, 3)
        bk.create_ledger(3, 3, 2, password=PW).add(b"x")
        client = _served_names(generate_latest(registry).decode())
        url = bk.registry.get("bookie-1")["info"]["metrics_url"]

    def bookie_names() -> set[str] | None:  # autorecovery starts after the endpoint
        with urllib.request.urlopen(url, timeout=10) as resp:
            names = _served_names(resp.read().decode())
        return names if "bookkeeper_autorecovery_underreplicated_ledgers" in names else None

    served = wait_for(bookie_names, 30, what="autorecovery's metrics") | client
    assert len(used) >= 8 and used <= served, used - served
