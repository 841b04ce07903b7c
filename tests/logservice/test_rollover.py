"""A segment rolls over off the writer's caller: while a log's rollover
waits for a stalled bookie (its ledger close waits for the heal, up to
heal_close_wait_ms), a log server goes on writing its other logs and an
exclusive writer's write_async returns at once; the held write lands in
the next segment once the bookie answers again (flush waits for it).
Every record is read back once, at the DLSN its write returned."""

from __future__ import annotations

import os
import signal

import appliance
from tests.logservice.support import LogServers, read_all
from tests.support.launch import wait_for, wait_registered

SEGMENT_RECORDS = 20
OTHER_WRITE_TIMEOUT_S = 30.0  # far below the heal wait: a blocked loop fails the test
STALL = {"client": {"add_timeout_ms": 1_000, "heal_close_wait_ms": 600_000},
         # the stalled bookie stays registered: the close waits for its heal
         "metadata": {"session_timeout_ms": 120_000}}


def _records_taken(servers, server_id: str) -> float:
    return servers.metrics(server_id)["bookkeeper_logserver_records_total"]


def test_a_rollover_held_by_a_stalled_bookie_does_not_hold_the_servers_other_logs(make_cluster):
    cluster = make_cluster(3, quorums=(3, 3, 2), autorecovery={"enabled": False}, **STALL,
                           log={"segment_records_max": SEGMENT_RECORDS,
                                "metrics_address": "127.0.0.1:0"})
    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 3)
        servers = LogServers(cluster, bk)
        victim = None
        try:
            servers.start("logserver-1")
            with bk.log("rolls").producer() as rolls, bk.log("other").producer() as other:
                first = [rolls.write(b"r%d" % i) for i in range(SEGMENT_RECORDS - 5)]
                before = [other.write(b"o%d" % i) for i in range(5)]
                victim = "bookie-3"
                os.kill(cluster.procs[victim].pid, signal.SIGSTOP)
                # the segment's last records miss the stalled bookie: its close waits
                first += [rolls.write(b"r%d" % i) for i in range(SEGMENT_RECORDS - 5,
                                                                   SEGMENT_RECORDS)]
                assert {d.seq for d in first} == {1}
                held = rolls.write_async(b"r-held")  # the segment is full: it rolls over
                # taken by the server: its rollover starts in the same turn of its loop
                wait_for(lambda: _records_taken(servers, "logserver-1") == SEGMENT_RECORDS + 6,
                         30, what="the server to take the record that rolls the segment")
                # the roll waits for the stalled bookie; the server's other log does not
                during = [other.write_async(b"o%d" % i) for i in range(5, 10)]
                after = [f.result(timeout=OTHER_WRITE_TIMEOUT_S) for f in during]
                assert not held.done()  # still waiting for the bookie (heal wait 10 min)
                os.kill(cluster.procs[victim].pid, signal.SIGCONT)
                victim = None
                landed = held.result(timeout=120)
                assert landed.seq == 2
            records = read_all(bk, "rolls", SEGMENT_RECORDS + 1)
            assert [r.payload for r in records] == [b"r%d" % i for i in range(SEGMENT_RECORDS)] \
                + [b"r-held"]
            assert [r.dlsn for r in records] == first + [landed]
            others = read_all(bk, "other", 10)
            assert [r.payload for r in others] == [b"o%d" % i for i in range(10)]
            assert [r.dlsn for r in others] == before + after
        finally:
            if victim is not None:
                os.kill(cluster.procs[victim].pid, signal.SIGCONT)
            servers.kill_all()


def test_an_exclusive_writers_write_async_does_not_wait_for_a_rollover(make_cluster):
    cluster = make_cluster(3, quorums=(3, 3, 2), autorecovery={"enabled": False}, **STALL,
                           log={"segment_records_max": SEGMENT_RECORDS})
    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 3)
        victim = cluster.procs["bookie-3"].pid
        stopped = False
        try:
            with bk.log("solo").writer() as w:
                first = [w.write(b"r%d" % i) for i in range(SEGMENT_RECORDS - 5)]
                os.kill(victim, signal.SIGSTOP)
                stopped = True
                first += [w.write(b"r%d" % i) for i in range(SEGMENT_RECORDS - 5,
                                                                SEGMENT_RECORDS)]
                held = [w.write_async(b"h%d" % i) for i in range(2)]  # returns: no wait
                # the last without linger: the buffer leaves, so the roll starts (it
                # waits for the stalled bookie) and this call returns all the same
                held.append(w.write_async(b"h2", linger=False))
                assert not any(f.done() for f in held)
                os.kill(victim, signal.SIGCONT)
                stopped = False
                w.flush()  # waits for the roll, then for the held records
                landed = [f.result(timeout=0) for f in held]
            assert {d.seq for d in first} == {1} and {d.seq for d in landed} == {2}
            with bk.log("solo").reader() as r:
                records = []
                while len(records) < SEGMENT_RECORDS + 3:
                    got = r.read(max_records=100, timeout_s=30)
                    assert got, f"stalled after {len(records)} records"
                    records += got
            assert [r.dlsn for r in records] == first + landed
            assert [r.payload for r in records] == [b"r%d" % i for i in range(SEGMENT_RECORDS)] \
                + [b"h%d" % i for i in range(3)]
        finally:
            if stopped:
                os.kill(victim, signal.SIGCONT)
