"""Client transport: one event per request (reply, timeout, unavailable),
bounded in-flight, reconnect after a bookie restart, callbacks on the I/O
thread, clean close."""

from __future__ import annotations

import threading
import time

import pytest
import zmq

from appliance.errors import (
    OK,
    BadRequestError,
    BKTimeoutError,
    BookieUnavailableError,
    ClientClosedError,
    TooManyRequestsError,
)
from ipc.client import Event, Transport
from ipc.frames import DEFAULT_LIMITS, REPLY_HEAD, Op
from ipc.packed import AddPackedRequest
from ipc.replies import AddBatchReply, AddReply, PingReply, encode_reply
from ipc.requests import (
    AddBatchRequest,
    AddItem,
    AddRequest,
    PingRequest,
    ReadBatchRequest,
    WaitLacRequest,
)
from tests.support.launch import wait_for

KEY = bytes(range(32))


@pytest.fixture
def transport():
    made = []

    def make(**kwargs) -> Transport:
        t = Transport(**kwargs)
        made.append(t)
        return t

    yield make
    for t in made:
        t.close()


def events_for(t: Transport, count: int, timeout_s: float = 10.0) -> list[Event]:
    got: list[Event] = []
    wait_for(lambda: got.extend(t.next_events(100)) or len(got) >= count, timeout_s,
             what=f"{count} events")
    return got


class Silent:
    """A handler that never answers (the request stays outstanding)."""

    def __init__(self):
        self.seen = []

    def handle(self, peer, request):
        self.seen.append((peer, request))
        return None


def test_replies_arrive_as_events(transport, thread_server):
    ts = thread_server()
    t = transport()
    t.add_bookie("b1", ts.server.endpoint)
    add = t.send("b1", AddRequest(1, 0, KEY, b"x" * 1024), 5000)
    batch = t.send("b1", AddBatchRequest([AddItem(1, i, KEY, b"y") for i in range(1, 65)]),
                   5000)
    read = t.send("b1", ReadBatchRequest(1, 0, 64, 100, 1 << 20), 5000)
    by_rid = {e.request_id: e for e in events_for(t, 3)}
    assert by_rid[add] == Event("b1", add, Op.ADD, OK, AddReply(1, 0, add))
    assert [row[2] for row in by_rid[batch].reply.rows] == [OK] * 64
    rows = by_rid[read].reply.rows
    assert len(rows) == 65 and bytes(rows[0][2]) == b"x" * 1024
    assert t.inflight("b1") == 0


def test_a_silent_bookie_yields_a_timeout_event_and_late_replies_are_dropped(
        transport, thread_server):
    silent = Silent()
    ts = thread_server(silent)
    t = transport()
    t.add_bookie("b1", ts.server.endpoint)
    rid = t.send("b1", PingRequest(), 50)
    [event] = events_for(t, 1)
    assert (event.request_id, event.status, event.reply) == (rid, BKTimeoutError.code, None)
    peer = silent.seen[0][0]
    ts.server.stop()
    ts.thread.join(timeout=10)
    ts.server.send_reply(peer, PingReply(rid))  # the answer comes after the deadline
    wait_for(lambda: t.counters["late_replies"] == 1, 10, what="late reply counted")
    assert t.next_events(0) == []


def test_in_flight_is_bounded_per_bookie(transport, thread_server):
    ts = thread_server(Silent())
    t = transport(inflight_per_bookie_max=2)
    t.add_bookie("b1", ts.server.endpoint)
    t.send("b1", PingRequest(), 100)
    t.send("b1", PingRequest(), 100)
    with pytest.raises(TooManyRequestsError):
        t.send("b1", PingRequest(), 100)
    assert {e.status for e in events_for(t, 2)} == {BKTimeoutError.code}
    assert t.inflight("b1") == 0  # slots come back once events are delivered
    t.send("b1", PingRequest(), 100)


def test_bad_arguments_fail_before_sending(transport, thread_server):
    t = transport()
    with pytest.raises(ValueError, match="bookie_id"):
        t.send("nobody", PingRequest(), 100)
    t.add_bookie("b1", thread_server().server.endpoint)
    with pytest.raises(ValueError, match="master_key"):
        t.send("b1", AddRequest(1, 0, b"short", b"x"), 100)
    with pytest.raises(ValueError, match="timeout_ms"):
        t.send("b1", PingRequest(), 0)
    assert t.inflight("b1") == 0


def test_restarted_bookie_fails_outstanding_requests_then_reconnects(transport,
                                                                     server_process):
    server = server_process()
    t = transport()
    t.add_bookie("b1", server.endpoint)
    t.send("b1", AddRequest(1, 0, KEY, b"e0"), 5000)
    assert events_for(t, 1)[0].status == OK
    wait_for(lambda: t.is_connected("b1"), 10, what="connected")
    poll = t.send("b1", WaitLacRequest(1, 0, 60000), 60000)  # stays outstanding
    server.kill()
    [event] = events_for(t, 1)  # long before the 60 s deadline
    assert (event.request_id, event.status) == (poll, BookieUnavailableError.code)
    wait_for(lambda: not t.is_connected("b1"), 10, what="disconnected")
    t.send("b1", PingRequest(), 5000)
    assert events_for(t, 1)[0].status == BookieUnavailableError.code  # fails fast while down
    server.start()  # same endpoint, new process
    wait_for(lambda: t.is_connected("b1"), 20, what="reconnected")
    rid = t.send("b1", PingRequest(), 5000)
    assert events_for(t, 1)[0] == Event("b1", rid, Op.PING, OK, PingReply(rid))
    # >= 1: a reconnect can race the dying process's listener and be dropped again.
    assert t.counters["disconnects"] >= 1


def test_events_can_go_to_a_callback_on_the_io_thread(transport, thread_server):
    seen, threads = [], set()

    def on_events(events):
        threads.add(threading.current_thread().name)
        seen.extend(events)

    t = transport(on_events=on_events)
    t.add_bookie("b1", thread_server().server.endpoint)
    rids = {t.send("b1", PingRequest(), 5000) for _ in range(20)}
    wait_for(lambda: len(seen) == 20, 10, what="20 callback events")
    assert {e.request_id for e in seen} == rids and threads == {"bk-transport"}
    with pytest.raises(RuntimeError):
        t.next_events(0)


def test_a_failing_callback_stops_the_transport_loudly(transport, thread_server):
    def on_events(events):
        raise KeyError("bug in the binding")

    t = transport(on_events=on_events)
    t.add_bookie("b1", thread_server().server.endpoint)
    t.send("b1", PingRequest(), 5000)
    wait_for(lambda: t.counters["callback_failures"] == 1, 10, what="callback failure")
    with pytest.raises(RuntimeError, match="I/O thread failed"):
        t.send("b1", PingRequest(), 5000)


def test_remove_and_close_fail_outstanding_requests(transport, thread_server):
    ts = thread_server(Silent())
    t = transport()
    t.add_bookie("b1", ts.server.endpoint)
    t.add_bookie("b2", ts.server.endpoint)
    t.send("b1", PingRequest(), 60000)
    wait_for(lambda: len(ts.server.handler.seen) == 1, 10, what="request reached bookie")
    t.remove_bookie("b1")
    assert events_for(t, 1)[0].status == BookieUnavailableError.code
    t.send("b2", PingRequest(), 60000)
    wait_for(lambda: len(ts.server.handler.seen) == 2, 10, what="request reached bookie")
    t.close()
    [event] = t.next_events(0)
    assert (event.bookie_id, event.status) == ("b2", BookieUnavailableError.code)
    with pytest.raises(ClientClosedError):
        t.send("b2", PingRequest(), 100)


@pytest.fixture
def raw_bookie(transport, short_tmp):
    """A bare ROUTER standing in for a bookie (the test writes its replies by
    hand) and a transport connected to it as bookie "raw"; both closed after."""
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    try:
        router.bind(f"ipc://{short_tmp}/raw.sock")
        t = transport()
        t.add_bookie("raw", f"ipc://{short_tmp}/raw.sock")
        yield router, t
    finally:
        router.close(linger=0)
        ctx.term()


def test_a_garbled_reply_completes_its_request_with_an_error(raw_bookie):
    router, t = raw_bookie
    rid = t.send("raw", PingRequest(), 5000)
    assert router.poll(10000)
    peer, head = router.recv_multipart()
    # Right version, op and request id, but the header is cut short.
    router.send_multipart([peer, head[:12] + bytes(REPLY_HEAD.size - 20)])
    [event] = events_for(t, 1)
    assert (event.request_id, event.status) == (rid, BadRequestError.code)
    assert t.counters["bad_replies"] == 1


def test_an_ok_reply_of_another_op_is_an_error_not_a_reply(raw_bookie):
    # The client driver relies on this: an ADD_PACKED request is answered by an
    # AddPackedReply or by an error, never by some other op's reply.
    router, t = raw_bookie
    rid = t.send("raw", AddPackedRequest.of(7, KEY, [0], [b"x"]), 5000)
    assert router.poll(10000)
    peer = router.recv_multipart()[0]
    router.send_multipart([peer, *encode_reply(AddBatchReply([(7, 0, OK)], rid),
                                               DEFAULT_LIMITS)])
    [event] = events_for(t, 1)
    assert (event.request_id, event.status, event.reply) == (rid, BadRequestError.code,
                                                             None)
    assert t.counters["bad_replies"] == 1


def test_a_bookie_never_reached_fails_fast_after_its_first_timeout(transport, short_tmp):
    """Nothing listens (a host cut off before the first connection): the
    first request waits for its deadline, later ones fail at once, until a
    connection is made."""
    t = transport()
    t.add_bookie("b1", f"ipc://{short_tmp}/nobody.sock")
    first = t.send("b1", PingRequest(), 100)
    assert [(e.request_id, e.status) for e in events_for(t, 1)] == [(first,
                                                                       BKTimeoutError.code)]
    assert t.counters["never_connected"] == 1 and not t.is_connected("b1")
    later = t.send("b1", PingRequest(), 60_000)
    assert [(e.request_id, e.status) for e in events_for(t, 1, timeout_s=5)] == [
        (later, BookieUnavailableError.code)]


def test_without_an_io_thread_the_owner_steps_and_other_threads_go_through_it(
        transport, thread_server):
    """io_thread=False (the client driver's mode): no thread of the
    transport's own; events reach the callback on the owner thread inside
    step(); a send from another thread waits in the outbox and goes on the
    owner's next step, which that send's wake-up ends."""
    seen, threads = [], set()

    def on_events(events):
        threads.add(threading.current_thread().name)
        seen.extend(events)

    ts = thread_server(Silent())
    t = transport(on_events=on_events, io_thread=False)
    assert not [th for th in threading.enumerate() if th.name == "bk-transport"]
    t.bind_owner()
    t.add_bookie("b1", ts.server.endpoint)
    owned = t.send("b1", PingRequest(), 50)  # the owner's send goes at once
    wait_for(lambda: len(ts.server.handler.seen) == 1, 10, what="request reached bookie")
    while not seen:
        t.step(1000)  # its timeout comes back as an event on this thread
    assert [(e.request_id, e.status) for e in seen] == [(owned, BKTimeoutError.code)]
    assert threads == {threading.current_thread().name}
    other = threading.Thread(target=lambda: t.send("b1", PingRequest(), 60000))
    other.start()
    other.join(10)
    assert len(ts.server.handler.seen) == 1  # queued for the owner, not sent
    t.step(10000)  # the sender's wake-up ends the wait: the request goes now
    wait_for(lambda: len(ts.server.handler.seen) == 2, 10, what="queued request sent")
    t.close()
    assert [e.status for e in seen[1:]] == [BookieUnavailableError.code]


def test_without_an_io_thread_a_callback_is_required(transport):
    with pytest.raises(ValueError, match="on_events"):
        transport(io_thread=False)


def test_a_wake_after_close_writes_nowhere(transport):
    """A thread finishing late (the client's metadata pool) may wake a closed
    transport: the closed pipe's descriptor number can belong to a file
    opened since, which must not receive a byte."""
    import os

    t = transport(on_events=lambda events: None, io_thread=False)
    reused = t._wakeup._w
    t.close()
    r, w = os.pipe()
    os.dup2(w, reused)  # someone else's file now has the closed pipe's number
    try:
        os.set_blocking(r, False)
        t.wake()
        with pytest.raises(BlockingIOError):
            os.read(r, 1)
    finally:
        for fd in (r, w, reused):
            os.close(fd)


def test_raw_replies_come_back_as_frames_matched_by_request_id(raw_bookie, transport,
                                                                short_tmp):
    """raw_replies (the bulk reader's mode): no decoding in the transport;
    the reply's frames, uncopied, go to the request named in its header;
    a reply nobody waits for is dropped and counted."""
    router = raw_bookie[0]
    t = transport(raw_replies=True)
    t.add_bookie("raw", f"ipc://{short_tmp}/raw.sock")
    rid = t.send("raw", ReadBatchRequest(1, 0, 3, 4, 1 << 20), 5000)
    assert router.poll(10000)
    peer = router.recv_multipart()[0]
    reply = [bytes(f) for f in encode_reply(AddBatchReply([(1, 0, OK)], rid), DEFAULT_LIMITS)]
    router.send_multipart([peer, *reply])
    [event] = events_for(t, 1)
    assert (event.request_id, event.op, event.status, event.reply) == (rid, Op.READ_BATCH,
                                                                       OK, None)
    assert all(isinstance(f, zmq.Frame) for f in event.frames)
    assert [f.bytes for f in event.frames] == reply  # not decoded: the caller checks it
    router.send_multipart([peer, *reply])  # again: its request is done
    wait_for(lambda: t.counters["late_replies"] == 1, 10, what="late reply counted")
    router.send_multipart([peer, b"short"])  # no request id to match
    wait_for(lambda: t.counters["bad_replies"] == 1, 10, what="bad reply counted")


def test_an_owners_send_that_fails_at_once_ends_its_next_step_at_once(transport):
    """io_thread=False: a send the transport refuses on the spot (its bookie
    is known to be down) is delivered by the next step without waiting."""
    seen = []
    t = transport(on_events=seen.extend, io_thread=False, poll_ms_max=60_000)
    t.bind_owner()
    t.add_bookie("b1", "ipc:///nonexistent/nobody.sock")
    t._io.conns["b1"].state = "down"  # as after a disconnect
    rid = t.send("b1", PingRequest(), 60_000)
    started = time.monotonic()
    t.step(60_000)  # would wait a minute if the failure were not counted as work
    assert time.monotonic() - started < 5
    assert [(e.request_id, e.status) for e in seen] == [(rid, BookieUnavailableError.code)]
