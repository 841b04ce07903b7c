"""The I/O thread's side of a producer (``appliance.logs.producer``): the
steps ``appliance.logs.producer_loop`` runs for it.

Guarantees (for ``Producer``, which this class is a base of):

* Its socket is created and closed here only, holding ``_io_lock``, on the
  loop's thread; the loop unwatches it before it closes.
* A connection finds the owner (the lease in the metadata store, else the
  rendezvous hashing of the live servers) and resends every unacknowledged
  write with its number (a new generation: replies to older requests do
  not count).
* A request unanswered for ``LOG_PRODUCER_REQUEST_TIMEOUT_MS`` drops the
  socket (the owner is found again); a write not stored within
  ``LOG_PRODUCER_DEADLINE_MS`` fails the producer, and so does a refusal
  that cannot be retried (``full``, ``bad``, a ``gap`` below the oldest
  unacknowledged write): every pending write gets the error, and it is
  sticky.  ``not_owner`` follows the redirect; ``retry``, ``held`` and other
  gaps resend from the oldest after a pause (longer for ``held``).
"""

from __future__ import annotations

import collections
import logging
import time

import zmq

from appliance.client.add_future import complete_futures
from appliance.errors import (
    BadRequestError,
    BKError,
    LogServiceUnavailableError,
    TooManyProducersError,
)
from appliance.logs.server_watch import ServerWatch
from appliance.protocol import limits
from appliance.protocol.log_service import BAD, HELD, NOT_OWNER, owner_of

log = logging.getLogger("appliance.logs")

BACKOFF_MIN_S, BACKOFF_MAX_S = 0.02, 0.5  # between tries while the log has no owner
# plain ints: the enum forms cost a microsecond per look at the socket
EVENTS, POLLIN, NOBLOCK = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.NOBLOCK)
RCVMORE = int(zmq.RCVMORE)


class ProducerIO:
    """The loop's steps for one producer (see the module docstring); the
    state is ``Producer``'s."""

    def _turn(self, tick: bool = False) -> bool:
        """One step of the process's producer I/O thread; True once this
        producer is done with it (closed with nothing pending, or failed).
        ``tick``: the periodic visit (nothing woke this producer): only the
        timeout and the deadline are checked, and the socket only looked at
        (its replies wake the thread themselves), so a thousand idle or
        waiting producers cost little."""
        if self._error is not None or (self._closed and not self._pending):
            return True  # (no lock: only this thread finishes it, and it looks every turn)
        if self._sock is None and time.monotonic() < self._connect_at:
            self._check_deadline()  # backing off: no owner found a moment ago
            return False
        if tick and self._sock is not None and not self._deferred and self._resend_at is None:
            return self._tick()
        self._step()
        return False

    def _tick(self) -> bool:
        """``_turn`` at a tick, connected: the timeout and the deadline; a
        full step only if a reply is there (never missed: every use of the
        socket ends by looking at it, but it costs nothing to be sure)."""
        if not self._io_lock.acquire(blocking=False):
            self._check_deadline()
            return False  # a writer uses the socket: it receives what came
        try:
            # not a look while a blocking write receives: the look would take
            # the wake-up of the descriptor that write polls
            waiting = self._sock is not None and not self._receivers and \
                bool(self._sock.getsockopt(EVENTS) & POLLIN)
            if not waiting and self._sock is not None:
                self._check_timeout()
        finally:
            self._let_go()
        if waiting:
            self._step()
        else:
            self._check_deadline()
        return False

    def _fail_unexpected(self, exc: BaseException) -> None:
        self._fail(exc if isinstance(exc, BKError) else
                   LogServiceUnavailableError(f"log {self.name!r}: {exc}"))

    def _finish(self) -> None:
        """The I/O thread lets go of this producer: its socket is closed."""
        with self._io_lock:
            self._drop_socket()
        self._finished.set()

    def _watched_fd(self) -> int | None:
        """The descriptor the I/O thread polls for this producer: none while
        a blocking writer receives (it leaves the socket to it)."""
        return self._sock_fd if self._sock is not None and not self._receivers else None

    def _step(self) -> None:
        self._io_lock.acquire()
        try:
            if self._resend_at is not None and time.monotonic() >= self._resend_at:
                self._resend_at = None
                self._restart_sends()
            connected = self._sock is not None or self._connect()
            if connected:
                while self._deferred:
                    self._handle(self._deferred.popleft())
                if self._sock is not None:
                    self._pump(defer=False)
                    self._check_timeout()
            self._check_deadline()
        finally:
            self._let_go()
        if not connected:  # try again after a pause
            self._connect_at = time.monotonic() + self._next_backoff()
            self._loop.call_at(self, self._connect_at)

    def _connect(self) -> bool:
        endpoint = self._endpoint or self._find_owner()
        if endpoint is None:
            return False
        self._endpoint = endpoint
        # hook-up (redo after the producer rewrite): the server's death ends the wait at once
        self._server_sub = ServerWatch.of(self._registry.store).subscribe(
            endpoint, lambda: self._loop.wake(self))
        self._sock = self._loop.mux_socket(self, endpoint)  # shared with the process's others
        if self._sock is not None:
            self._sock_fd = None  # the loop polls the shared socket and steps this producer
            self._restart_sends()
            return True
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.linger = 0
        self._sock.connect(endpoint)
        self._sock_fd = self._sock.getsockopt(zmq.FD)
        self._restart_sends()
        return True

    def _find_owner(self) -> str | None:
        """The lease holder's endpoint, else the live server the hashing names."""
        lease = self._registry.owner(self.name)
        if lease is not None:
            return lease["endpoint"]
        servers = self._registry.servers()
        target = owner_of(self.name, servers)
        return None if target is None else servers[target]["endpoint"]

    def _drop_socket(self, forget_endpoint: bool = True) -> None:
        """The I/O thread: close the socket (unwatched first)."""
        self._loop.unwatch(self)
        if self._server_sub is not None:  # hook-up (redo after the producer rewrite)
            self._server_sub.cancel()
            self._server_sub = None
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = self._sock_fd = None
        if forget_endpoint:
            self._endpoint = None

    def _restart_sends(self) -> None:
        """Everything unacknowledged is sent again (a new generation: error
        replies to older requests are ignored)."""
        with self._cond:
            self._gen += 1
            self._unsent = collections.deque(self._pending.values())
        self._awaiting = 0  # replies to older generations do not count
        self._last_reply = self._clock()

    def _next_backoff(self) -> float:
        backoff, self._backoff = self._backoff, min(self._backoff * 2, BACKOFF_MAX_S)
        return backoff

    def _handle(self, doc: dict) -> None:
        """The I/O thread, holding ``_io_lock``: a reply other than ``written``."""
        if doc["op"] == "hello" and doc.get("gen") == self._gen:
            with self._cond:
                self._next_seq = doc.get("next_seq") or 1
                self._cond.notify_all()
        elif doc["op"] == "error" and doc.get("gen") == self._gen:
            self._on_error(doc)

    def _on_error(self, doc: dict) -> None:
        code = doc.get("code")
        if code == NOT_OWNER:
            self.stats["redirects"] += 1
            log.info("log %s: moved to %s", self.name, doc.get("owner"))
            self._sock_close_for(doc.get("endpoint"))
        elif code == "gap" and doc.get("expected", 0) < self._oldest():
            self._fail(BadRequestError(f"log {self.name!r}: the owner expects sequence number "
                                       f"{doc.get('expected')}, below this producer's oldest "
                                       "unacknowledged write"))
        elif code == "full":
            self._fail(TooManyProducersError(doc.get("message", "too many producers")))
        elif code == BAD:
            self._fail(BadRequestError(doc.get("message", "bad request")))
        else:  # retry, held, gap: resend from the oldest after a pause
            self.stats["retries"] += 1
            self._last_refusal = doc.get("message") if isinstance(doc.get("message"), str) \
                else code
            self._resend_at = time.monotonic() + \
                self._next_backoff() * (4 if code == HELD else 1)
            self._loop.call_at(self, self._resend_at)  # nothing leaves until then

    def _oldest(self) -> int:
        """The oldest unacknowledged write's number (0 if none)."""
        with self._cond:
            return next(iter(self._pending), 0)

    def _sock_close_for(self, endpoint: str | None) -> None:
        """Leave this server; the next step connects to ``endpoint`` (or
        looks the owner up again)."""
        self._drop_socket()
        self._endpoint = endpoint
        self._hello_gen = -1

    def _check_timeout(self) -> None:
        # hook-up (redo after the producer rewrite): the server died or was replaced
        if self._server_sub is not None and self._server_sub.fired():
            log.info("log %s: the log server at %s is gone; finding the owner again",
                     self.name, self._endpoint)
            self._drop_socket()
            self._hello_gen = -1
            return
        if self._sock is None or \
                self._clock() - self._last_reply <= limits.LOG_PRODUCER_REQUEST_TIMEOUT_MS / 1000:
            return  # answered lately (the usual case: no lock taken)
        with self._cond:
            waiting = bool(self._pending) or self._next_seq is None
        if waiting:
            self.stats["timeouts"] += 1
            log.info("log %s: no answer from %s for %d ms; finding the owner again", self.name,
                     self._endpoint, limits.LOG_PRODUCER_REQUEST_TIMEOUT_MS)
            self._drop_socket()
            self._hello_gen = -1

    def _check_deadline(self) -> None:
        with self._cond:
            oldest = next(iter(self._pending.values()), None)
        if oldest is not None and \
                self._clock() - oldest.since > limits.LOG_PRODUCER_DEADLINE_MS / 1000:
            why = f"the last refusal: {self._last_refusal}" if self._last_refusal \
                else "no log server took it"
            self._fail(LogServiceUnavailableError(
                f"log {self.name!r}: write {oldest.seq} not stored within "
                f"{limits.LOG_PRODUCER_DEADLINE_MS} ms ({why})"))

    def _fail(self, exc: BaseException) -> None:
        with self._cond:
            if self._error is None:
                self._error = exc
            failed = list(self._pending.values())
            self._pending.clear()
            self._unsent.clear()
            self._inflight_bytes = 0
            self._cond.notify_all()
        complete_futures(self._cond, [(None, w.future) for w in failed], self._error)
        self._nudge()
