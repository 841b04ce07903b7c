"""The client side of the wire: one DEALER per bookie, owned by one I/O thread.

Threading story: ``Transport`` starts a single I/O thread that owns every
ZeroMQ socket (ZeroMQ sockets are not thread-safe).  Any thread may call
``send`` / ``add_bookie`` / ``remove_bookie``: they validate and encode in
the caller's thread, then hand the work to the I/O thread through a locked
outbox and a wake-up pipe.  Results come back as ``Event``s, one per request
(a reply, a timeout, or a failure such as "bookie unavailable"), either to
an ``on_events(list)`` callback run on the I/O thread (the client binding
can drive its pure protocol core from there) or, without a callback, to
``next_events(timeout_ms)``.

With ``io_thread=False`` there is no I/O thread: the thread that called
``bind_owner()`` owns the sockets and runs the loop itself, one
``step(timeout_ms)`` at a time (the client driver does, so a message costs
no thread hand-off); its own calls act at once, other threads' calls go
through the outbox and wake its ``step``, and ``wake()`` ends a wait.

Guarantees and limits:

* every request gets exactly one event: its reply, or ``BKTimeoutError`` at
  its deadline, or ``BookieUnavailableError`` when its bookie disconnects,
  is removed, or the transport closes; a reply arriving after that is
  dropped and counted (``late_replies``);
* at most ``inflight_per_bookie_max`` requests per bookie are outstanding;
  a slot is freed when the request's event is *delivered* (callback
  returned / ``next_events`` returned it), so the event queue is bounded by
  the same limit; ``send`` beyond it raises ``TooManyRequestsError``;
* reconnect: ZeroMQ reconnects by itself (``reconnect_ivl_ms`` ..
  ``reconnect_ivl_max_ms``).  A socket monitor tracks the connection: on a
  disconnect the bookie's outstanding requests fail at once and its socket
  is replaced, which discards anything still queued in it, so nothing sent
  before the disconnect reaches a restarted bookie later.  Until the
  reconnect completes, requests to that bookie fail fast.  Before the very
  first connection, requests wait in the socket (bounded by their timeout);
  once one of them times out still unconnected, the bookie is treated as
  disconnected (``never_connected``): a host cut off before this client
  ever reached it fails fast too.  With ``heartbeat_timeout_ms``, ZeroMQ
  pings each bookie every quarter of it and a connection that stays silent
  that long counts as a disconnect: a host cut off the network (no RST ever
  arrives) is noticed even by a writer whose other bookies keep its ack
  quorum; and a tcp bookie that sent nothing for that long when a request
  to it times out is disconnected the same way (``silent``: ZeroMQ's
  heartbeat can miss a dead peer while a stream of sends keeps its output
  blocked).
* identities: each DEALER gets ``<identity>-<n>`` (n counts sockets), so a
  replacement socket never collides with a route the bookie still holds;
* CURVE (``ipc.curve``): given ``curve_keys``, a bookie added with a
  ``server_key`` on a tcp endpoint is reached over CURVE (encrypted; its
  key verified; ours presented).  Such a connection counts as up only once
  its handshake succeeded.  A handshake the bookie refuses (our key is not
  authorized, or it wants CURVE and we have no key) fails the bookie's
  outstanding requests with ``UnauthorizedError`` and so does every request
  until a retry: ZeroMQ does not reconnect after a refused handshake, so a
  send at least ``reconnect_ivl_max_ms`` after the refusal opens a fresh
  socket and tries once more (at most one handshake per bookie per
  interval).  ``refused_bookies()`` names the bookies refusing us;
* a reply that does not decode completes its request (when its request id
  is readable) with the decoder's error code and is counted (``bad_replies``);
* ``raw_replies``: replies are not decoded here; a reply is matched to its
  request by the request id in its header and handed back as it came
  (``Event.frames``: ZeroMQ's own frames, never copied into Python bytes,
  ``status`` OK: the reply's own status is inside), for callers that decode
  in batch themselves (the bulk reader's READ_PACKED replies).
"""

from __future__ import annotations

import heapq
import logging
import os
import struct
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import zmq

from appliance.protocol.errors import (
    OK,
    BadRequestError,
    BKTimeoutError,
    BookieUnavailableError,
    ClientClosedError,
    TooManyRequestsError,
    UnauthorizedError,
)
from ipc.curve import KeyPair, configure_client, is_tcp
from ipc.frames import DEFAULT_LIMITS, WireLimits, salvage_ids
from ipc.replies import ErrorReply, LacReply, Reply, decode_reply
from ipc.requests import Request, encode_request
from ipc.zmq_frames import recv_frames, send_frames

log = logging.getLogger(__name__)

_MONITOR_EVENTS = (zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED
                   | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)
_REFUSED_EVENTS = zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
_ZERO_COPY_BYTES_MIN = 64 * 1024


_MONITOR_HEAD = struct.Struct("=Hi")  # zmq_socket_monitor: event (16 bits), value (32 bits)


def _monitor_event(frames: list[bytes]) -> int:
    """The event number of a socket monitor message (its first frame; the
    second names the endpoint).  ``zmq.utils.monitor`` would do the same,
    but importing it imports asyncio: thousands of objects more in every
    client's heap for every full garbage collection to scan."""
    return _MONITOR_HEAD.unpack_from(frames[0])[0]


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


class _Conn:
    __slots__ = ("bookie_id", "endpoint", "server_key", "sock", "monitor", "state", "retry_at_s",
                 "heard_s")

    def __init__(self, bookie_id: str, endpoint: str, server_key: bytes | None = None):
        self.bookie_id = bookie_id
        self.endpoint = endpoint
        self.server_key = server_key  # CURVE: the bookie's public key (tcp only)
        self.sock = None
        self.monitor = None
        self.state = "connecting"  # -> up <-> down; -> refused (CURVE) -> connecting
        self.retry_at_s = 0.0
        self.heard_s = 0.0  # when a frame last arrived from it (or it connected)


class Transport:
    """DEALER sockets to many bookies behind one I/O thread (see module doc)."""

    def __init__(self, *, on_events: Callable[[list[Event]], None] | None = None,
                 inflight_per_bookie_max: int = 1024, identity: bytes | None = None,
                 limits: WireLimits = DEFAULT_LIMITS, drain_messages_max: int = 256,
                 reconnect_ivl_ms: int = 100, reconnect_ivl_max_ms: int = 2000,
                 poll_ms_max: int = 1000, clock: Callable[[], float] = time.monotonic,
                 context: zmq.Context | None = None, curve_keys: KeyPair | None = None,
                 heartbeat_timeout_ms: int = 0, io_thread: bool = True,
                 raw_replies: bool = False):
        if inflight_per_bookie_max < 1:
            raise ValueError("inflight_per_bookie_max must be >= 1")
        if not io_thread and on_events is None:
            raise ValueError("a transport without its I/O thread needs on_events")
        self.limits = limits
        self.inflight_per_bookie_max = inflight_per_bookie_max
        self.identity = identity or f"client-{os.getpid()}-{uuid.uuid4().hex[:12]}".encode()
        self.clock = clock
        self.curve_keys = curve_keys
        self.raw_replies = raw_replies
        self.counters = dict.fromkeys(
            ("sent", "replies", "late_replies", "bad_replies", "timeouts", "disconnects",
             "never_connected", "silent", "callback_failures", "handshakes_refused"), 0)
        self._on_events = on_events
        self._drain_max = drain_messages_max
        self._reconnect = (reconnect_ivl_ms, reconnect_ivl_max_ms)
        self._heartbeat_timeout_ms = heartbeat_timeout_ms
        self._poll_ms_max = poll_ms_max
        self._own_context = context is None
        self._ctx = context or zmq.Context()
        self._cond = threading.Condition()
        self._outbox: list[tuple] = []
        self._events: deque[Event] = deque()
        self._inflight: dict[str, int] = {}
        self._endpoints: dict[str, str] = {}
        self._connected: dict[str, bool] = {}
        self._refused: dict[str, str] = {}  # bookie id -> why its handshake failed
        self._next_rid = 1
        self._closing = False
        self._failure: BaseException | None = None
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._io = _IoLoop(self)
        self._owner: int | None = None  # io_thread=False: the thread that calls step()
        self._thread = None
        if io_thread:
            self._thread = threading.Thread(target=self._io.run, name="bk-transport",
                                            daemon=True)
            self._thread.start()

    # -- API (any thread) -------------------------------------------------------
    def add_bookie(self, bookie_id: str, endpoint: str, server_key: bytes | None = None) -> None:
        """Connect to ``bookie_id`` at ``endpoint`` (replacing an older endpoint
        or key); over CURVE when ``server_key`` is given, the endpoint is tcp
        and this transport has ``curve_keys``."""
        with self._cond:
            self._check_open()
            self._endpoints[bookie_id] = endpoint
            self._inflight.setdefault(bookie_id, 0)
            if not self._on_owner():
                self._post(("add", bookie_id, endpoint, server_key))
                return
        self._io._add(bookie_id, endpoint, server_key)

    def remove_bookie(self, bookie_id: str) -> None:
        """Disconnect; its outstanding requests fail with BookieUnavailableError."""
        with self._cond:
            self._check_open()
            if self._endpoints.pop(bookie_id, None) is None:
                return
            if not self._on_owner():
                self._post(("remove", bookie_id))
                return
        self._io._remove(bookie_id)

    def send(self, bookie_id: str, request: Request, timeout_ms: int) -> int:
        """Queue ``request`` for ``bookie_id``; returns its request id (also set
        on ``request``).  Exactly one Event follows.  Raises ValueError /
        TypeError for a bad request, TooManyRequestsError when the bookie has
        ``inflight_per_bookie_max`` requests outstanding."""
        if not isinstance(timeout_ms, int) or timeout_ms < 1:
            raise ValueError(f"timeout_ms must be a positive int, got {timeout_ms!r}")
        with self._cond:
            self._check_open()
            if bookie_id not in self._endpoints:
                raise ValueError(f"bookie_id {bookie_id!r} was not added")
            if self._inflight[bookie_id] >= self.inflight_per_bookie_max:
                raise TooManyRequestsError(f"{bookie_id}: {self.inflight_per_bookie_max} "
                                           f"requests in flight")
            rid = self._next_rid
            self._next_rid += 1
            request.request_id = rid
            frames = encode_request(request, self.limits)
            self._inflight[bookie_id] += 1
            deadline_s = self.clock() + timeout_ms / 1000.0
            if not self._on_owner():
                self._post(("send", bookie_id, rid, int(request.OP), deadline_s, frames))
                return rid
        self._io._send(bookie_id, rid, int(request.OP), deadline_s, frames)
        return rid

    # -- without an I/O thread (io_thread=False): the owner thread runs it -----
    def bind_owner(self) -> None:
        """io_thread=False: the calling thread owns the sockets from now on;
        its calls act at once, other threads' go through the outbox."""
        if self._thread is not None:
            raise RuntimeError("this transport has its own I/O thread")
        self._owner = threading.get_ident()

    def step(self, timeout_ms: int) -> None:
        """io_thread=False, owner thread: wait up to ``timeout_ms`` (less if a
        request's deadline comes first) for replies, connection changes or a
        ``wake()``; handle them; deliver the events to ``on_events``."""
        self._io.step(timeout_ms)

    def wake(self) -> None:
        """Any thread: end the owner's current ``step`` wait (nothing once
        closed: the pipe's descriptors may already belong to someone else)."""
        with self._cond:
            if self._closing:
                return
            try:
                os.write(self._wake_w, b"\0")
            except BlockingIOError:
                pass  # a wakeup is already pending

    def _on_owner(self) -> bool:
        return self._owner is not None and self._owner == threading.get_ident()

    def next_events(self, timeout_ms: int, max_events: int = 1024) -> list[Event]:
        """Events delivered so far (up to ``max_events``), waiting up to
        ``timeout_ms`` for the first.  Only without an ``on_events`` callback."""
        if self._on_events is not None:
            raise RuntimeError("events go to the on_events callback")
        deadline_s = time.monotonic() + timeout_ms / 1000.0
        with self._cond:
            while not self._events and not self._closing:
                remaining_s = deadline_s - time.monotonic()
                if remaining_s <= 0 or not self._cond.wait(remaining_s):
                    break
            out = []
            while self._events and len(out) < max_events:
                out.append(self._events.popleft())
            self._release(out)
        return out

    def is_connected(self, bookie_id: str) -> bool:
        with self._cond:
            return self._connected.get(bookie_id, False)

    def refused_bookies(self) -> dict[str, str]:
        """Bookies whose last handshake refused us: id -> why (one line)."""
        with self._cond:
            return dict(self._refused)

    def inflight(self, bookie_id: str) -> int:
        with self._cond:
            return self._inflight.get(bookie_id, 0)

    def close(self) -> None:
        """Stop the I/O thread; outstanding requests get BookieUnavailableError
        events (delivered to the callback, or left for ``next_events``)."""
        with self._cond:
            if self._closing:
                return
            self._closing = True
            self._post(("close",))
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
        else:  # the owner has stopped stepping: finish its work here
            self._io.finish()
        os.close(self._wake_r)
        os.close(self._wake_w)
        if self._own_context:
            self._ctx.term()

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals shared with the I/O thread (hold self._cond) ----------------
    def _check_open(self) -> None:
        if self._failure is not None:
            raise RuntimeError("transport I/O thread failed") from self._failure
        if self._closing:
            raise ClientClosedError("transport is closed")

    def _post(self, item: tuple) -> None:
        was_empty = not self._outbox
        self._outbox.append(item)
        if was_empty:
            try:
                os.write(self._wake_w, b"\0")
            except BlockingIOError:
                pass  # a wakeup is already pending

    def _release(self, events: list[Event]) -> None:
        for event in events:
            self._inflight[event.bookie_id] = self._inflight.get(event.bookie_id, 1) - 1

    def _deliver(self, events: list[Event]) -> None:
        """Called on the I/O thread with the events of one wakeup."""
        if self._on_events is None:
            with self._cond:
                self._events.extend(events)
                self._cond.notify_all()
            return
        try:
            self._on_events(events)
        except Exception as exc:
            self.counters["callback_failures"] += 1
            log.exception("on_events callback failed; the transport stops accepting work")
            with self._cond:
                self._failure = self._failure or exc
        with self._cond:
            self._release(events)


class _IoLoop:
    """Runs on the I/O thread; owns sockets, pending requests and deadlines."""

    def __init__(self, t: Transport):
        self.t = t
        self.poller = zmq.Poller()
        self.poller.register(t._wake_r, zmq.POLLIN)
        self.conns: dict[str, _Conn] = {}
        self.pending: dict[int, tuple[str, int]] = {}  # rid -> (bookie id, op)
        self.deadlines: list[tuple[float, int]] = []
        self.events: list[Event] = []
        self.sockets_opened = 0

    def run(self) -> None:
        try:
            while not self._step():
                pass
        finally:
            self.finish()

    def finish(self) -> None:
        """Close every socket; what was outstanding fails (delivered)."""
        for conn in list(self.conns.values()):
            self._close_conn(conn)
        self._fail_pending(None, BookieUnavailableError.code)
        if self.events:
            events, self.events = self.events, []
            self.t._deliver(events)

    def step(self, timeout_ms: int) -> None:
        """One wait and its work, on the owner thread (no I/O thread); events
        emitted while delivering (a send that failed at once) are delivered
        too, so the owner never waits on work already done."""
        self._step(timeout_ms)
        for _ in range(64):  # bounded: each round is a reaction to the last
            if not self.events:
                break
            events, self.events = self.events, []
            self.t._deliver(events)

    def _step(self, timeout_ms: int | None = None) -> bool:
        wait_ms = self._poll_timeout_ms()
        if timeout_ms is not None:
            wait_ms = min(wait_ms, timeout_ms)
        if self.events:  # the owner's own calls failed at once: no wait for those
            wait_ms = 0
        ready = dict(self.poller.poll(wait_ms))
        if self.t._wake_r in ready and self._take_outbox():
            return True
        for conn in list(self.conns.values()):
            if conn.monitor is not None and conn.monitor in ready:
                self._on_monitor(conn)
            if conn.sock is not None and conn.sock in ready:
                self._drain(conn)
        self._expire()
        if self.events:
            events, self.events = self.events, []
            self.t._deliver(events)
        return False

    def _poll_timeout_ms(self) -> int:
        while self.deadlines and self.deadlines[0][1] not in self.pending:
            heapq.heappop(self.deadlines)
        if not self.deadlines:
            return self.t._poll_ms_max
        wait_ms = (self.deadlines[0][0] - self.t.clock()) * 1000.0
        return max(0, min(self.t._poll_ms_max, int(wait_ms) + 1))

    def _take_outbox(self) -> bool:
        """Run queued work; True when asked to close."""
        try:
            while os.read(self.t._wake_r, 4096):
                pass
        except BlockingIOError:
            pass
        with self.t._cond:
            items, self.t._outbox = self.t._outbox, []
        for item in items:
            kind = item[0]
            if kind == "send":
                self._send(*item[1:])
            elif kind == "add":
                self._add(*item[1:])
            elif kind == "remove":
                self._remove(item[1])
            elif kind == "close":
                return True
        return False

    # -- connections --------------------------------------------------------------
    def _add(self, bookie_id: str, endpoint: str, server_key: bytes | None = None) -> None:
        old = self.conns.get(bookie_id)
        if self.t.curve_keys is None or not is_tcp(endpoint):
            server_key = None  # ipc keeps filesystem permissions; no keys: plain
        if old is not None:
            if (old.endpoint, old.server_key) == (endpoint, server_key):
                return
            self._remove(bookie_id)
        conn = _Conn(bookie_id, endpoint, server_key)
        self._open_socket(conn)
        self.conns[bookie_id] = conn

    def _open_socket(self, conn: _Conn) -> None:
        t = self.t
        sock = t._ctx.socket(zmq.DEALER)
        self.sockets_opened += 1  # unique per socket: a replacement never collides
        sock.setsockopt(zmq.IDENTITY, b"%s-%d" % (t.identity, self.sockets_opened))
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, t.inflight_per_bookie_max + 16)
        sock.setsockopt(zmq.RCVHWM, 0)  # replies are bounded by in-flight requests
        sock.setsockopt(zmq.RECONNECT_IVL, t._reconnect[0])
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, t._reconnect[1])
        sock.setsockopt(zmq.MAXMSGSIZE, t.limits.frame_bytes_max + 4096)
        if t._heartbeat_timeout_ms > 0:  # a peer silent this long is disconnected
            sock.setsockopt(zmq.HEARTBEAT_IVL, max(1, t._heartbeat_timeout_ms // 4))
            sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, t._heartbeat_timeout_ms)
            sock.setsockopt(zmq.HEARTBEAT_TTL, t._heartbeat_timeout_ms)
        if conn.server_key is not None:
            configure_client(sock, t.curve_keys, conn.server_key)
        monitor = sock.get_monitor_socket(_MONITOR_EVENTS)
        try:
            sock.connect(conn.endpoint)
        except zmq.ZMQError:  # an endpoint ZeroMQ cannot use: leak no socket
            sock.disable_monitor()
            monitor.close(linger=0)
            sock.close(linger=0)
            raise
        conn.sock, conn.monitor = sock, monitor
        self.poller.register(sock, zmq.POLLIN)
        self.poller.register(conn.monitor, zmq.POLLIN)

    def _close_conn(self, conn: _Conn) -> None:
        if conn.sock is None:
            return
        self.poller.unregister(conn.sock)
        self.poller.unregister(conn.monitor)
        conn.sock.disable_monitor()
        conn.monitor.close(linger=0)
        conn.sock.close(linger=0)
        conn.sock = conn.monitor = None

    def _remove(self, bookie_id: str) -> None:
        conn = self.conns.pop(bookie_id, None)
        if conn is not None:
            self._close_conn(conn)
        self._set_connected(bookie_id, False)
        self._set_refused(bookie_id, None)
        self._fail_pending(bookie_id, BookieUnavailableError.code)

    def _on_monitor(self, conn: _Conn) -> None:
        # CURVE: connected means handshake done; plain: the TCP/ipc connect
        up_event = zmq.EVENT_HANDSHAKE_SUCCEEDED if conn.server_key else zmq.EVENT_CONNECTED
        while conn.monitor is not None and conn.monitor.poll(0):
            event = _monitor_event(conn.monitor.recv_multipart())
            if event == up_event:
                conn.state = "up"
                conn.heard_s = self.t.clock()
                self._set_connected(conn.bookie_id, True)
                self._set_refused(conn.bookie_id, None)
            elif event & _REFUSED_EVENTS:
                self._on_refused(conn, event == zmq.EVENT_HANDSHAKE_FAILED_AUTH)
            elif event == zmq.EVENT_DISCONNECTED and conn.state == "up":
                self._on_disconnect(conn)

    def _on_refused(self, conn: _Conn, by_zap: bool) -> None:
        """The bookie refused our handshake: ZeroMQ will not reconnect, so the
        socket is closed (dropping its queue) and reopened on a later send."""
        self.t.counters["handshakes_refused"] += 1
        if by_zap:
            why = (f"bookie {conn.bookie_id} ({conn.endpoint}) refused this client's CURVE "
                   f"key {self.t.curve_keys.public.decode()}: it is not in the bookie's "
                   f"[security] authorized_keys_dir")
        elif conn.server_key is None:
            why = (f"bookie {conn.bookie_id} ({conn.endpoint}) refused the handshake: it "
                   f"requires CURVE and this client has no key (set [security] curve = true "
                   f"and key_file, or connect(..., curve_key_file=...))")
        else:
            why = (f"bookie {conn.bookie_id} ({conn.endpoint}) failed the CURVE handshake "
                   f"(protocol error): its published server key may be stale")
        was_up = conn.state == "up"
        conn.state = "refused"
        conn.retry_at_s = self.t.clock() + self.t._reconnect[1] / 1000.0
        self._set_refused(conn.bookie_id, why)
        if was_up:
            self._set_connected(conn.bookie_id, False)
        self._fail_pending(conn.bookie_id, UnauthorizedError.code)
        self._close_conn(conn)

    def _set_refused(self, bookie_id: str, why: str | None) -> None:
        with self.t._cond:
            if why is None:
                self.t._refused.pop(bookie_id, None)
            else:
                if bookie_id not in self.t._refused:
                    log.warning("%s", why)
                self.t._refused[bookie_id] = why

    def _on_disconnect(self, conn: _Conn, counter: str = "disconnects") -> None:
        """Fail what was outstanding and replace the socket, dropping its queue."""
        self.t.counters[counter] += 1
        conn.state = "down"
        self._set_connected(conn.bookie_id, False)
        self._fail_pending(conn.bookie_id, BookieUnavailableError.code)
        self._close_conn(conn)
        self._open_socket(conn)

    def _set_connected(self, bookie_id: str, up: bool) -> None:
        with self.t._cond:
            self.t._connected[bookie_id] = up

    # -- requests -----------------------------------------------------------------
    def _send(self, bookie_id: str, rid: int, op: int, deadline_s: float, frames) -> None:
        conn = self.conns.get(bookie_id)
        if conn is not None and conn.state == "refused":
            if self.t.clock() < conn.retry_at_s:
                self._emit(bookie_id, rid, op, UnauthorizedError.code)
                return
            conn.state = "connecting"  # try the handshake again, once per interval
            self._open_socket(conn)
        if conn is None or conn.state == "down":
            self._emit(bookie_id, rid, op, BookieUnavailableError.code)
            return
        try:
            # Zero-copy only pays for big frames; small ones are cheaper to copy.
            copy = all(len(f) < _ZERO_COPY_BYTES_MIN for f in frames)
            send_frames(conn.sock, frames, copy)
        except zmq.Again:
            self._emit(bookie_id, rid, op, TooManyRequestsError.code)
            return
        self.t.counters["sent"] += 1
        self.pending[rid] = (bookie_id, op)
        heapq.heappush(self.deadlines, (deadline_s, rid))

    def _drain(self, conn: _Conn) -> None:
        for _ in range(self.t._drain_max):
            try:
                frames = recv_frames(conn.sock)
            except zmq.Again:
                return
            conn.heard_s = self.t.clock()
            self._on_reply(conn.bookie_id, frames)

    def _on_reply(self, bookie_id: str, frames: list) -> None:
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
                self._emit(bookie_id, rid, op, exc.code)
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
            self._emit(bookie_id, rid, op, BadRequestError.code)
            return
        self.t.counters["replies"] += 1
        self._emit(bookie_id, rid, op, reply.status, reply)

    def _on_raw_reply(self, bookie_id: str, frames: list) -> None:
        """``raw_replies``: match by the header's request id; the caller decodes."""
        _, rid = salvage_ids(frames[0])
        pending = self.pending.get(rid)
        if pending is None or pending[0] != bookie_id:
            self.t.counters["late_replies" if rid else "bad_replies"] += 1
            return
        del self.pending[rid]
        self.t.counters["replies"] += 1
        self._emit(bookie_id, rid, pending[1], OK, frames=frames)

    def _expire(self) -> None:
        now = self.t.clock()
        while self.deadlines and self.deadlines[0][0] <= now:
            _, rid = heapq.heappop(self.deadlines)
            pending = self.pending.pop(rid, None)
            if pending is not None:
                self.t.counters["timeouts"] += 1
                self._emit(pending[0], rid, pending[1], BKTimeoutError.code)
                conn = self.conns.get(pending[0])
                if conn is not None and conn.state == "connecting":
                    self._on_disconnect(conn, "never_connected")
                elif conn is not None and self._silent(conn, now):
                    self._on_disconnect(conn, "silent")

    def _silent(self, conn: _Conn, now: float) -> bool:
        """A tcp bookie that sent nothing for the heartbeat timeout while a
        request to it timed out: a host cut off the network.  (ZeroMQ's own
        heartbeat can miss it while a stream of sends keeps its output
        blocked.)  Local ipc bookies are left to the add-timeout resends."""
        limit_ms = self.t._heartbeat_timeout_ms
        return (limit_ms > 0 and conn.state == "up" and conn.endpoint.startswith("tcp://")
                and (now - conn.heard_s) * 1000 >= limit_ms)

    def _fail_pending(self, bookie_id: str | None, status: int) -> None:
        for rid, (owner, op) in list(self.pending.items()):
            if bookie_id is None or owner == bookie_id:
                del self.pending[rid]
                self._emit(owner, rid, op, status)

    def _emit(self, bookie_id: str, rid: int, op: int, status: int, reply=None,
              frames=None) -> None:
        self.events.append(Event(bookie_id, rid, op, status, reply, frames))


def _reply_op(reply: Reply) -> int:
    if isinstance(reply, ErrorReply | LacReply):
        return reply.op
    return int(reply.OP)

