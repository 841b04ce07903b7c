"""Adaptive batching of adds (``[client] add_linger_us``,
``add_batches_inflight``), seen through the wire: adds that arrive while the
ledger's batch awaits its ack quorum are held and travel together in one
message, sent when that batch is acknowledged, or at once when a caller
waits (``add``).  The linger cap is set far above every wait of these tests
(60 s), so only the rule under test can release the held adds in time, and
so is the add timeout (a timed-out add is sent again)."""

from __future__ import annotations

import os
import signal
import threading

import pytest

import appliance
from tests.support.launch import wait_for, wait_registered

PW = b"secret"
HOLD_US = 60_000_000
# no add may time out while bookies are stopped: a timeout resends the add
# to them (two more messages), which these counts of messages do not expect
ADD_TIMEOUT_MS = 300_000


def _sent(bk) -> int:
    return bk.driver.transport.counters["sent"]


@pytest.fixture
def stalled(make_cluster):
    """(client, ledger, messages sent so far, the ensemble's first two bookie
    pids SIGSTOPped: no ack quorum until ``resume``), with one add in flight."""
    cluster = make_cluster(3, client={"add_linger_us": HOLD_US, "add_batches_inflight": 1,
                                      "explicit_lac_interval_ms": 0,
                                      "add_timeout_ms": ADD_TIMEOUT_MS})
    pids: list[int] = []

    def resume():
        while pids:
            os.kill(pids.pop(), signal.SIGCONT)

    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 3)
        lh = bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, password=PW)
        assert lh.add(b"first") == 0
        # and its third bookie's reply (the ack quorum is two): a bookie
        # stopped while it owes a reply would hold the next add for 60 s
        wait_for(lambda: all(bk.driver.transport.inflight(b) == 0 for b in cluster.procs),
                 30.0, what="every reply to the first add")
        base = _sent(bk)
        for bookie_id in lh.metadata.ensembles[0][1][:2]:
            pids.append(cluster.procs[bookie_id].pid)
            os.kill(pids[-1], signal.SIGSTOP)
        try:
            in_flight = lh.add_async(b"a")  # the ledger is idle: it leaves at once
            wait_for(lambda: _sent(bk) == base + 3, 30.0, what="the first add on the wire")
            yield bk, lh, base, in_flight, resume
        finally:
            resume()


def test_adds_held_behind_a_batch_leave_together_on_its_ack(stalled):
    bk, lh, base, in_flight, resume = stalled
    held = [lh.add_async(b"b%d" % i) for i in range(100)]
    resume()
    assert in_flight.result(timeout=30) == 1
    assert [f.result(timeout=30) for f in held] == list(range(2, 102))
    assert _sent(bk) == base + 6  # the 100 went as one message per bookie
    lh.close()
    got = bk.open_ledger(lh.id, password=PW).read(0, 101)
    assert [e.payload for e in got] == [b"first", b"a"] + [b"b%d" % i for i in range(100)]


def test_a_waiting_add_sends_the_held_adds_at_once(stalled):
    bk, lh, base, in_flight, resume = stalled
    held = [lh.add_async(b"b%d" % i) for i in range(100)]
    result: list = []
    waiter = threading.Thread(target=lambda: result.append(lh.add(b"sync")))
    waiter.start()
    try:  # no ack can come: only add()'s rule sends them (a hold would last 60 s)
        wait_for(lambda: _sent(bk) >= base + 6, 30.0, what="the held adds on the wire")
        assert _sent(bk) == base + 6
    finally:
        resume()
        waiter.join(60)
    assert result == [102]
    assert in_flight.result(timeout=30) == 1
    assert [f.result(timeout=30) for f in held] == list(range(2, 102))
    assert _sent(bk) == base + 6
    lh.close()


@pytest.mark.parametrize("limit", [1, 0])
def test_fresh_adds_of_many_ledgers_wait_for_a_bookie_reply_together(make_cluster, limit):
    """``add_messages_inflight``: ten idle ledgers each add one entry (each
    batch leaves its handle at once) while their three bookies still owe the
    reply to another ledger's add.  With the hold (1) the ten wait and then
    travel as one message per bookie; with 0 each goes in a message of its
    own.  The linger is 60 s: only a reply can end the wait in time."""
    cluster = make_cluster(3, client={"add_linger_us": HOLD_US, "add_messages_inflight": limit,
                                      "explicit_lac_interval_ms": 0,
                                      "add_timeout_ms": ADD_TIMEOUT_MS})
    pids = [cluster.procs[b].pid for b in sorted(cluster.procs)]
    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 3)
        first = bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, password=PW)
        others = [bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, password=PW)
                  for _ in range(10)]
        assert first.add(b"first") == 0
        # its third bookie's reply too (the ack quorum is two): no message owed
        wait_for(lambda: all(bk.driver.transport.inflight(b) == 0 for b in cluster.procs),
                 30.0, what="every reply to the first add")
        base = _sent(bk)
        stopped = []
        try:
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
            owed = first.add_async(b"owed")
            wait_for(lambda: _sent(bk) == base + 3, 30.0, what="the owed add on the wire")
            futures = []
            for lh in others:
                futures.append(lh.add_async(b"x%d" % lh.id))
                bk.driver.call(lambda: None).result(30)  # its flush done: a turn of its own
            bk.driver.call(lambda: None).result(30)  # and that turn's end
            expected = base + 3 if limit else base + 3 + 3 * len(others)
            wait_for(lambda: _sent(bk) == expected, 30.0, what="the ten ledgers' messages")
        finally:
            for pid in stopped:
                os.kill(pid, signal.SIGCONT)
        assert owed.result(timeout=30) == 1
        assert [f.result(timeout=30) for f in futures] == [0] * len(others)
        # the third bookie's message leaves on its reply to "owed", which may
        # come after the ack quorum completed the futures
        expected = base + 6 if limit else base + 3 + 3 * len(others)
        wait_for(lambda: all(bk.driver.transport.inflight(b) == 0 for b in cluster.procs),
                 30.0, what="every bookie's replies")
        for _ in range(2):  # a reply's turn ends with its flush: let it end
            bk.driver.call(lambda: None).result(30)
        wait_for(lambda: all(bk.driver.transport.inflight(b) == 0 for b in cluster.procs),
                 30.0, what="the replies to the held messages")
        assert _sent(bk) == expected  # with the hold: the ten as one message per bookie
        for lh in others:
            lh.close()
            assert [e.payload for e in bk.open_ledger(lh.id, password=PW).read(0, 0)] == \
                [b"x%d" % lh.id]
        first.close()
