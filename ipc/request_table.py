"""The client side's outstanding requests: which bookie each went to, its
deadline, and the ``Event`` that ends it.  Owned by the transport's I/O
thread (``ipc.client``); the bookie connections (``ipc.bookie_connections``)
carry the frames.

Guarantees:

* every request gets exactly one event: its reply, or ``BKTimeoutError`` at
  its deadline, or ``BookieUnavailableError`` when its bookie disconnects,
  is removed, or the transport closes (``UnauthorizedError`` when the
  bookie refuses our CURVE handshake); a reply arriving after that is
  dropped and counted (``late_replies``);
* a reply is matched to its request by request id *and* bookie: a reply
  from another bookie never completes a request;
* a reply that does not decode completes its request (when its request id
  is readable) with the decoder's error code and is counted (``bad_replies``);
  so does a reply of another op than its request's;
* ``raw_replies``: replies are not decoded here; a reply is matched to its
  request by the request id in its header and handed back as it came
  (``Event.frames``: ZeroMQ's own frames, never copied into Python bytes,
  ``status`` OK: the reply's own status is inside), for callers that decode
  in batch themselves (the bulk reader's READ_PACKED replies).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import zmq

from appliance.protocol.errors import (
    OK,
    BadRequestError,
    BKTimeoutError,
    BookieUnavailableError,
    TooManyRequestsError,
    UnauthorizedError,
)
from ipc.bookie_connections import BookieConnections
from ipc.frames import salvage_ids
from ipc.replies import ErrorReply, LacReply, Reply, decode_reply
from ipc.zmq_frames import send_frames

_ZERO_COPY_BYTES_MIN = 64 * 1024


@dataclass(frozen=True, slots=True)
class Event:
    """The outcome of one request.  ``status`` is OK or an error code;
    ``reply`` is the decoded reply (None for timeouts and local failures);
    ``frames``: a raw reply's ``zmq.Frame`` s (``raw_replies`` only)."""

    bookie_id: str
    request_id: int
    op: int
    status: int
    reply: Reply | None = None
    frames: list | None = None


class RequestTable:
    """Requests sent and not yet ended (``pending``: request id -> (bookie
    id, op)), their deadlines (a heap), and the events made since the loop
    last delivered them (``events``)."""

    def __init__(self, t):
        self.t = t  # the Transport: its clock, limits, counters and options
        self.pending: dict[int, tuple[str, int]] = {}  # rid -> (bookie id, op)
        self.deadlines: list[tuple[float, int]] = []
        self.events: list[Event] = []
        self.connections: BookieConnections | None = None  # set by use_connections
        self.conns: dict = {}
        self.touched: set = set()  # the loop's: connections to look at before it waits

    def use_connections(self, connections: BookieConnections, touched: set) -> None:
        """The connections the requests travel on (they need the table too,
        to fail a bookie's requests, so one of the two is wired after), and
        the loop's set of connections used since it last looked at them (a
        send may take the readiness signal of a reply that came meanwhile)."""
        self.connections = connections
        self.conns = connections.conns  # the same dict: no call per send
        self.touched = touched

    def poll_timeout_ms(self) -> int:
        """How long the loop may wait: until the next live deadline, at most
        the transport's ``poll_ms_max``."""
        while self.deadlines and self.deadlines[0][1] not in self.pending:
            heapq.heappop(self.deadlines)
        if not self.deadlines:
            return self.t._poll_ms_max
        wait_ms = (self.deadlines[0][0] - self.t.clock()) * 1000.0
        return max(0, min(self.t._poll_ms_max, int(wait_ms) + 1))

    def send(self, bookie_id: str, rid: int, op: int, deadline_s: float, frames) -> None:
        conn = self.conns.get(bookie_id)
        if conn is not None and conn.state == "refused":
            if not self.connections.retry_refused(conn):
                self.emit(bookie_id, rid, op, UnauthorizedError.code)
                return
        if conn is None or conn.state == "down":
            self.emit(bookie_id, rid, op, BookieUnavailableError.code)
            return
        self.touched.add(conn)  # the send may take the signal of a reply: look again
        try:
            # Zero-copy only pays for big frames; small ones are cheaper to copy.
            copy = all(len(f) < _ZERO_COPY_BYTES_MIN for f in frames)
            send_frames(conn.sock, frames, copy)
        except zmq.Again:
            self.emit(bookie_id, rid, op, TooManyRequestsError.code)
            return
        self.t.counters["sent"] += 1
        self.pending[rid] = (bookie_id, op)
        heapq.heappush(self.deadlines, (deadline_s, rid))

    def on_reply(self, bookie_id: str, frames: list) -> None:
        if self.t.raw_replies:
            self._on_raw_reply(bookie_id, frames)
            return
        try:
            reply = decode_reply(frames, self.t.limits)
        except BadRequestError as exc:
            self.t.counters["bad_replies"] += 1
            _, rid = salvage_ids(frames[0])
            if self.pending.get(rid, ("",))[0] == bookie_id:
                op = self.pending.pop(rid)[1]
                self.emit(bookie_id, rid, op, exc.code)
            return
        rid = reply.request_id
        pending = self.pending.get(rid)
        if pending is None or pending[0] != bookie_id:
            self.t.counters["late_replies"] += 1
            return
        del self.pending[rid]
        bookie_id, op = pending
        if reply.status == OK and _reply_op(reply) != op:
            self.t.counters["bad_replies"] += 1
            self.emit(bookie_id, rid, op, BadRequestError.code)
            return
        self.t.counters["replies"] += 1
        self.emit(bookie_id, rid, op, reply.status, reply)

    def _on_raw_reply(self, bookie_id: str, frames: list) -> None:
        """``raw_replies``: match by the header's request id; the caller decodes."""
        _, rid = salvage_ids(frames[0])
        pending = self.pending.get(rid)
        if pending is None or pending[0] != bookie_id:
            self.t.counters["late_replies" if rid else "bad_replies"] += 1
            return
        del self.pending[rid]
        self.t.counters["replies"] += 1
        self.emit(bookie_id, rid, pending[1], OK, frames=frames)

    def expire(self) -> None:
        """End every request past its deadline with ``BKTimeoutError``; its
        connection then decides whether the bookie counts as gone."""
        now = self.t.clock()
        while self.deadlines and self.deadlines[0][0] <= now:
            _, rid = heapq.heappop(self.deadlines)
            pending = self.pending.pop(rid, None)
            if pending is not None:
                self.t.counters["timeouts"] += 1
                self.emit(pending[0], rid, pending[1], BKTimeoutError.code)
                self.connections.on_request_timeout(pending[0], now)

    def fail_pending(self, bookie_id: str | None, status: int) -> None:
        """End every request to ``bookie_id`` (None: to any) with ``status``."""
        for rid, (owner, op) in list(self.pending.items()):
            if bookie_id is None or owner == bookie_id:
                del self.pending[rid]
                self.emit(owner, rid, op, status)

    def emit(self, bookie_id: str, rid: int, op: int, status: int, reply=None,
             frames=None) -> None:
        self.events.append(Event(bookie_id, rid, op, status, reply, frames))


def _reply_op(reply: Reply) -> int:
    if isinstance(reply, ErrorReply | LacReply):
        return reply.op
    return int(reply.OP)
