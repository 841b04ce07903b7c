"""One log whose bookies stall holds no other log of its server.

Six bookies, E3/W3/A2, one log server whose ledger handles take one add at
a time (``[client] inflight_adds_max = 1``, ``[log]
service_entries_inflight = 1``; add timeout 10 minutes: the stall lasts).
Two of log A's three bookies are stopped (SIGSTOP: sockets open, nothing
answered), so A's entry in flight gets no ack quorum and its window stays
full; log B's ensemble keeps two running bookies.  Then a record larger
than a group commit's ``flush_bytes`` comes for A: before, the server's
loop sent it as an entry at once and waited in the ledger handle for room,
and B's writes (and everything else the loop serves) stopped with A.  Now
that request is answered "retry" (``busy``) and B's producer writes on,
synchronously, while A is stopped.  After SIGCONT every record of both logs
is stored once, in each producer's order.  SIGCONT is sent in ``finally``."""

from __future__ import annotations

import os
import signal

import appliance
from tests.logservice.support import LogServers, read_all
from tests.support.launch import wait_for, wait_registered

BIG = 64 * 1024


def _ensemble(bk, log_name: str) -> tuple[str, ...]:
    md, _ = bk.logs.read_log(log_name)
    return bk.ledger_metadata(md.segments[-1].ledger_id).ensembles[-1][1]


def _counter(servers, name: str) -> float:
    return servers.metrics("logserver-1")[f"bookkeeper_logserver_{name}_total"]


def test_a_log_whose_bookies_stall_holds_no_other_log(make_cluster):
    cluster = make_cluster(6, quorums=(3, 3, 2), autorecovery={"enabled": False},
                           log={"metrics_address": "127.0.0.1:0", "service_entries_inflight": 1},
                           client={"inflight_adds_max": 1, "add_timeout_ms": 600_000})
    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 6)
        servers = LogServers(cluster, bk)
        stopped: list[int] = []
        producers: list = []
        try:
            servers.start("logserver-1")
            b = bk.log("steady").producer()
            producers.append(b)
            b.write(b"b-first")
            b_bookies = set(_ensemble(bk, "steady"))
            # a log whose ensemble is not B's (1 in 20 ensembles of 6 bookies is)
            for i in range(20):
                name = f"stalling-{i}"
                a_small = bk.log(name).producer()
                producers.append(a_small)
                a_small.write(b"a-first")
                a_bookies = _ensemble(bk, name)
                if set(a_bookies) != b_bookies:
                    break
            else:
                raise AssertionError("20 logs, all on the steady log's bookies")
            a_big = bk.log(name).producer()
            producers.append(a_big)
            a_big.write(b"a-hello")  # known before the stall
            # two of A's bookies, at most one of them B's: B keeps an ack quorum
            victims = sorted(a_bookies, key=lambda bid: bid in b_bookies)[:2]
            assert len(set(victims) & b_bookies) <= 1
            for victim in victims:
                pid = cluster.procs[victim].pid
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)

            sent = _counter(servers, "entries")
            small = a_small.write_async(b"a:small:" + bytes(BIG))
            wait_for(lambda: _counter(servers, "entries") > sent, 60,
                     what="the stalled log's entry sent: its window (1 add) full")
            big = a_big.write_async(b"a:big:" + bytes(3 * BIG))  # above flush_bytes
            wait_for(lambda: _counter(servers, "busy") >= 1, 60,
                     what="the big record answered 'retry' (its log's window is full)")
            # B is written, one record at a time, while A's bookies are stopped
            b_positions = [b.write(b"b:%d" % j) for j in range(50)]
            assert not small.done() and not big.done(), \
                "the stalled log's writes completed: its bookies were not stopped"
        finally:
            for pid in stopped:
                os.kill(pid, signal.SIGCONT)
        try:
            positions = [small.result(timeout=120), big.result(timeout=120)]
            stalled = read_all(bk, name, 4, nothing_more=True)
            assert [r.payload for r in stalled] == \
                [b"a-first", b"a-hello", b"a:small:" + bytes(BIG), b"a:big:" + bytes(3 * BIG)]
            assert [r.dlsn for r in stalled[2:]] == positions
            steady = read_all(bk, "steady", 51, nothing_more=True)
            assert [r.payload for r in steady] == [b"b-first"] + [b"b:%d" % j for j in range(50)]
            assert [r.dlsn for r in steady[1:]] == b_positions
        finally:
            for p in producers:
                p.close()
            servers.kill_all()
