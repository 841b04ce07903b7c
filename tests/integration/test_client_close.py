"""Closing a client with work in flight: every add, room wait and read
that can no longer finish fails with ``ClientClosedError`` at once, instead
of leaving its caller waiting forever (an add's future) or for the call
bound (a read).  The bookies are SIGSTOPped, so nothing in flight can
finish by itself."""

from __future__ import annotations

import os
import signal
import threading

import pytest

import appliance
from appliance.errors import ClientClosedError
from tests.support.launch import wait_for, wait_registered

PW = b"secret"


@pytest.fixture
def frozen(make_cluster):
    """(client, ledger with one entry, freeze(), the tailing reader); the
    client is closed by the test, the bookies resumed by the fixture."""
    cluster = make_cluster(3, client={"inflight_adds_max": 5, "explicit_lac_interval_ms": 0})
    stopped: list[int] = []

    def freeze():
        for proc in cluster.procs.values():
            os.kill(proc.pid, signal.SIGSTOP)
            stopped.append(proc.pid)

    bk = appliance.connect(str(cluster.config_path))
    try:
        wait_registered(bk, 3)
        lh = bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, password=PW)
        assert lh.add(b"first") == 0
        reader = bk.open_ledger(lh.id, password=PW, recovery=False)
        yield bk, lh, freeze, reader
    finally:
        bk.close()
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)


def test_adds_in_flight_fail_when_the_client_closes(frozen):
    bk, lh, freeze, _ = frozen
    freeze()
    futures = [lh.add_async(b"x%d" % i) for i in range(5)]  # the handle's whole window
    blocked: list = []

    def add_one_more():  # no room: waits for an ack that cannot come
        try:
            lh.add_async(b"more")
        except Exception as exc:  # noqa: BLE001 - the test checks which
            blocked.append(exc)

    waiter = threading.Thread(target=add_one_more)
    waiter.start()
    wait_for(lambda: lh._room_waiters == 1, 30.0, what="the add waiting for room")
    assert not any(f.done() for f in futures)
    bk.close()
    waiter.join(30)
    assert not waiter.is_alive()
    assert len(blocked) == 1 and isinstance(blocked[0], ClientClosedError)
    for fut in futures:
        with pytest.raises(ClientClosedError, match="may or may not be stored"):
            fut.result(timeout=0)
    with pytest.raises(ClientClosedError):
        lh.add_async(b"after")
    with pytest.raises(ClientClosedError):
        lh.close()  # the ledger stays open, for a recovery to close


def test_a_read_waiting_for_the_lac_fails_when_the_client_closes(frozen):
    bk, _, freeze, reader = frozen
    freeze()
    outcome: list = []

    def tail():
        try:
            outcome.append(reader.wait_for_lac(0, timeout_s=120))
        except Exception as exc:  # noqa: BLE001 - the test checks which
            outcome.append(exc)

    tailer = threading.Thread(target=tail)
    tailer.start()
    wait_for(lambda: reader._waiting, 30.0, what="the LAC wait in flight")
    bk.close()
    tailer.join(30)  # far less than its own 120 s
    assert not tailer.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], ClientClosedError)
    with pytest.raises(ClientClosedError):
        reader.read_lac()


def test_log_records_in_flight_fail_when_the_client_closes(make_cluster):
    """A log writer's records, buffered or in flight, settle at the client's
    close: each with its position or with ``ClientClosedError``."""
    cluster = make_cluster(3)
    bk = appliance.connect(str(cluster.config_path))
    try:
        wait_registered(bk, 3)
        writer = bk.log("closing").writer()
        futures = [writer.write_async(b"r%d" % i) for i in range(2000)]
    finally:
        bk.close()
    wait_for(lambda: all(f.done() for f in futures), 30.0, what="every record settled")
    errors = [f.exception() for f in futures if f.exception() is not None]
    assert all(isinstance(e, ClientClosedError) for e in errors)


def test_a_close_during_another_threads_close_waits_for_it(make_cluster):
    """Two threads close one handle: the second returns once the ledger is
    closed, not while the first close still waits for an add in flight."""
    cluster = make_cluster(3)
    frozen: list[int] = []
    bk = appliance.connect(str(cluster.config_path))
    try:
        wait_registered(bk, 3)
        lh = bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, password=PW)
        for proc in cluster.procs.values():
            os.kill(proc.pid, signal.SIGSTOP)
            frozen.append(proc.pid)
        add = lh.add_async(b"in flight")  # the first close waits for it
        first = threading.Thread(target=lh.close)
        first.start()
        wait_for(lambda: lh._closed, 10, what="the first close started")
        second_returned = threading.Event()
        second = threading.Thread(target=lambda: (lh.close(), second_returned.set()))
        second.start()
        # the bug this pins returned at once; the fixed close cannot return while frozen
        assert not second_returned.wait(0.5)
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
        frozen.clear()
        assert second_returned.wait(60)
        md = bk.ledger_metadata(lh.id)
        assert add.result(timeout=1) == 0
        assert md.state == "CLOSED" and md.last_entry_id == 0
        first.join(timeout=60)
        second.join(timeout=60)
        assert not first.is_alive() and not second.is_alive()
    finally:
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
        bk.close()
