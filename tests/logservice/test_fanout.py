"""Tailing readers served by the log's owner (the read cache, seed 003's read
proxy), with real processes: 100 readers cost the bookies about what one
costs, every reader sees every record once in order, also across a
`kill -9` of the owner, and a reader far behind reads from the bookies."""

from __future__ import annotations

import os
import threading
import time

import pytest

import appliance
from appliance.supervisor.probe import bookie_info
from tests.logservice.support import LogServers
from tests.support.launch import wait_for, wait_registered

TAIL_TIMEOUT_S = 180.0  # a bound on a loaded 2-core machine, not a target
BATCH = 50


@pytest.fixture
def service(make_cluster):
    # metadata sessions of 6 s, not the tests' 2 s: at a load average of 200 a
    # log server's 2 s session expired, its lease with it, and the log had no
    # owner until a producer wrote again (readers never take a log)
    cluster = make_cluster(3, quorums=(3, 3, 2), autorecovery={"enabled": False},
                           metadata={"session_timeout_ms": 6000},
                           log={"metrics_address": "127.0.0.1:0", "read_cache_bytes": 65536})
    with appliance.connect(str(cluster.config_path)) as bk, \
            appliance.connect(str(cluster.config_path)) as readers_bk:
        wait_registered(bk, 3)
        servers = LogServers(cluster, bk)
        try:
            servers.start("logserver-1")
            servers.start("logserver-2")
            yield cluster, bk, readers_bk, servers
        finally:
            servers.kill_all()


class Tailers:
    """``n`` reader threads on one connection, from ``start``, each until it
    has ``expect`` records (or the test's deadline)."""

    def __init__(self, bk, name: str, start, n: int, expect: int, via_service: bool = True):
        self.got: list[list] = [[] for _ in range(n)]
        self.errors: list[BaseException] = []
        self.ready = threading.Barrier(n + 1)
        self._threads = [threading.Thread(target=self._tail, args=(bk, name, start, expect, i,
                                                                   via_service), daemon=True)
                         for i in range(n)]
        for t in self._threads:
            t.start()
        self.ready.wait(60)

    def _tail(self, bk, name, start, expect, i, via_service) -> None:
        out = self.got[i]
        deadline = time.monotonic() + TAIL_TIMEOUT_S
        try:
            with bk.log(name).reader(start, via_service=via_service) as r:
                out += r.read(max_records=1000, timeout_s=0)  # opened: tailing from here
                self.ready.wait(60)
                while len(out) < expect and time.monotonic() < deadline:
                    out += r.read(max_records=1000, timeout_s=1)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.errors.append(exc)
            self.ready.abort()

    def join(self) -> None:
        for t in self._threads:
            t.join(TAIL_TIMEOUT_S + 30)


def _bookie_reads(cluster) -> int:
    """Entries read by every bookie so far (their INFO counters)."""
    total = 0
    for b in cluster.config.bookies:
        info = bookie_info(b.endpoint, 5000)
        assert info is not None, f"{b.id} did not answer INFO"
        total += info["counters"]["reads"]
    return total


def _produce(bk, name: str, first: int, n: int, pad: bytes = b"", gates=None) -> list:
    """Records ``r<i><pad>`` for i in first .. first + n - 1; their DLSNs.
    ``gates``: {record index: event}: wait for the event before that record."""
    positions = []
    with bk.log(name).producer() as p:
        for k in range(first, first + n, BATCH):
            if gates and k in gates:
                assert gates[k].wait(120), f"the gate at record {k} was never opened"
            futures = [p.write_async(b"r%d" % i + pad)
                       for i in range(k, min(k + BATCH, first + n))]
            p.flush()
            positions += [f.result(timeout=60) for f in futures]
    return positions


def _tail_run(cluster, bk, readers_bk, name: str, readers: int, records: int,
              via_service: bool = True) -> dict:
    """``readers`` tail ``name`` while a producer writes ``records``; each
    must read every record once in order.  The readers' bookie requests and
    the bookies' entries read, per record."""
    first = _produce(bk, name, 0, 1)[0]
    sent0, reads0 = readers_bk.driver.transport.counters["sent"], _bookie_reads(cluster)
    tailers = Tailers(readers_bk, name, first.next(), readers, records, via_service)
    positions = _produce(bk, name, 1, records)
    tailers.join()
    assert tailers.errors == []
    want = [(pos, b"r%d" % (i + 1)) for i, pos in enumerate(positions)]
    for got in tailers.got:
        assert [(r.dlsn, r.payload) for r in got] == want
    sent = readers_bk.driver.transport.counters["sent"] - sent0
    return {"requests_per_record": sent / records,
            "entries_read_per_record": (_bookie_reads(cluster) - reads0) / records,
            "load": os.getloadavg()[0]}


def test_100_tailing_readers_cost_the_bookies_about_what_one_costs(service):
    cluster, bk, readers_bk, servers = service
    records = 2000
    one = _tail_run(cluster, bk, readers_bk, "tail-one", 1, records, via_service=False)
    hundred = _tail_run(cluster, bk, readers_bk, "tail-hundred", 100, records)
    print(f"one reader from the bookies: {one}; 100 through the owner: {hundred}")
    assert hundred["requests_per_record"] < 2 * one["requests_per_record"], (one, hundred)
    assert hundred["entries_read_per_record"] < 2 * max(one["entries_read_per_record"], 0.05)
    owner = servers.owner("tail-hundred")
    m = servers.metrics(owner)
    assert m["bookkeeper_logserver_read_records_total"] >= 100 * records
    assert m["bookkeeper_logserver_read_hits_total"] >= 1
    assert m["bookkeeper_logserver_read_cache_logs"] >= 1


def test_readers_ride_over_a_kill_9_of_the_owner(service):
    cluster, bk, readers_bk, servers = service
    name = "tail-killed"
    first = _produce(bk, name, 0, 1)[0]
    owner = servers.owner(name)
    records = 1500
    tailers = Tailers(readers_bk, name, first.next(), 20, records)
    positions, errors = [], []
    killed, back = threading.Event(), threading.Event()

    def produce() -> None:  # 751 on wait for the kill, 1101 on for the readers to be back
        try:
            positions.extend(_produce(bk, name, 1, records, gates={751: killed, 1101: back}))
        except Exception as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    writer = threading.Thread(target=produce)
    writer.start()
    wait_for(lambda: min(len(g) for g in tailers.got) >= 300, 120,
             what="every reader past record 300")
    servers.kill(owner)
    killed.set()
    servers.start(owner)  # as the supervisor would
    # the readers read what the killed owner left from the bookies, then go
    # back to the log's owner (whichever server took it) for the tail
    wait_for(lambda: min(len(g) for g in tailers.got) >= 1100 and
             servers.metrics(servers.owner(name))["bookkeeper_logserver_read_hits_total"]
             >= 1, 120, what="the readers at record 1100, asking the new owner")
    new_owner = servers.owner(name)
    back.set()
    writer.join(TAIL_TIMEOUT_S)
    tailers.join()
    assert errors == [] and tailers.errors == []
    assert servers.owner(name) == new_owner
    assert servers.metrics(new_owner)["bookkeeper_logserver_read_records_total"] >= 400
    want = [(pos, b"r%d" % (i + 1)) for i, pos in enumerate(positions)]
    with bk.log(name).reader(first.next(), via_service=False) as r:  # the bookies' truth
        truth = []
        while len(truth) < records:
            got = r.read(max_records=1000, timeout_s=30)
            assert got, f"stalled after {len(truth)} records"
            truth += got
    assert [(r.dlsn, r.payload) for r in truth] == want
    for got in tailers.got:
        assert [(r.dlsn, r.payload) for r in got] == want


def test_a_reader_far_behind_reads_the_bookies_then_the_owner(service):
    cluster, bk, readers_bk, servers = service
    name = "tail-behind"
    pad = b"." * 200
    positions = _produce(bk, name, 0, 1500, pad)  # 300 KB: the cache holds the last 64 KiB
    owner = servers.owner(name)
    with readers_bk.log(name).reader() as r:  # asks the owner: a miss, then the bookies
        got = []
        while len(got) < 1500:
            more = r.read(max_records=500, timeout_s=30)
            assert more, f"stalled after {len(got)}"
            got += more
        late = threading.Thread(target=lambda: positions.extend(_produce(bk, name, 1500, 200, pad)))
        late.start()
        while len(got) < 1700:
            more = r.read(max_records=500, timeout_s=30)
            assert more, f"stalled after {len(got)}"
            got += more
        late.join(60)
    assert [(x.dlsn, x.payload) for x in got] == \
        [(pos, b"r%d" % i + pad) for i, pos in enumerate(positions)]
    m = servers.metrics(owner)
    assert m["bookkeeper_logserver_read_misses_total"] >= 1
    assert m["bookkeeper_logserver_read_records_total"] >= 1


def test_readers_see_an_exclusive_writer_that_takes_the_log(service):
    """The owner learns of the exclusive writer only when it writes again:
    its readers must not wait on it meanwhile."""
    cluster, bk, readers_bk, servers = service
    name = "tail-taken"
    positions = _produce(bk, name, 0, 10)
    tailers = Tailers(readers_bk, name, positions[0].next(), 5, 29)
    wait_for(lambda: min(len(g) for g in tailers.got) >= 9, 60, what="the readers at the end")
    owner = servers.owner(name)
    wait_for(lambda: servers.metrics(owner)["bookkeeper_logserver_read_waiting"] >= 5, 60,
             what="the readers waiting at the owner")
    with bk.log(name).writer() as w:
        positions += [w.write(b"w%d" % i) for i in range(20)]
    tailers.join()
    assert tailers.errors == []
    want = [(pos, b"r%d" % i) for i, pos in enumerate(positions[:10])][1:] + \
        [(pos, b"w%d" % i) for i, pos in enumerate(positions[10:])]
    for got in tailers.got:
        assert [(r.dlsn, r.payload) for r in got] == want
