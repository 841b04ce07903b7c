"""The bookie side of the wire: a ROUTER socket, a poll loop, deferred replies.

``FrameServer`` owns one ROUTER socket and runs a single-threaded loop that

* drains up to ``drain_messages_max`` messages per wakeup, decodes each and
  hands it to the handler (so one storage group commit naturally covers
  every add of a wakeup: the handler's ``after_drain`` hook is called once
  per drained batch);
* polls extra file descriptors beside the socket (``watch_fd``: e.g. the
  storage's ``durable_fd``) and calls back when one is readable, so the
  handler can *defer* a reply (an add is acknowledged only once durable)
  and send it later with ``send_reply``;
* runs timers (``call_later_ms``) for long-poll expiry; deadlines come from the
  injected ``clock`` (``time.monotonic`` by default) and only here.

Faults it survives: short, garbage, unknown-version or oversize messages get
an error reply to their return address plus a counter and a rate-limited log
line, and the loop keeps serving; a reply to a client that went away or
whose queue is full is dropped and counted, never blocks the loop; a handler
that raises on one request answers that request with ``BookieIOError`` (and
logs the traceback).  Not survived, on purpose: an exception from a
``watch_fd`` or timer callback stops ``serve`` (fail-stop: that is the
bookie's own machinery, e.g. storage, and the supervisor restarts it; no
acknowledgement is sent for anything not yet durable).

Wire forms (``codec``): the bookie protocol (``BOOKIE_WIRE``: ``ipc.requests``
and ``ipc.replies``) unless another ``WireCodec`` is given; the log
service's servers give theirs, so every ROUTER of the code base is this one
loop with one set of guards (bounded drains and queues, bad messages
answered, CURVE).

CURVE (``ipc.curve``): given ``curve_keys`` and a tcp endpoint, the socket
is a CURVE server (traffic encrypted, clients authenticated) and the loop
also answers ZAP requests: only clients whose public keys are in
``authorized_keys`` connect; refusals are logged once per peer per minute.
An ipc endpoint ignores ``curve_keys`` (filesystem permissions guard it).

Threading: everything except ``stop`` must be called on the loop's thread
(the handler runs there).  ``stop`` is thread- and signal-safe.  Buffers in
a reply must not be mutated after ``send_reply`` (frames over 64 KiB are
sent zero-copy).
"""

from __future__ import annotations

import grp
import heapq
import itertools
import logging
import os
import stat
import time
from collections.abc import Callable
from typing import Protocol

import zmq

from appliance.protocol import limits as bounds  # `limits` names the WireLimits here
from appliance.protocol.errors import BadRequestError, BKError, BookieIOError, TooManyRequestsError
from appliance.protocol.invariant import invariant
from ipc.curve import KeyDirectory, KeyPair, ZapHandler, configure_server, is_tcp
from ipc.frames import DEFAULT_LIMITS, WireLimits, salvage_ids
from ipc.replies import ErrorReply, Reply, encode_reply, error_reply
from ipc.requests import Request, decode_request
from ipc.wake import WakePipe
from ipc.zmq_frames import recv_frames, send_frames

log = logging.getLogger(__name__)
_ZERO_COPY_BYTES_MIN = 64 * 1024


class RequestHandler(Protocol):
    """What the loop calls.  ``handle`` returns a reply to send now, or None
    when it will call ``server.send_reply(peer, reply)`` later.  An optional
    ``after_drain()`` runs once after each batch of drained messages, and an
    optional ``after_step()`` at the end of every loop turn (after the
    drain, fd callbacks and timers)."""

    def handle(self, peer: bytes, request: Request) -> Reply | None: ...


class WireCodec(Protocol):
    """How a server's messages are read and its replies written.  ``decode``
    turns the frames after the peer's identity into a request (raising
    ``BadRequestError`` for a malformed one); ``encode`` a reply into its
    frames; ``rejection`` is the reply to a malformed message, ``failure``
    the reply to a request whose handling raised."""

    def decode(self, frames: list, limits: WireLimits): ...

    def encode(self, reply, limits: WireLimits) -> list: ...

    def rejection(self, frames: list, exc: BadRequestError): ...

    def failure(self, request, exc: Exception, counters: dict | None): ...


class Timer:
    """A pending ``call_later_ms``; ``cancel()`` is idempotent."""

    __slots__ = ("deadline_s", "callback", "cancelled", "_server")

    def __init__(self, deadline_s: float, callback: Callable[[], None], server: FrameServer):
        self.deadline_s = deadline_s
        self.callback = callback
        self.cancelled = False
        self._server = server

    def cancel(self) -> None:
        if not self.cancelled:
            self.cancelled = True
            self._server._timers_live -= 1


def restrict_socket_file(path: str, group: str = "") -> None:
    """Who may connect to an ipc socket: its owner (0600), or with ``group``
    also that group's members (0660, the file's group set to it).  A group
    that does not exist, or that this account may not give files to, is a
    ``BookieIOError`` naming it (the socket is then left owner-only)."""
    os.chmod(path, 0o600)
    if not group:
        return
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        raise BookieIOError(f"server.socket_group {group!r} is not a group on this host "
                            f"(getent group {group})") from None
    try:
        os.chown(path, -1, gid)
    except OSError as exc:
        raise BookieIOError(f"cannot give {path} to group {group!r}: {exc} (this account "
                            f"must be a member of it)") from exc
    os.chmod(path, 0o660)


def failure_reply(request, exc: Exception, counters: dict | None) -> ErrorReply:
    """The answer to a request whose handling raised ``exc``: its own code
    for a ``BKError``; anything else is a bug or an I/O failure, counted in
    ``counters["handler_failures"]``, logged with its traceback and answered
    as ``BookieIOError``.  (The handler uses it for requests it answers
    outside the dispatch, e.g. adds held until the drain ends.)"""
    if isinstance(exc, BKError):
        return error_reply(request, exc)
    if counters is not None:
        counters["handler_failures"] = counters.get("handler_failures", 0) + 1
    log.error("handler failed on %s", type(request).__name__, exc_info=exc)
    return error_reply(request, BookieIOError(f"bookie failed: {exc}"))


class BookieWire:
    """The bookie protocol's codec (``ipc/PROTOCOL.md``)."""

    @staticmethod
    def decode(frames: list, limits: WireLimits) -> Request:
        return decode_request(frames, limits)

    @staticmethod
    def encode(reply: Reply, limits: WireLimits) -> list:
        return encode_reply(reply, limits)

    @staticmethod
    def rejection(frames: list, exc: BadRequestError) -> ErrorReply:
        op, request_id = salvage_ids(frames[0]) if frames else (0, 0)
        return ErrorReply(op, request_id, exc.code, message=str(exc))

    @staticmethod
    def failure(request, exc: Exception, counters: dict | None) -> ErrorReply:
        return failure_reply(request, exc, counters)


BOOKIE_WIRE = BookieWire()


class FrameServer:
    """ROUTER socket + poll loop.  ``endpoint`` is the bound address (a
    ``tcp://host:0`` request reports the real port)."""

    def __init__(self, endpoint: str, handler: RequestHandler, *,
                 limits: WireLimits = DEFAULT_LIMITS,
                 drain_messages_max: int = bounds.SERVER_DRAIN_MESSAGES_MAX,
                 timers_max: int = 65536, fds_max: int = 64,
                 queue_messages_max: int = bounds.SERVER_QUEUE_MESSAGES_MAX,
                 poll_ms_max: int = 1000, clock: Callable[[], float] = time.monotonic,
                 context: zmq.Context | None = None, socket_group: str = "",
                 curve_keys: KeyPair | None = None, authorized_keys: KeyDirectory | None = None,
                 codec: WireCodec = BOOKIE_WIRE):
        invariant(drain_messages_max >= 1, "drain_messages_max must be >= 1")
        self.handler = handler
        self.codec = codec
        self.limits = limits
        self.drain_messages_max = drain_messages_max
        self.timers_max = timers_max
        self.fds_max = fds_max
        self.poll_ms_max = poll_ms_max
        self.clock = clock
        self.counters = dict.fromkeys(
            ("requests", "replies", "bad_messages", "handler_failures", "replies_dropped",
             "timers_fired", "wakeups"), 0)
        self._after_drain = getattr(handler, "after_drain", None)
        self._after_step = getattr(handler, "after_step", None)
        self._closed = False
        self._own_context = context is None
        self._ctx = context or zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._configure(queue_messages_max)
        self._zap: ZapHandler | None = None
        try:
            self._secure(endpoint, curve_keys, authorized_keys)
            self._sock.bind(endpoint)
        except zmq.ZMQError as exc:
            self.close()
            raise BookieIOError(f"cannot bind {endpoint}: {exc}") from exc
        except BKError:
            self.close()
            raise
        self.curve_public_key = curve_keys.public.decode() if self._zap is not None else None
        self.endpoint: str = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        path = self.endpoint[len("ipc://"):] if self.endpoint.startswith("ipc://") else ""
        if path and not path.startswith("@"):  # a socket file: this account (and group) only
            try:
                restrict_socket_file(path, socket_group)
            except BookieIOError:
                self.close()
                raise
        self._wakeup = WakePipe()
        self._poller = zmq.Poller()
        self._poller.register(self._sock, zmq.POLLIN)
        self._poller.register(self._wakeup.fd, zmq.POLLIN)
        if self._zap is not None:
            self._poller.register(self._zap.socket, zmq.POLLIN)
        self._fds: dict[int, Callable[[], None]] = {}
        self._timers: list[tuple[float, int, Timer]] = []
        self._timers_live = 0
        self._seq = itertools.count()
        self._stopping = False
        self._bad_logged_at = float("-inf")

    def _configure(self, queue_messages_max: int) -> None:
        s = self._sock
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.ROUTER_MANDATORY, 1)  # unroutable replies raise: we count them
        s.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a reconnecting identity takes over its route
        s.setsockopt(zmq.SNDHWM, queue_messages_max)
        s.setsockopt(zmq.RCVHWM, queue_messages_max)
        # A frame larger than any well-formed one makes ZeroMQ drop the peer
        # before buffering it: memory stays bounded whatever a peer sends.
        s.setsockopt(zmq.MAXMSGSIZE, self.limits.frame_bytes_max + 4096)

    def _secure(self, endpoint: str, keys: KeyPair | None,
                authorized: KeyDirectory | None) -> None:
        """CURVE on a tcp endpoint: server keys, and our ZAP handler first."""
        if keys is None or not is_tcp(endpoint):
            return
        invariant(authorized is not None, "curve_keys need authorized_keys")
        self._zap = ZapHandler(self._ctx, authorized, keys.public, clock=self.clock)
        configure_server(self._sock, keys)

    # -- registration (loop thread) -----------------------------------------
    def watch_fd(self, fd: int, callback: Callable[[], None]) -> None:
        """Call ``callback()`` whenever ``fd`` is readable (level-triggered)."""
        if fd not in self._fds and len(self._fds) >= self.fds_max:
            raise TooManyRequestsError(f"more than fds_max ({self.fds_max}) watched fds")
        self._fds[fd] = callback
        self._poller.register(fd, zmq.POLLIN)

    def unwatch_fd(self, fd: int) -> None:
        if self._fds.pop(fd, None) is not None:
            self._poller.unregister(fd)

    def call_later_ms(self, delay_ms: float, callback: Callable[[], None]) -> Timer:
        """Run ``callback()`` on the loop after ``delay_ms``; bounded by timers_max."""
        if self._timers_live >= self.timers_max:
            raise TooManyRequestsError(f"more than timers_max ({self.timers_max}) timers")
        timer = Timer(self.clock() + max(0.0, delay_ms) / 1000.0, callback, self)
        heapq.heappush(self._timers, (timer.deadline_s, next(self._seq), timer))
        self._timers_live += 1
        return timer

    # -- replies --------------------------------------------------------------
    def send_reply(self, peer: bytes, reply: Reply) -> bool:
        """Send ``reply`` to ``peer`` without blocking; False if it was dropped
        (the peer is gone or its queue is full: it will time out)."""
        frames = self.codec.encode(reply, self.limits)
        # Zero-copy only pays for big frames; small ones are cheaper to copy.
        copy = all(len(f) < _ZERO_COPY_BYTES_MIN for f in frames)
        try:
            send_frames(self._sock, [peer, *frames], copy)
        except (zmq.Again, zmq.ZMQError):
            self.counters["replies_dropped"] += 1
            return False
        self.counters["replies"] += 1
        return True

    # -- the loop -------------------------------------------------------------
    def serve(self) -> None:
        """Run until ``stop()``.  Returns normally on stop."""
        invariant(not self._closed, "serve() on a closed FrameServer")
        while not self._stopping:
            ready = dict(self._poller.poll(self._poll_timeout_ms()))
            self.counters["wakeups"] += 1
            if self._wakeup.fd in ready:
                self._wakeup.drain()
            if self._sock in ready:
                self._drain_socket()
            if self._zap is not None and self._zap.socket in ready:
                self._zap.handle_ready()
            for fd in [fd for fd in ready if isinstance(fd, int) and fd in self._fds]:
                callback = self._fds.get(fd)  # an earlier callback may have unwatched it
                if callback is not None:
                    callback()
            self._run_due_timers()
            if self._after_step is not None:
                self._after_step()

    def wake(self) -> None:
        """Make the loop run a turn now (its ``after_step`` included): the way
        another thread tells the loop's thread that it queued work for it.
        Safe from any thread; nothing once closed."""
        wakeup = getattr(self, "_wakeup", None)
        if wakeup is not None:
            wakeup.wake()

    def stop(self) -> None:
        """Ask ``serve`` to return; safe from any thread or a signal handler."""
        self._stopping = True
        wakeup = getattr(self, "_wakeup", None)  # none if the constructor failed first
        if wakeup is not None:
            wakeup.wake()  # nothing once closed

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._sock.close(linger=0)
        if getattr(self, "_zap", None) is not None:
            self._zap.close()
        self._remove_socket_file()
        wakeup = getattr(self, "_wakeup", None)
        if wakeup is not None:
            wakeup.close()
        if self._own_context:
            self._ctx.term()

    def _remove_socket_file(self) -> None:
        """libzmq leaves an ipc:// socket file behind; remove ours, so a clean
        stop leaves nothing in the run directory (only a socket file, never
        anything else that happens to sit at that path)."""
        endpoint = getattr(self, "endpoint", "")
        if not endpoint.startswith("ipc://"):
            return
        path = endpoint[len("ipc://"):]
        try:
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                os.unlink(path)
        except OSError:
            pass  # already gone, or not ours to remove

    def __enter__(self) -> FrameServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _poll_timeout_ms(self) -> int:
        while self._timers and self._timers[0][2].cancelled:
            heapq.heappop(self._timers)
        if not self._timers:
            return self.poll_ms_max
        wait_ms = (self._timers[0][0] - self.clock()) * 1000.0
        return max(0, min(self.poll_ms_max, int(wait_ms) + 1))

    def _drain_socket(self) -> None:
        for _ in range(self.drain_messages_max):
            try:
                msg = recv_frames(self._sock)
            except zmq.Again:
                break
            self._dispatch(msg)
        if self._after_drain is not None:
            self._after_drain()

    def _dispatch(self, msg: list) -> None:
        peer = msg[0].bytes
        try:
            request = self.codec.decode(msg[1:], self.limits)
        except BadRequestError as exc:
            self._reject(peer, msg[1:], exc)
            return
        self.counters["requests"] += 1
        try:
            reply = self.handler.handle(peer, request)
        except Exception as exc:  # noqa: BLE001 - every failure is answered
            reply = self.codec.failure(request, exc, self.counters)
        if reply is not None:
            self.send_reply(peer, reply)

    def _reject(self, peer: bytes, frames: list, exc: BadRequestError) -> None:
        self.counters["bad_messages"] += 1
        now = self.clock()
        if now - self._bad_logged_at >= 1.0:  # at most one line a second
            self._bad_logged_at = now
            log.warning("bad message (%d so far): %s", self.counters["bad_messages"], exc)
        self.send_reply(peer, self.codec.rejection(frames, exc))

    def _run_due_timers(self) -> None:
        now = self.clock()
        while self._timers and self._timers[0][0] <= now:
            _, _, timer = heapq.heappop(self._timers)
            if timer.cancelled:
                continue
            timer.cancelled = True
            self._timers_live -= 1
            self.counters["timers_fired"] += 1
            timer.callback()
