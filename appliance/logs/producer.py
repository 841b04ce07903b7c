"""A producer: one of any number of writers of a log, through the log
service (``bk.log(name).producer()``; docs/LOGS.md, "The log service").

Guarantees:

* Every write that returned a DLSN is in the log exactly once, at that
  DLSN; this producer's records are in the log in the order it wrote them.
* Idempotence: the producer has an id (16 random bytes, or the one given)
  and numbers its writes 1, 2, 3, ...; the owning log server stores a
  sequence number once and answers a retry with the first copy's position
  (``appliance.protocol.log_service.DedupTable``).  A producer given its id
  continues after the last number the owner knows for it.
* Riding over failures: a write unanswered for
  ``LOG_PRODUCER_REQUEST_TIMEOUT_MS``, a redirect (the log moved) or an
  owner's crash makes the producer find the owner again (the lease in the
  metadata store, else the rendezvous hashing of the live servers) and
  resend every unacknowledged write with its number.  A write not stored
  within ``LOG_PRODUCER_DEADLINE_MS`` fails with
  ``LogServiceUnavailableError``, and so does every later one (errors are
  sticky, as for a log writer: open a new producer to go on).
* Back-pressure: at most ``LOG_PRODUCER_INFLIGHT_RECORDS_MAX`` records and
  ``LOG_PRODUCER_INFLIGHT_BYTES_MAX`` bytes unacknowledged; ``write_async``
  blocks while the window is full (up to the deadline).

The ZeroMQ DEALER socket is used by whichever thread holds ``_io_lock``:
a writer sends its record itself when the socket is free and no request
awaits its reply (else whoever receives that reply sends it), and a
blocking ``write`` receives the replies itself while it waits, so a write
costs no hand-off between threads.  Of several blocking writes waiting at
once, one polls the socket and the others wait on the producer's condition
(one poller only: reading the socket takes its descriptor's wake-up), and
a write whose reply another thread read wakes the poller through a pipe.
The process's one producer I/O thread (``appliance.logs.producer_loop``,
shared by all its producers: a process writing a thousand logs has one,
not a thousand) receives the rest (pipelined writes), connects,
redirects, and checks timeouts and deadlines every ``POLL_MS`` (its steps
are ``appliance.logs.producer_io``); every producer of the process shares
one ZeroMQ context.
"""

from __future__ import annotations

import collections
import os
import select
import threading
import time
from concurrent.futures import Future
from concurrent.futures import wait as futures_wait

import zmq

from appliance.client.add_future import PENDING, AddFuture, complete_futures, outcome
from appliance.client.calls import wait_result
from appliance.errors import (
    BKError,
    ClientClosedError,
    LogServiceUnavailableError,
)
from appliance.logs.producer_io import (
    BACKOFF_MIN_S,
    EVENTS,
    NOBLOCK,
    POLLIN,
    RCVMORE,
    ProducerIO,
)
from appliance.logs.producer_loop import POLL_MS, ProducerLoop
from appliance.meta.logservice import LogServiceRegistry
from appliance.protocol import limits
from appliance.protocol.log_entry import HEADER_BYTES, RECORD_OVERHEAD, TAG_BYTES
from appliance.protocol.log_service import (
    FORGOTTEN,
    PRODUCER_ID_BYTES,
    WRITTEN_KIND,
    decode_header,
    decode_written,
    encode_header,
    encode_write,
    runs_dlsns,
)
from appliance.protocol.logs import DLSN, dlsn_of
from ipc.wake import WakePipe

COPY_BYTES_MIN = 65_536  # a smaller request is copied into its message (zero-copy costs more)


def check_producer_id(producer_id) -> bytes:
    """16 bytes, or their 32 hex digits; None draws a random one."""
    if producer_id is None:
        return os.urandom(PRODUCER_ID_BYTES)
    if isinstance(producer_id, str):
        try:
            producer_id = bytes.fromhex(producer_id)
        except ValueError:
            raise ValueError(f"producer_id {producer_id!r} is not hex") from None
    if not isinstance(producer_id, bytes) or len(producer_id) != PRODUCER_ID_BYTES:
        raise ValueError(f"producer_id must be {PRODUCER_ID_BYTES} bytes (or "
                         f"{2 * PRODUCER_ID_BYTES} hex digits)")
    return producer_id


def wait_readable(fd: int, timeout_ms: int, other: int | None = None) -> bool:
    """Wait until ``fd`` or ``other`` is readable (or ``timeout_ms``);
    whether ``fd`` is.  A ZeroMQ socket's descriptor is edge-triggered: look
    at the socket (``zmq.EVENTS``) after every use before waiting here."""
    poll = select.poll()
    poll.register(fd, select.POLLIN)
    if other is not None:
        poll.register(other, select.POLLIN)
    return any(ready == fd for ready, _ in poll.poll(timeout_ms))


class _Write:
    __slots__ = ("seq", "payload", "future", "since")

    def __init__(self, seq: int, payload: bytes, future: Future, since: float):
        self.seq, self.payload, self.future, self.since = seq, payload, future, since


class Producer(ProducerIO):
    def __init__(self, client, name: str, producer_id=None, *, resume: bool | None = None,
                 clock=time.monotonic):
        self.name = name
        self.id = check_producer_id(producer_id)
        self._pid_hex = self.id.hex()
        self._name_bytes = name.encode()
        self._registry = LogServiceRegistry(client.logs.store)
        self.record_bytes_max = (client.payload_bytes_max - HEADER_BYTES - RECORD_OVERHEAD
                                 - TAG_BYTES)
        self._clock = clock
        # the condition's lock, taken directly on the per-record paths (no
        # Python-level Condition.__enter__ / __exit__ call per record)
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._pending: collections.OrderedDict[int, _Write] = collections.OrderedDict()
        self._inflight_bytes = 0
        self._unsent: collections.deque[_Write] = collections.deque()
        self._next_seq: int | None = None if (resume or (resume is None and producer_id)) \
            else 1
        self._error: BaseException | None = None
        self._closed = False
        self._numbered = False  # a write took a number (explicit seqs must increase from it)
        self._gen = 0
        self._endpoint: str | None = None
        self._server_sub = None  # hook-up (redo after the producer rewrite): server_watch
        self._sock = None
        self._last_reply = clock()
        self._last_refusal: str | None = None  # the last retry/held answer's message (I/O)
        self._backoff = BACKOFF_MIN_S
        self._hello_gen = -1
        self._awaiting = 0  # write requests of this generation awaiting their reply
        self._io_lock = threading.RLock()  # the socket: whichever thread holds this uses it
        self._kick = False  # a writer found _io_lock taken: its holder sends as it lets go
        self._sock_fd: int | None = None  # the socket's descriptor (readable: look at it)
        self._receivers = 0  # blocking writes receiving replies themselves (_await)
        self._leading = False  # one of them polls the socket (the others wait on _cond)
        self._polling = False  # the leader polls: a write settled by another thread wakes it
        self._waker: WakePipe | None = None  # made by the first leader
        self._nudged = False  # a wake byte is (or was) in _waker
        self._retired = False  # closed: the last leader closes _waker
        self._deferred: collections.deque[dict] = collections.deque()  # replies for the I/O thread
        self._resend_at: float | None = None  # paused after a refusal: resend everything then
        self._connect_at = 0.0  # no owner found: look again from then on
        self._finished = threading.Event()  # the I/O thread let go of this producer
        self.stats = {"requests": 0, "redirects": 0, "retries": 0, "timeouts": 0}
        # one context (one ZeroMQ I/O thread) for every producer of the process,
        # as for readers (appliance.logs.tail): not one each
        self._ctx = zmq.Context.instance()
        self._loop = ProducerLoop.get()
        self._loop.wake(self)

    # -- the user's side ------------------------------------------------------------------
    def write(self, payload, seq: int | None = None) -> DLSN | None:
        """Append one record; blocks until it is stored; its DLSN."""
        fut = self._queue(payload, seq)
        return self._await(fut, limits.LOG_PRODUCER_DEADLINE_MS / 1000 + 5, self._try_send())

    def write_async(self, payload, seq: int | None = None) -> Future:
        """Append one record; the future's result is its DLSN.  Blocks while
        the producer's window of unacknowledged records is full.

        ``seq``: this write's sequence number, for an application that
        numbers its own writes (a producer given its id, started again,
        writing again what it is not sure was stored): above the previous
        write's; one the log already holds for this producer is answered
        with its DLSN (None if it is older than the owner's last 4,096 for
        the producer) and not stored again.  Default: the previous + 1."""
        fut = self._queue(payload, seq)
        self._try_send()
        return fut

    def _queue(self, payload, seq: int | None) -> Future:
        """``write_async`` up to the send: the write numbered and queued."""
        if type(payload) is not bytes or len(payload) > self.record_bytes_max:
            payload = self._checked(payload)
        if seq is not None and (not isinstance(seq, int) or isinstance(seq, bool) or seq < 1):
            raise ValueError(f"seq must be an int >= 1, got {seq!r}")
        fut = AddFuture(self._cond)
        size = len(payload)
        now = self._clock()
        with self._lock:
            pending = self._pending
            if self._error is not None or self._closed or self._next_seq is None or \
                    pending and not self._has_room(size):
                now = self._wait_for_room(size, now)
            if seq is not None:
                if seq < self._next_seq and self._numbered:
                    raise ValueError(f"seq {seq} does not increase: the previous write "
                                     f"was {self._next_seq - 1}")
                self._next_seq = seq
            self._numbered = True
            seq = self._next_seq
            self._next_seq = seq + 1
            pending[seq] = write = _Write(seq, payload, fut, now)
            self._unsent.append(write)
            self._inflight_bytes += size
        return fut

    def _wait_for_room(self, size: int, start: float) -> float:
        """Holding ``_cond``: wait until the producer is usable, numbered
        and has room for ``size`` more bytes (raise otherwise); the time
        then."""
        deadline = start + limits.LOG_PRODUCER_DEADLINE_MS / 1000
        while True:
            self._check_usable()
            if self._next_seq is not None and self._has_room(size):
                return self._clock()
            remaining = deadline - self._clock()
            if remaining <= 0:
                raise LogServiceUnavailableError(
                    f"log {self.name!r}: no room in the producer's window within "
                    f"{limits.LOG_PRODUCER_DEADLINE_MS} ms")
            self._cond.wait(min(remaining, POLL_MS / 1000))

    def _has_room(self, size: int) -> bool:
        if not self._pending:
            return True
        return len(self._pending) < limits.LOG_PRODUCER_INFLIGHT_RECORDS_MAX and \
            self._inflight_bytes + size <= limits.LOG_PRODUCER_INFLIGHT_BYTES_MAX

    def _checked(self, payload) -> bytes:
        if not isinstance(payload, bytes | bytearray | memoryview):
            raise TypeError(f"payload must be bytes, got {type(payload).__name__}")
        payload = bytes(payload)
        if len(payload) > self.record_bytes_max:
            raise ValueError(f"record of {len(payload)} bytes exceeds the "
                             f"{self.record_bytes_max}-byte record limit")
        return payload

    def _check_usable(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closed:
            raise ClientClosedError(f"producer of log {self.name!r} is closed")

    def flush(self) -> None:
        """Wait until every write so far is stored (or raise the error)."""
        with self._cond:
            while self._pending and self._error is None:
                self._cond.wait(POLL_MS / 1000)
            if self._error is not None:
                raise self._error

    def close(self) -> None:
        """Flush, then stop; a second call does nothing.  Raises the
        producer's error if a write failed."""
        with self._cond:
            if self._closed:
                return
        try:
            self.flush()
        finally:
            with self._cond:
                self._closed = True
            self._wake()
            self._finished.wait(timeout=limits.LOG_PRODUCER_DEADLINE_MS / 1000)
            with self._cond:
                self._retired = True
                if not self._leading:
                    self._release_waker()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _wake(self) -> None:
        self._loop.wake(self)

    # -- the socket: whichever thread holds _io_lock --------------------------------------
    def _try_send(self) -> bool:
        """A writer's thread: send what is queued itself if the socket is
        free and ready (no hand-off to the I/O thread); if another thread
        holds it, that one sends it as it lets go (``_kick``).  Whether
        this thread used the socket (then its last look found no reply)."""
        if self._awaiting >= limits.LOG_PRODUCER_REQUESTS_INFLIGHT_MAX:
            return False  # the reply that frees room sends it (whoever receives it)
        self._kick = True  # before trying: a holder that lets go after this sees it
        if not self._io_lock.acquire(blocking=False):
            return False
        self._kick = False
        ready = self._sock is not None and self._next_seq is not None
        if ready:
            self._pump(defer=True)
        self._let_go()
        if not ready:
            self._wake()
        return ready

    def _let_go(self) -> None:
        """Release ``_io_lock``; pump again for a writer that found it taken
        meanwhile (unless someone else holds it now: they will)."""
        while True:
            self._io_lock.release()
            if not self._kick or not self._io_lock.acquire(blocking=False):
                return
            self._kick = False
            if self._sock is not None and self._next_seq is not None:
                self._pump(defer=True)

    def _await(self, fut: Future, timeout_s: float, looked: bool = False):
        """A blocking write's wait.  One waiting thread at a time (the
        leader) receives the replies itself while the socket is ready (no
        hand-off from the I/O thread); the others wait on ``_cond``, which
        every settled write and the leader's leaving notify.  One only,
        because reading the socket consumes its descriptor's wake-up: a
        second thread polling it would sleep on while the first took the
        reply it waited for.  ``looked``: this thread has just used the
        socket, its last look finding no reply: it waits for the
        descriptor at once."""
        deadline = self._clock() + timeout_s
        with self._cond:
            self._receivers += 1
            lead = not self._leading
            self._leading = True
        try:
            while not lead:
                with self._cond:
                    remaining = deadline - self._clock()
                    if fut._state != PENDING or remaining <= 0:
                        break
                    lead = not self._leading
                    if lead:
                        self._leading = True
                    else:
                        self._cond.wait(min(remaining, POLL_MS / 1000))
                looked = False
            if lead:
                self._lead(fut, deadline, looked)
        finally:
            with self._cond:
                self._receivers -= 1
                if lead:
                    self._leading = False
                    if self._retired:
                        self._release_waker()
                    if self._receivers:
                        self._cond.notify_all()  # another waiter leads now
                wake = not self._receivers and bool(self._pending)
            if wake:
                self._wake()  # the I/O thread receives again
        done = outcome(fut)  # no lock: settled futures are only read
        if done is not None and done[1] is None:
            return done[0]
        return wait_result(fut, 0, f"write to log {self.name!r}")

    def _lead(self, fut: Future, deadline: float, looked: bool) -> None:
        """``_await``'s leader: receive until ``fut`` is settled."""
        fd = self._sock_fd if looked else None
        if fd is not None:
            self._poll_socket(fut, fd)
        while fut._state == PENDING and self._clock() < deadline:
            self._io_lock.acquire()
            fd = self._sock_fd if self._sock is not None else None
            if fd is not None:
                self._pump(defer=True)
            self._let_go()
            if fut._state != PENDING:
                return
            if fd is None:
                futures_wait([fut], POLL_MS / 1000)
            else:
                self._poll_socket(fut, fd)

    def _poll_socket(self, fut: Future, fd: int) -> None:
        """The leader: wait until the socket's descriptor is readable, or
        another thread settled ``fut`` (it read the reply: ``_nudge``), or
        ``POLL_MS``."""
        waker = self._waker
        if waker is None:
            waker = self._waker = WakePipe()
        self._polling = True  # before the look at fut: a settle after it nudges
        try:
            if fut._state == PENDING:
                wait_readable(fd, POLL_MS, waker.fd)
        finally:
            self._polling = False
        if self._nudged:
            self._nudged = False
            waker.drain()

    def _nudge(self) -> None:
        """After settling writes: wake a leader polling the socket (its
        write may be one of them, its reply read by this thread)."""
        waker = self._waker
        if self._polling and waker is not None:
            self._nudged = True
            waker.wake()

    def _release_waker(self) -> None:
        """Holding ``_cond``, no leader: close the leader's pipe (closed
        producers only; a later leader makes another and closes it)."""
        if self._waker is not None:
            self._waker.close()
            self._waker = None

    def _pump(self, defer: bool) -> None:
        """Holding ``_io_lock``: send what is queued and receive what
        arrived until neither does anything.  Ends with a receive attempt
        that found nothing (``_receive`` reads until then), so the socket's
        edge-triggered descriptor is re-armed before anyone waits on it.
        ``defer``: replies other than ``written`` are left to the I/O thread
        (they may close the socket).  A writer that queues meanwhile sends
        through ``_kick``, so ``_unsent`` is read here without the lock."""
        while True:
            if self._resend_at is not None:
                pass  # paused after a refusal: nothing leaves until the resend
            elif self._next_seq is None:
                self._send_hello()
            elif self._unsent:
                self._send_unsent()
            if not self._receive(defer) or self._sock is None or \
                    not (self._unsent or self._next_seq is None):
                return

    def _send_hello(self) -> None:
        if self._hello_gen == self._gen:
            return
        self._hello_gen = self._gen
        self._sock.send(encode_header({"op": "hello", "log": self.name, "pid": self._pid_hex,
                                       "gen": self._gen}))

    def _send_unsent(self) -> None:
        while self._awaiting < limits.LOG_PRODUCER_REQUESTS_INFLIGHT_MAX:
            with self._cond:
                unsent, pending = self._unsent, self._pending
                if not unsent:
                    return
                batch, size, first = [], 0, 0
                records_max = limits.LOG_PRODUCER_BATCH_RECORDS_MAX
                while unsent and len(batch) < records_max:
                    write = unsent[0]
                    n = len(write.payload)
                    if batch and size + n > limits.LOG_PRODUCER_BATCH_BYTES_MAX:
                        break
                    unsent.popleft()
                    if write.seq in pending:
                        first = first or write.seq
                        batch.append(write.payload)
                        size += n
                gen = self._gen
                oldest = next(iter(pending), None)
            if not batch:
                continue
            if not self._awaiting:  # the request timeout counts from here, not from
                self._last_reply = self._clock()  # the last reply before an idle spell
            self._sock.send(encode_write(self._name_bytes, self.id, gen, first, oldest, batch),
                            copy=size < COPY_BYTES_MIN)
            self.stats["requests"] += 1
            self._awaiting += 1

    def _receive(self, defer: bool) -> bool:
        """Holding ``_io_lock``: handle every reply that arrived; whether
        there was one."""
        got = False
        sock = self._sock
        while sock.getsockopt(EVENTS) & POLLIN:  # no exception per empty read
            head = sock.recv(NOBLOCK)
            while sock.getsockopt(RCVMORE):  # a reply is one frame: drop any more
                sock.recv(NOBLOCK)
            got = True
            try:
                if head[0] == WRITTEN_KIND:
                    gen, first, runs = decode_written(head)
                    doc = None
                else:
                    doc = decode_header(head)
                    gen, first, runs = doc.get("gen"), doc.get("seq"), doc.get("runs")
                    if doc["op"] == "written" and (runs_dlsns(runs) is None or
                                                   not isinstance(first, int)):
                        continue  # malformed (runs_dlsns raises for bad runs)
            except (BKError, IndexError):
                continue
            self._last_reply = self._clock()
            if doc is None or doc["op"] == "written":
                if gen == self._gen and self._awaiting:
                    self._awaiting -= 1
                self._settle(first, runs)
            elif defer:
                self._deferred.append(doc)
                self._wake()
            else:
                self._handle(doc)
                if self._sock is None:
                    break
        return got

    def _settle(self, first: int, runs) -> None:
        """A ``written`` reply: the writes from ``first`` on are stored at
        ``runs`` ((seg, entry, first slot, n); seg None or ``FORGOTTEN``:
        position forgotten)."""
        done = []
        pending, freed = self._pending, 0
        with self._lock:
            for seg, entry, slot, n in runs:
                forgotten = seg is None or seg == FORGOTTEN
                for k in range(n):
                    write = pending.pop(first, None)
                    first += 1
                    if write is not None:
                        freed += len(write.payload)
                        done.append((None if forgotten else dlsn_of(seg, entry, slot + k),
                                     write.future))
            self._inflight_bytes -= freed
        self._backoff = BACKOFF_MIN_S
        complete_futures(self._cond, done, None)  # notifies the room's waiters too
        self._nudge()
