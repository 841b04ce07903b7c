"""FrameServer: decode/dispatch, deferred replies through an extra fd, timers
(long-poll expiry), bounded drains, error replies, graceful stop."""

from __future__ import annotations

import os

import pytest
import zmq

from appliance.errors import (
    OK,
    BadRequestError,
    BookieIOError,
    NoSuchEntryError,
    ProtocolVersionError,
    TooManyRequestsError,
    UnauthorizedError,
)
from ipc.memserver import MemoryBookie
from ipc.replies import AddReply, ErrorReply, LacReply, PingReply, decode_reply
from ipc.requests import (
    AddRequest,
    InfoRequest,
    PingRequest,
    ReadBatchRequest,
    ReadRequest,
    WaitLacRequest,
    encode_request,
)
from ipc.server import FrameServer
from tests.ipc.support import recv_within
from tests.support.launch import wait_for

KEY = bytes(range(32))


def call(sock, request):
    sock.send_multipart(encode_request(request))
    return decode_reply(recv_within(sock))


class DeferringHandler:
    """Acknowledges adds only when the test writes to ``durable_w`` (the way
    the bookie waits for its journal's durability ticket)."""

    def __init__(self):
        self.durable_r, self.durable_w = os.pipe()
        self.pending = []
        self.drains = []
        self._batch = []
        self.server = None

    def attach(self, server):
        self.server = server
        server.watch_fd(self.durable_r, self.on_durable)

    def handle(self, peer, request):
        if isinstance(request, AddRequest):
            self._batch.append(request.entry_id)
            self.pending.append((peer, AddReply(request.ledger_id, request.entry_id,
                                                request.request_id)))
            return None
        return PingReply(request.request_id)

    def after_drain(self):
        if self._batch:
            self.drains.append(self._batch)
            self._batch = []

    def on_durable(self):
        os.read(self.durable_r, 1)
        pending, self.pending = self.pending, []
        for peer, reply in pending:
            self.server.send_reply(peer, reply)

    def close(self):
        os.close(self.durable_r)
        os.close(self.durable_w)


@pytest.fixture
def deferring():
    handler = DeferringHandler()
    yield handler
    handler.close()


def test_round_trips_through_a_memory_bookie(thread_server, dealer):
    ts = thread_server()
    sock = dealer(ts.server.endpoint)
    assert call(sock, AddRequest(3, 0, KEY, b"hello", request_id=1)) == AddReply(3, 0, 1)
    read = call(sock, ReadRequest(3, 0, request_id=2))
    assert bytes(read.data) == b"hello" and read.request_id == 2
    missing = call(sock, ReadRequest(3, 1, request_id=3))
    assert isinstance(missing, ErrorReply) and missing.status == NoSuchEntryError.code
    wrong_key = call(sock, AddRequest(3, 1, bytes(32), b"x", request_id=4))
    assert wrong_key.status == UnauthorizedError.code


def test_add_is_acknowledged_only_after_the_durable_fd_fires(deferring, thread_server,
                                                              dealer):
    ts = thread_server(deferring)
    sock = dealer(ts.server.endpoint)
    sock.send_multipart(encode_request(AddRequest(1, 0, KEY, b"x", request_id=1)))
    # The server handles messages in order: the PING reply proves the ADD was
    # handled, and its reply (if it had been sent) would have come first.
    assert call(sock, PingRequest(request_id=2)) == PingReply(2)
    assert sock.poll(0) == 0
    os.write(deferring.durable_w, b"\1")
    assert decode_reply(recv_within(sock)) == AddReply(1, 0, 1)


def test_drains_are_bounded_and_cover_every_message(deferring, thread_server, dealer):
    ts = thread_server(deferring, start=False, drain_messages_max=4)
    sock = dealer(ts.server.endpoint)
    for entry_id in range(10):  # queued before the loop runs: drains batch them
        sock.send_multipart(encode_request(AddRequest(1, entry_id, KEY, b"x",
                                                      request_id=entry_id)))
    ts.start()
    wait_for(lambda: sum(map(len, deferring.drains)) == 10, 10, what="10 adds handled")
    assert [e for batch in deferring.drains for e in batch] == list(range(10))
    assert all(1 <= len(batch) <= 4 for batch in deferring.drains)
    os.write(deferring.durable_w, b"\1")
    replies = [decode_reply(recv_within(sock)) for _ in range(10)]
    assert [r.entry_id for r in replies] == list(range(10))


def test_long_poll_expires_on_a_timer_and_wakes_on_an_add(thread_server, dealer):
    ts = thread_server()
    sock = dealer(ts.server.endpoint)
    assert call(sock, AddRequest(5, 0, KEY, b"e0", request_id=1)).status == OK
    expired = call(sock, WaitLacRequest(5, 0, 50, request_id=2))
    assert isinstance(expired, LacReply) and expired.lac == 0  # no progress at timeout
    sock.send_multipart(encode_request(WaitLacRequest(5, 0, 60000, request_id=3)))
    sock.send_multipart(encode_request(AddRequest(5, 1, KEY, b"e1", request_id=4)))
    replies = {r.request_id: r for r in (decode_reply(recv_within(sock)) for _ in range(2))}
    woken = replies[3]
    assert replies[4] == AddReply(5, 1, 4)
    assert woken.request_id == 3 and woken.lac == 1 and bytes(woken.last_entry) == b"e1"


def test_long_polls_are_bounded(thread_server, dealer):
    ts = thread_server(MemoryBookie(long_polls_max=1))
    sock = dealer(ts.server.endpoint)
    call(sock, AddRequest(5, 0, KEY, b"e0", request_id=1))
    sock.send_multipart(encode_request(WaitLacRequest(5, 0, 60000, request_id=2)))
    refused = call(sock, WaitLacRequest(5, 0, 60000, request_id=3))
    assert refused.status == TooManyRequestsError.code


def test_garbage_gets_an_error_reply_and_a_counter(thread_server, dealer):
    ts = thread_server()
    sock = dealer(ts.server.endpoint)
    sock.send_multipart([b"\x01\x01"])
    assert decode_reply(recv_within(sock)).status == BadRequestError.code
    sock.send_multipart([b"\x02" + bytes(40)])
    assert decode_reply(recv_within(sock)).status == ProtocolVersionError.code
    info = call(sock, InfoRequest(request_id=9)).info
    assert info["counters"]["bad_messages"] == 2
    assert call(sock, PingRequest(request_id=10)) == PingReply(10)


def test_read_batch_is_cut_by_the_server_limits(thread_server, dealer):
    ts = thread_server()
    sock = dealer(ts.server.endpoint)
    for entry_id in range(5):
        call(sock, AddRequest(4, entry_id, KEY, bytes(100), request_id=entry_id))
    by_count = call(sock, ReadBatchRequest(4, 0, 4, 3, 1 << 20, request_id=10))
    assert [row[0] for row in by_count.rows] == [0, 1, 2]
    by_bytes = call(sock, ReadBatchRequest(4, 1, 4, 100, 250, request_id=11))
    assert [row[0] for row in by_bytes.rows] == [1, 2]
    past_end = call(sock, ReadBatchRequest(4, 3, 9, 100, 1 << 20, request_id=12))
    assert [(e, s) for e, s, _ in past_end.rows] == [(3, OK), (4, OK),
                                                     (5, NoSuchEntryError.code)]


class ExplodingHandler:
    def handle(self, peer, request):
        if isinstance(request, ReadRequest):
            raise RuntimeError("boom")
        return PingReply(request.request_id)


def test_a_handler_bug_answers_that_request_with_an_io_error(thread_server, dealer):
    ts = thread_server(ExplodingHandler())
    sock = dealer(ts.server.endpoint)
    failed = call(sock, ReadRequest(1, 0, request_id=1))
    assert failed.status == BookieIOError.code and "boom" in failed.message
    assert call(sock, PingRequest(request_id=2)) == PingReply(2)
    assert ts.server.counters["handler_failures"] == 1


def test_tcp_port_zero_reports_the_real_endpoint(thread_server, dealer):
    ts = thread_server(endpoint="tcp://127.0.0.1:0")
    host, port = ts.server.endpoint.rsplit(":", 1)
    assert host == "tcp://127.0.0.1" and int(port) > 0
    assert call(dealer(ts.server.endpoint), PingRequest(request_id=1)) == PingReply(1)


def test_bind_failure_is_a_clear_error(short_tmp):
    with pytest.raises(BookieIOError, match="cannot bind"):
        FrameServer(f"ipc://{short_tmp}/missing-dir/b.sock", MemoryBookie())


def test_socket_file_is_owner_only_or_given_to_a_configured_group(short_tmp):
    import grp
    import os
    import stat

    with FrameServer(f"ipc://{short_tmp}/o.sock", MemoryBookie()):
        assert stat.S_IMODE(os.stat(f"{short_tmp}/o.sock").st_mode) == 0o600
    group = grp.getgrgid(os.getgid()).gr_name  # a group this account is in
    with FrameServer(f"ipc://{short_tmp}/g.sock", MemoryBookie(), socket_group=group):
        st = os.stat(f"{short_tmp}/g.sock")
        assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == os.getgid()
    with pytest.raises(BookieIOError, match="'no-such-group-x' is not a group"):
        FrameServer(f"ipc://{short_tmp}/n.sock", MemoryBookie(), socket_group="no-such-group-x")
    assert not os.path.exists(f"{short_tmp}/n.sock")  # closed: nobody can connect to it


def test_reply_to_an_unknown_peer_is_dropped_and_counted(short_tmp):
    with FrameServer(f"ipc://{short_tmp}/u.sock", MemoryBookie()) as server:
        assert server.send_reply(b"nobody", PingReply(1)) is False
        assert server.counters["replies_dropped"] == 1


def test_timers_are_bounded_and_cancellable(short_tmp):
    now = [100.0]
    with FrameServer(f"ipc://{short_tmp}/x.sock", MemoryBookie(), timers_max=2,
                     clock=lambda: now[0]) as server:
        fired = []
        first = server.call_later_ms(10, lambda: fired.append("first"))
        server.call_later_ms(20, lambda: fired.append("second"))
        with pytest.raises(TooManyRequestsError):
            server.call_later_ms(30, lambda: fired.append("third"))
        first.cancel()
        first.cancel()  # idempotent
        server.call_later_ms(5, lambda: fired.append("fourth"))
        now[0] += 1.0
        server._run_due_timers()
        assert fired == ["fourth", "second"]


def test_stop_returns_serve_promptly(thread_server, dealer):
    ts = thread_server(poll_ms_max=60000)
    assert call(dealer(ts.server.endpoint), PingRequest(request_id=1)) == PingReply(1)
    ts.stop()  # asserts serve() returned within 10 s although polls wait up to 60 s
    with pytest.raises(zmq.ZMQError):
        ts.server._sock.send(b"x")  # the socket is closed


def test_close_removes_its_ipc_socket_file(short_tmp):
    path = short_tmp / "gone.sock"
    with FrameServer(f"ipc://{path}", MemoryBookie()):
        assert path.exists()
    assert not path.exists(), "a clean close leaves no socket file behind"
