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
* Riding over failures, deadlines, redirects: the producer core's
  (``appliance.protocol.log_producer``).  A write not stored within
  ``LOG_PRODUCER_DEADLINE_MS`` fails with ``LogServiceUnavailableError``,
  and so does every later one (errors are sticky, as for a log writer:
  open a new producer to go on).
* Back-pressure: at most ``LOG_PRODUCER_INFLIGHT_RECORDS_MAX`` records and
  ``LOG_PRODUCER_INFLIGHT_BYTES_MAX`` bytes handed in and not yet settled;
  ``write_async`` blocks while that window is full (up to the deadline).

Threads: the writing threads validate a write, take room in the window,
hand it to the process's producer I/O thread (``ProducerLoop.submit``: no
socket is touched here) and, for ``write``, wait on its future.  That
thread alone drives ``_core`` and the sockets.  ``_room_records``,
``_room_bytes``, ``_error`` and ``_closing`` are guarded by ``_cond`` (the
writers take room, the I/O thread gives it back as writes settle); the
rest is set at construction and only read.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future

from appliance.client.add_future import AddFuture, complete_futures, outcome
from appliance.client.calls import wait_result
from appliance.curve import log_server_key
from appliance.errors import ClientClosedError, LogServiceUnavailableError
from appliance.logs.producer_loop import CLOSE, OPEN, POLL_MS, STATS, ProducerLoop
from appliance.meta.logservice import LogServiceRegistry
from appliance.protocol import limits
from appliance.protocol.log_entry import HEADER_BYTES, RECORD_OVERHEAD, TAG_BYTES
from appliance.protocol.log_producer import ProducerCore
from appliance.protocol.log_service import PRODUCER_ID_BYTES, owner_of
from appliance.protocol.logs import DLSN
from ipc.curve import is_tcp

WAIT_SLACK_S = 5  # a blocking write waits this much beyond the deadline (the core fails it)


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


class Producer:
    def __init__(self, client, name: str, producer_id=None, *, resume: bool | None = None,
                 clock=time.monotonic):
        self.name = name
        self.id = check_producer_id(producer_id)
        self._key = (name.encode(), self.id)
        self._registry = LogServiceRegistry(client.logs.store)
        self._curve = client.curve  # appliance.curve.ClientCurve or None (never changed)
        self.record_bytes_max = (client.payload_bytes_max - HEADER_BYTES - RECORD_OVERHEAD
                                 - TAG_BYTES)
        self._clock = clock
        self._cond = threading.Condition(threading.Lock())  # the futures' and the room's
        self._room_records = 0
        self._room_bytes = 0
        self._error: BaseException | None = None
        self._closing = False
        self._core = ProducerCore(name, self.id,
                                  resume=bool(resume or (resume is None and producer_id)))
        self._finished = threading.Event()  # the I/O thread let go of this producer
        self._loop = ProducerLoop.get()
        self._loop.submit((self, None, None, OPEN))

    # -- the user's side ------------------------------------------------------------------
    def write(self, payload, seq: int | None = None) -> DLSN | None:
        """Append one record; blocks until it is stored; its DLSN."""
        fut = self.write_async(payload, seq)
        done = outcome(fut)
        if done is not None and done[1] is None:
            return done[0]
        return wait_result(fut, limits.LOG_PRODUCER_DEADLINE_MS / 1000 + WAIT_SLACK_S,
                           f"write to log {self.name!r}")

    def write_async(self, payload, seq: int | None = None) -> Future:
        """Append one record; the future's result is its DLSN.  Blocks while
        the producer's window of unacknowledged records is full.

        ``seq``: this write's sequence number, for an application that
        numbers its own writes (a producer given its id, started again,
        writing again what it is not sure was stored): above the previous
        write's (else the future fails with ``ValueError``); one the log
        already holds for this producer is answered with its DLSN (None if
        it is older than the owner's last 4,096 for the producer) and not
        stored again.  Default: the previous + 1."""
        if type(payload) is not bytes or len(payload) > self.record_bytes_max:
            payload = self._checked(payload)
        if seq is not None and (not isinstance(seq, int) or isinstance(seq, bool) or seq < 1):
            raise ValueError(f"seq must be an int >= 1, got {seq!r}")
        size = len(payload)
        with self._cond:
            if self._error is not None or self._closing or self._room_records and (
                    self._room_records >= limits.LOG_PRODUCER_INFLIGHT_RECORDS_MAX or
                    self._room_bytes + size > limits.LOG_PRODUCER_INFLIGHT_BYTES_MAX):
                self._wait_for_room(size)
            self._room_records += 1
            self._room_bytes += size
        fut = AddFuture(self._cond)
        self._loop.submit((self, payload, fut, seq))
        return fut

    def _wait_for_room(self, size: int) -> None:
        """Holding ``_cond``: wait until the producer is usable and its
        window has room for ``size`` more bytes (raise otherwise)."""
        deadline = time.monotonic() + limits.LOG_PRODUCER_DEADLINE_MS / 1000
        while True:
            self._check_usable()
            if not self._room_records or (
                    self._room_records < limits.LOG_PRODUCER_INFLIGHT_RECORDS_MAX and
                    self._room_bytes + size <= limits.LOG_PRODUCER_INFLIGHT_BYTES_MAX):
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise LogServiceUnavailableError(
                    f"log {self.name!r}: no room in the producer's window within "
                    f"{limits.LOG_PRODUCER_DEADLINE_MS} ms")
            self._cond.wait(min(remaining, POLL_MS / 1000))

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
        if self._closing:
            raise ClientClosedError(f"producer of log {self.name!r} is closed")

    def flush(self) -> None:
        """Wait until every write so far is stored (or raise the error)."""
        with self._cond:
            while self._room_records and self._error is None:
                self._cond.wait(POLL_MS / 1000)
            if self._error is not None:
                raise self._error

    def close(self) -> None:
        """Flush, then stop; a second call does nothing.  Raises the
        producer's error if a write failed."""
        with self._cond:
            if self._closing:
                return
        try:
            self.flush()
        finally:
            with self._cond:
                self._closing = True
            self._loop.submit((self, None, None, CLOSE))
            self._finished.wait(timeout=limits.LOG_PRODUCER_DEADLINE_MS / 1000)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def stats(self) -> dict:
        """Requests sent, redirects, retries, timeouts (a copy, read on the
        I/O thread while it drives this producer)."""
        if self._finished.is_set():
            return dict(self._core.stats)  # let go: the I/O thread no longer touches it
        fut: Future = Future()
        self._loop.submit((self, None, fut, STATS))
        return fut.result(timeout=10)

    # -- the I/O thread's ---------------------------------------------------------------
    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def _find_owner(self) -> str | None:
        """The lease holder's endpoint, else the live server the hashing names."""
        lease = self._registry.owner(self.name)
        if lease is not None:
            return lease["endpoint"]
        servers = self._registry.servers()
        target = owner_of(self.name, servers)
        return None if target is None else servers[target]["endpoint"]

    def _server_route(self, endpoint: str) -> tuple[bytes | None, str | None]:
        """(the CURVE key to verify the log server at ``endpoint`` by, its
        id): (None, None) on ipc; on tcp from its registration, or raise
        (``appliance.curve.log_server_key``: ``UnauthorizedError`` when it
        requires CURVE and this client has no key, ``LogServiceUnavailableError``
        when its key is not one this client trusts)."""
        if not is_tcp(endpoint):
            return None, None
        for server_id, info in self._registry.servers().items():
            if info.get("endpoint") == endpoint:
                return log_server_key(self._curve, server_id, info), server_id
        return None, None  # not registered (any more): plain, and the owner is found again

    def _settled(self, done: list, error: BaseException | None, payload_bytes: int) -> None:
        """Writes settled (``error`` None) or failed: their futures finished,
        their room given back; a sticky error kept for later writes."""
        with self._cond:
            self._room_records -= len(done)
            self._room_bytes -= payload_bytes
            if error is not None and error is self._core.error:
                self._error = error
        complete_futures(self._cond, done, error)  # notifies the room's waiters too
