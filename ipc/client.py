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

This module is the transport's public face and its loop; the loop's state
lives in two rooms, each with its own guarantees:

* ``ipc.request_table``: the requests outstanding and their deadlines;
  every request gets exactly one ``Event`` (reply, timeout, or failure),
  late and bad replies are counted, ``raw_replies``;
* ``ipc.bookie_connections``: one DEALER per bookie: reconnects, heartbeats
  and silent peers, socket identities, CURVE and refused handshakes.

Guarantees and limits held here:

* at most ``inflight_per_bookie_max`` requests per bookie are outstanding;
  a slot is freed when the request's event is *delivered* (callback
  returned / ``next_events`` returned it), so the event queue is bounded by
  the same limit; ``send`` beyond it raises ``TooManyRequestsError``;
* ``close`` ends every outstanding request with ``BookieUnavailableError``
  (delivered to the callback, or left for ``next_events``); a callback that
  raises stops the transport from accepting work (counted,
  ``callback_failures``) rather than losing events silently.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable

import zmq

from appliance.protocol.errors import (
    BookieUnavailableError,
    ClientClosedError,
    TooManyRequestsError,
)
from ipc.bookie_connections import BookieConnection, BookieConnections
from ipc.curve import KeyPair
from ipc.frames import DEFAULT_LIMITS, WireLimits
from ipc.request_table import Event, RequestTable
from ipc.requests import Request, encode_request
from ipc.wake import WakePipe
from ipc.zmq_frames import recv_frames

__all__ = ["Event", "Transport"]

log = logging.getLogger(__name__)


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
        self._wakeup = WakePipe()
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
        self._io.add(bookie_id, endpoint, server_key)

    def remove_bookie(self, bookie_id: str) -> None:
        """Disconnect; its outstanding requests fail with BookieUnavailableError."""
        with self._cond:
            self._check_open()
            if self._endpoints.pop(bookie_id, None) is None:
                return
            if not self._on_owner():
                self._post(("remove", bookie_id))
                return
        self._io.remove(bookie_id)

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
        self._io.send(bookie_id, rid, int(request.OP), deadline_s, frames)
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
            if not self._closing:
                self._wakeup.wake()

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
        self._wakeup.close()
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
            self._wakeup.wake()

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
    """Runs on the I/O thread: waits on the sockets and the wake-up pipe,
    runs the outbox, drains replies into the request table, expires
    deadlines and delivers the events.  The state is in its two parts:
    ``requests`` (``RequestTable``) and ``connections``
    (``BookieConnections``); hot paths call their bound methods directly.

    The wait is one ``epoll`` over plain descriptors: the wake-up pipe and
    each socket's and monitor's ``ZMQ_FD``; no ZeroMQ call is made while
    waiting, and a wake-up looks only at the sockets whose descriptor
    fired.  ``ZMQ_FD`` is edge-triggered (any send or receive on the socket
    may consume the signal of a reply that came meanwhile), so every socket
    used since the loop last looked (``touched``: a send, a new socket, a
    drain cut short at ``drain_messages_max``) is drained until empty before
    the loop waits again: no reply is left unseen behind a quiet descriptor."""

    def __init__(self, t: Transport):
        self.t = t
        self.epoll = select.epoll()
        self.wake_fd = t._wakeup.fd
        self.epoll.register(self.wake_fd, select.EPOLLIN)
        self._by_fd: dict[int, tuple[BookieConnection, bool]] = {}  # fd -> (conn, monitor?)
        self._touched: set[BookieConnection] = set()  # sockets to drain before waiting
        self._monitors: set[BookieConnection] = set()  # monitors whose descriptor fired
        self.requests = RequestTable(t)
        self.connections = BookieConnections(t, self, self.requests.fail_pending)
        self.requests.use_connections(self.connections, self._touched)
        self.conns = self.connections.conns  # bookie id -> BookieConnection
        # bound once: the owner thread's calls and every reply go straight in
        self.send = self.requests.send
        self.add = self.connections.add
        self.remove = self.connections.remove
        self._on_reply = self.requests.on_reply

    # -- the descriptors waited on (BookieConnections opens and closes sockets) --
    def watch(self, conn: BookieConnection) -> None:
        """Wait on ``conn``'s socket and monitor from now on."""
        conn.fds = (conn.sock.getsockopt(zmq.FD), conn.monitor.getsockopt(zmq.FD))
        for fd, is_monitor in zip(conn.fds, (False, True), strict=True):
            self._by_fd[fd] = (conn, is_monitor)
            self.epoll.register(fd, select.EPOLLIN)
        self._touched.add(conn)  # a new socket: look at it before the first wait
        self._monitors.add(conn)

    def unwatch(self, conn: BookieConnection) -> None:
        """Before ``conn``'s sockets close: stop waiting on them."""
        for fd in conn.fds:
            self._by_fd.pop(fd, None)
            self.epoll.unregister(fd)
        conn.fds = ()
        self._touched.discard(conn)
        self._monitors.discard(conn)

    def run(self) -> None:
        try:
            while not self._step():
                pass
        finally:
            self.finish()

    def finish(self) -> None:
        """Close every socket; what was outstanding fails (delivered)."""
        for conn in list(self.conns.values()):
            self.connections.close_conn(conn)
        requests = self.requests
        requests.fail_pending(None, BookieUnavailableError.code)
        if requests.events:
            events, requests.events = requests.events, []
            self.t._deliver(events)
        self.epoll.close()

    def step(self, timeout_ms: int) -> None:
        """One wait and its work, on the owner thread (no I/O thread); events
        emitted while delivering (a send that failed at once) are delivered
        too, so the owner never waits on work already done."""
        self._step(timeout_ms)
        requests = self.requests
        for _ in range(64):  # bounded: each round is a reaction to the last
            if not requests.events:
                break
            events, requests.events = requests.events, []
            self.t._deliver(events)

    def _step(self, timeout_ms: int | None = None) -> bool:
        requests = self.requests
        if self._touched:  # used since the last look: their descriptors may be quiet
            self._look()
        wait_ms = requests.poll_timeout_ms()
        if timeout_ms is not None:
            wait_ms = min(wait_ms, timeout_ms)
        if requests.events or self._touched or self._monitors:
            wait_ms = 0  # work already here (failed sends, replies, a drain cut short)
        woken = False
        by_fd = self._by_fd
        for fd, _ in self.epoll.poll(wait_ms / 1000.0):
            if fd == self.wake_fd:
                woken = True
                continue
            owner = by_fd.get(fd)
            if owner is not None:
                (self._monitors if owner[1] else self._touched).add(owner[0])
        if woken and self._take_outbox():
            return True
        if self._monitors:
            monitors = list(self._monitors)
            self._monitors.clear()
            for conn in monitors:
                self.connections.on_monitor(conn)
        if self._touched:
            self._look()
        requests.expire()
        if requests.events:
            events, requests.events = requests.events, []
            self.t._deliver(events)
        return False

    def _look(self) -> None:
        """Drain every socket in ``_touched``; one with more than
        ``drain_messages_max`` replies waiting stays in it (looked at
        again before any wait)."""
        touched = self._touched
        conns = list(touched)
        touched.clear()
        for conn in conns:
            if conn.sock is not None and not self._drain(conn):
                touched.add(conn)

    def _take_outbox(self) -> bool:
        """Run queued work; True when asked to close."""
        self.t._wakeup.drain()
        with self.t._cond:
            items, self.t._outbox = self.t._outbox, []
        for item in items:
            kind = item[0]
            if kind == "send":
                self.send(*item[1:])
            elif kind == "add":
                self.add(*item[1:])
            elif kind == "remove":
                self.remove(item[1])
            elif kind == "close":
                return True
        return False

    def _drain(self, conn: BookieConnection) -> bool:
        """Receive what ``conn``'s socket holds; False if it still holds more
        (``drain_messages_max`` taken)."""
        sock = conn.sock
        for _ in range(self.t._drain_max):
            try:
                frames = recv_frames(sock)
            except zmq.Again:
                return True
            conn.heard_s = self.t.clock()
            self._on_reply(conn.bookie_id, frames)
            if conn.sock is not sock:  # replaced meanwhile: the new one is looked at
                return True
        return False
