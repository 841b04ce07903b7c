"""The log service with real processes: bookies, log servers, producers."""

from __future__ import annotations

import threading
import time

import pytest

import appliance
from appliance.protocol.log_service import owner_of
from tests.logservice.support import LogServers, log_service, read_all
from tests.support.launch import wait_for, wait_registered


@pytest.fixture
def service(make_cluster):
    with log_service(make_cluster) as (_, bk, servers):
        yield bk, servers



def test_one_producer_writes_and_reads_back(service):
    bk, servers = service
    with bk.log("orders").producer() as p:
        first = p.write(b"r0")
        futures = [p.write_async(b"r%d" % i) for i in range(1, 200)]
        p.flush()
        positions = [first] + [f.result(timeout=30) for f in futures]
    assert positions == sorted(positions) and len(set(positions)) == 200
    records = read_all(bk, "orders", 200)
    assert [r.payload for r in records] == [b"r%d" % i for i in range(200)]
    assert [r.dlsn for r in records] == positions
    owner = servers.owner("orders")
    assert owner in ("logserver-1", "logserver-2")

    # the owner's metrics: records, group commits, the log, its producer, latency
    values = servers.metrics(owner)
    assert values["bookkeeper_logserver_records_total"] == 200
    assert 1 <= values["bookkeeper_logserver_entries_total"] < 200  # batched
    assert values["bookkeeper_logserver_owned_logs"] == 1
    assert values["bookkeeper_logserver_producers"] == 1
    assert values["bookkeeper_logserver_write_latency_seconds_count"] >= 2
    # the log went idle after its last acknowledged entry: a control entry followed
    wait_for(lambda: servers.metrics(owner).get(
        "bookkeeper_logserver_control_entries_total", 0) >= 1, 30, what="a control entry counted")


def test_an_exclusive_writer_and_producers_take_turns_losing_nothing(service):
    bk, servers = service
    log = bk.log("mixed")
    positions, errors = [], []
    started = threading.Event()

    def produce():
        try:
            with log.producer() as p:
                for i in range(300):
                    positions.append(p.write(b"p:%d" % i))
                    if i == 50:
                        started.set()
        except Exception as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
            started.set()

    thread = threading.Thread(target=produce)
    thread.start()
    try:
        assert started.wait(60)
        with log.writer() as w:  # fences the owner; producers wait for it to close
            mine = [w.write(b"w:%d" % i) for i in range(20)]
    finally:
        thread.join(120)
    assert not thread.is_alive() and errors == []
    records = read_all(bk, "mixed", 320)
    payloads = [r.payload for r in records]
    assert sorted(payloads) == sorted([b"p:%d" % i for i in range(300)] +
                                      [b"w:%d" % i for i in range(20)])
    assert [p for p in payloads if p.startswith(b"p:")] == [b"p:%d" % i for i in range(300)]
    where = {r.payload: r.dlsn for r in records}
    assert [where[b"p:%d" % i] for i in range(300)] == positions
    assert [where[b"w:%d" % i] for i in range(20)] == mine
    assert log.log_server() in ("logserver-1", "logserver-2")  # the service has it back


def test_a_producer_given_its_id_resumes_after_its_last_record(service):
    bk, _servers = service
    pid = "ab" * 16
    with bk.log("resumed").producer(pid) as p:
        first = [p.write(b"a%d" % i) for i in range(5)]
    with bk.log("resumed").producer(pid) as p:  # the same producer, a new process's view
        second = [p.write(b"b%d" % i) for i in range(5)]
    records = read_all(bk, "resumed", 10)
    assert [r.payload for r in records] == [b"a%d" % i for i in range(5)] + \
        [b"b%d" % i for i in range(5)]
    assert [r.dlsn for r in records] == first + second


def test_a_log_moves_to_a_server_that_joins_and_its_producer_follows(service):
    bk, servers = service
    servers.kill("logserver-2")  # ... and its registration expires with its session
    wait_for(lambda: sorted(servers.registry.servers()) == ["logserver-1"], 30,
             what="logserver-2 gone from the registry")
    name = next(f"moving{i}" for i in range(1000)
                if owner_of(f"moving{i}", ["logserver-1", "logserver-2"]) == "logserver-2")
    with bk.log(name).producer() as p:
        positions = [p.write(b"r%d" % i) for i in range(50)]
        assert servers.owner(name) == "logserver-1"
        servers.start("logserver-2")  # the hashing gives it the log: logserver-1 lets go
        futures, moved_at, deadline = [], None, time.monotonic() + 60
        while moved_at is None or len(positions) + len(futures) < moved_at + 100:
            n = len(positions) + len(futures)
            futures += [p.write_async(b"r%d" % i) for i in range(n, n + 50)]
            p.flush()
            lease = servers.registry.owner(name)  # none between the release and the take-over
            if moved_at is None and lease is not None and lease["server"] == "logserver-2":
                moved_at = n + 50
            assert time.monotonic() < deadline, "the log did not move to logserver-2"
        positions += [f.result(timeout=60) for f in futures]
    assert servers.owner(name) == "logserver-2"
    records = read_all(bk, name, len(positions))
    assert [r.payload for r in records] == [b"r%d" % i for i in range(len(positions))]
    assert [r.dlsn for r in records] == positions


@pytest.mark.parametrize("knobs", [
    # only an ack releases what waits (flush timer 60 s, linger 1 s, one entry at a time)
    {"flush_interval_us": 60_000_000, "service_linger_us": 1_000_000,
     "service_entries_inflight": 1},
    # no linger, up to four entries awaiting their ack at once
    {"service_linger_us": 0, "service_entries_inflight": 4},
], ids=["acks-release", "pipelined-entries"])
def test_concurrent_sync_writes_share_entries_and_keep_each_producers_order(make_cluster,
                                                                           knobs):
    """Group commit: 8 producers writing synchronously at once are all
    stored, their records share entries (fewer entries than records), each
    producer's records are in its order, and every DLSN returned is where
    its record is; with records waiting only for acks (before the linger,
    each write waited out the 60 s flush timer, past the producers'
    deadline), and with several entries in flight at once."""
    cluster = make_cluster(3, quorums=(3, 3, 2), autorecovery={"enabled": False},
                           log={"metrics_address": "127.0.0.1:0", **knobs})
    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 3)
        servers = LogServers(cluster, bk)
        try:
            servers.start("logserver-1")
            positions: dict[int, list] = {i: [] for i in range(8)}
            errors = []

            def produce(i: int) -> None:
                try:
                    with bk.log("untimed").producer() as p:
                        positions[i].extend(p.write(b"%d:%d" % (i, j)) for j in range(30))
                except Exception as exc:  # noqa: BLE001 - reported by the test
                    errors.append(exc)

            threads = [threading.Thread(target=produce, args=(i,)) for i in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            assert errors == [] and sum(len(v) for v in positions.values()) == 240
            records = read_all(bk, "untimed", 240)
            at = {r.dlsn: r.payload for r in records}
            for i, dlsns in positions.items():
                assert dlsns == sorted(dlsns)  # this producer's order
                assert [at[d] for d in dlsns] == [b"%d:%d" % (i, j) for j in range(30)]
            values = servers.metrics("logserver-1")
            assert values["bookkeeper_logserver_records_total"] == 240
            assert values["bookkeeper_logserver_entries_total"] < 240  # shared entries
        finally:
            servers.kill_all()


def test_producers_ride_over_a_full_ledger_window_by_retrying(make_cluster):
    """Back-pressure without a wait: the log server's ledger handles take one
    add at a time (``[client] inflight_adds_max = 1``) and a group commit
    is sent as soon as it holds 64 bytes (``[log] flush_bytes``), so
    requests keep coming that would send an entry while their log's one
    add is in flight.  Those are answered "retry" (the server's one loop
    never waits for one log's room) and resent after the producer's
    back-off; every record is stored once, in each producer's order, at the
    DLSN its write returned, on both logs.  (No gather: synchronous
    producers then come back at their own times, not as one cohort per
    entry.)"""
    cluster = make_cluster(3, quorums=(3, 3, 2), autorecovery={"enabled": False},
                           log={"metrics_address": "127.0.0.1:0", "service_gather_us": 0,
                                "flush_bytes": 64},
                           client={"inflight_adds_max": 1})
    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 3)
        servers = LogServers(cluster, bk)
        try:
            servers.start("logserver-1")
            logs, n = ("narrow-a", "narrow-b"), 40
            producers = [bk.log(logs[i % 2]).producer() for i in range(6)]
            positions: list[list] = [[] for _ in producers]
            errors: list = []

            def produce(i: int) -> None:  # synchronous: requests keep meeting entries
                try:
                    positions[i].extend(producers[i].write(b"%d:%d" % (i, j)) for j in range(n))
                except Exception as exc:  # noqa: BLE001 - reported by the test
                    errors.append(exc)

            try:
                threads = [threading.Thread(target=produce, args=(i,)) for i in range(6)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(120)
                retried = sum(p.stats["retries"] for p in producers)
            finally:
                for p in producers:
                    p.close()
            assert errors == [] and [len(v) for v in positions] == [n] * 6
            for name in logs:
                at = {r.dlsn: r.payload for r in read_all(bk, name, 3 * n, nothing_more=True)}
                for i in range(logs.index(name), 6, 2):
                    assert positions[i] == sorted(positions[i])  # this producer's order
                    assert [at[d] for d in positions[i]] == [b"%d:%d" % (i, j)
                                                             for j in range(n)]
            values = servers.metrics("logserver-1")
            assert values["bookkeeper_logserver_records_total"] == 6 * n
            assert values["bookkeeper_logserver_busy_total"] >= 1, values
            assert retried >= values["bookkeeper_logserver_busy_total"], (retried, values)
        finally:
            servers.kill_all()
