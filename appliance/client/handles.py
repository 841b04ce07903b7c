"""Ledger handles: ``WriteHandle`` (create_ledger) and ``ReadHandle``
(open_ledger).  Each wraps one pure core (``LedgerWriter`` /
``LedgerReader``) that lives on the client's driver thread; the handle's
methods hand work to that thread and wait on futures.

Adds are batched: ``add_async`` queues the payload and the driver thread
turns everything queued since its last turn into one ``add_many`` call, so
adds to one bookie travel in one wire message.  Entry ids follow the order
of ``add_async`` calls.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures._base import CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED, PENDING
from itertools import repeat

from appliance.checks.digest import make_digest
from appliance.checks.record_check import verify_run_fast
from appliance.client.calls import Entry, check_entry_id, wait_result
from appliance.errors import (
    OK,
    BKError,
    BKTimeoutError,
    ClientClosedError,
    NoSuchEntryError,
)
from appliance.protocol import events as ev
from appliance.protocol import limits
from appliance.protocol.metadata import CLOSED
from appliance.protocol.reader import LedgerReader, ReaderConfig
from appliance.protocol.writer import LedgerWriter, WriterConfig

log = logging.getLogger(__name__)

READ_CHUNK_ENTRIES = 1000  # entries per read() round trip through the driver


class AddFuture(Future):
    """The future of one add: a real ``concurrent.futures.Future`` (``wait``,
    ``as_completed``, callbacks, ``cancel`` all work) whose condition is shared
    by every add of its handle, because building a ``Condition`` per add cost
    a quarter of the client's CPU.  So ``result``/``exception`` wait in a loop
    (a completion wakes every thread waiting on that handle and each re-checks
    its own future), and a batch of adds completes under one lock.
    Its two lists (``wait``'s waiters, callbacks) are made on first use: most
    adds never get either, and two lists per add in flight were most of the
    objects the garbage collector kept scanning.  An add's first callback is
    kept without a list (the usual one: a caller timing or chaining each
    add), for the same reason: a list per add in flight was an object more
    for each young collection to promote, and the promotions are what bring
    the full collections that pause every thread of the process.
    Cancelling an add's future does not un-write the entry."""

    def __init__(self, condition: threading.Condition):
        self._condition = condition
        self._state = PENDING
        self._result = None
        self._exception = None
        self._waiter_list = None
        self._callback_one = None  # the first callback, while it is the only one
        self._callback_list = None  # all of them, once there are two

    @property
    def _waiters(self) -> list:  # the base class and concurrent.futures.wait use it
        if self._waiter_list is None:
            self._waiter_list = []
        return self._waiter_list

    @property
    def _done_callbacks(self) -> list:
        if self._callback_list is None:
            one, self._callback_one = self._callback_one, None
            self._callback_list = [] if one is None else [one]
        return self._callback_list

    def add_done_callback(self, fn) -> None:
        """As ``Future.add_done_callback``: called with this future once it
        is done (at once if it is), in the order the callbacks were added."""
        with self._condition:
            if self._state not in (CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED):
                if self._callback_one is None and self._callback_list is None:
                    self._callback_one = fn
                else:
                    self._done_callbacks.append(fn)
                return
        _call_back(fn, self)

    def _invoke_callbacks(self) -> None:
        one = self._callback_one
        for callback in (one,) if one is not None else (self._callback_list or ()):
            _call_back(callback, self)

    def _wait_done(self, timeout: float | None) -> None:
        """Hold ``_condition``; return once finished (or raise)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._state in (CANCELLED, CANCELLED_AND_NOTIFIED):
                raise CancelledError()
            if self._state == FINISHED:
                return
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise FutureTimeout()
            self._condition.wait(remaining)

    def result(self, timeout: float | None = None):
        with self._condition:
            self._wait_done(timeout)
            error = self._exception
        if error is not None:
            try:
                raise error
            finally:
                error = None  # no reference cycle through the traceback
        return self._result

    def exception(self, timeout: float | None = None):
        with self._condition:
            self._wait_done(timeout)
            return self._exception


def _call_back(callback, fut: Future) -> None:
    """Run one done-callback; its exception is logged, as ``Future`` does."""
    try:
        callback(fut)
    except Exception:
        log.exception("exception calling callback for %r", fut)


def _complete(condition: threading.Condition, settled: list, error) -> None:
    """Finish ``settled`` ((entry id, AddFuture) pairs) with their entry id or
    ``error``: one lock and one wake-up for the batch, then the callbacks.
    A future its user cancelled stays cancelled."""
    done = []
    with condition:
        for entry_id, fut in settled:
            if fut._state != PENDING:
                continue
            fut._state = FINISHED
            waiters = fut._waiter_list or ()
            if error is None:
                fut._result = entry_id
                for waiter in waiters:
                    waiter.add_result(fut)
            else:
                fut._exception = error
                for waiter in waiters:
                    waiter.add_exception(fut)
            if fut._callback_one is not None or fut._callback_list:
                done.append(fut)
        condition.notify_all()
    for fut in done:
        fut._invoke_callbacks()


complete_futures = _complete  # for other rooms' AddFutures (the log writer's records)


def _digest(md, key):
    return make_digest(md.digest_type, key)


class WriteHandle:
    """The single writer of an OPEN ledger."""

    def __init__(self, client, metadata, version: int, key: bytes):
        cfg = client.config
        self._client = client
        self._driver = client.driver
        self.id = metadata.ledger_id
        self._entry_bytes_max = client.payload_bytes_max  # checked once, before sending
        wcfg = WriterConfig(add_timeout_ms=cfg.add_timeout_ms, add_retries_max=cfg.add_retries_max,
                            pending_adds_max=cfg.inflight_adds_max,
                            entry_bytes_max=self._entry_bytes_max,
                            explicit_lac_interval_ms=cfg.explicit_lac_interval_ms,
                            placement=cfg.placement)
        self._writer = LedgerWriter(metadata, version, key, _digest(metadata, key), config=wcfg,
                                    available_bookies=self._driver.available_bookies,
                                    ids=self._driver.ids, locations=self._driver.locations)
        # One lock guards the queue and the count of adds in flight; add_async
        # waits on _room (same lock) while inflight_adds_max adds are in flight;
        # the first add that waits makes it (a Condition is ~1 KB, most of it
        # its waiters' deque, and many handles never wait).
        self._queue_lock = threading.Lock()
        self._room: threading.Condition | None = None
        self._inflight, self._inflight_max, self._room_waiters = 0, cfg.inflight_adds_max, 0
        self._inflight_bytes, self._inflight_bytes_max = 0, cfg.inflight_bytes_max
        self._queued_payloads: list = []  # waiting for the driver, with their futures
        self._queued_futures: list[AddFuture] = []
        self._flush_posted = False
        # Adaptive batching (see _flush): _held (under the queue lock) means the
        # driver holds the queued adds until a batch is acknowledged or the
        # linger deadline; _batch_ends (driver thread) holds the last entry id
        # of each batch sent and not yet acknowledged.
        self._held = self._no_linger = False
        self._hold_gen = 0
        self._batch_ends: list[int] = []  # (a list: a deque is 760 bytes even empty)
        self._linger_s = cfg.add_linger_us / 1e6
        self._hold_batches = cfg.add_batches_inflight
        self._batch_max = cfg.add_batch_entries_max
        self._futures: dict[int, AddFuture] = {}
        self._future_condition = threading.Condition()  # shared by this handle's AddFutures
        self._close_done: Future | None = None
        self._closed = False
        self._client_closed = False  # the driver stopped: nothing is sent any more
        self._driver.call(self._driver.register, self._writer, self).result()
        self._metrics = client.metrics  # None unless the client was asked for metrics
        if self._metrics is not None:
            self._metrics.track(self)

    @property
    def last_add_confirmed(self) -> int:
        return self._writer.last_add_confirmed

    @property
    def metadata(self):
        return self._writer.metadata

    # -- adds ---------------------------------------------------------------------
    def add(self, payload: bytes) -> int:
        """Append ``payload``; returns its entry id once acknowledged (its batch
        leaves at once: a caller that waits sends nothing more to wait for)."""
        fut = self._add(payload, linger=False)
        return wait_result(fut, limits.CLIENT_CALL_TIMEOUT_S_MAX, f"add to ledger {self.id}")

    def add_async(self, payload: bytes) -> Future:
        """Append ``payload``; the future's result is the entry id."""
        return self._add(payload, linger=True)

    def add_many_async(self, payloads) -> list[Future]:
        """Append every payload of ``payloads``, in order, as consecutive
        entries; one future per payload (result: its entry id), as
        ``add_async`` would give, for a fraction of its cost per entry: the
        checks, the queue lock and the hand-off to the driver are paid per
        chunk of adds, not per add.  Every payload is checked (type, size)
        before any is queued, so a bad one raises and queues nothing.  Waits,
        like ``add_async``, while ``inflight_adds_max`` adds or
        ``inflight_bytes_max`` bytes are in flight."""
        batch = [self._checked(p) for p in payloads]
        if self._closed:
            raise ClientClosedError(f"ledger handle {self.id} is closed")
        futures: list[Future] = []
        step = max(1, min(self._inflight_max, self._batch_max))
        for lo in range(0, len(batch), step):
            chunk = batch[lo:lo + step]
            futs = [AddFuture(self._future_condition) for _ in chunk]
            if self._metrics is not None:
                t0 = time.perf_counter()
                for fut in futs:
                    fut.t0 = t0
            size = 0
            for fut, payload in zip(futs, chunk, strict=True):
                size += len(payload)
                fut.payload_bytes = len(payload)
            with self._queue_lock:
                self._wait_for_room(size, len(chunk))  # raises once the client is closed
                self._inflight += len(chunk)
                self._inflight_bytes += size
                self._queued_payloads += chunk
                self._queued_futures += futs
                post = not self._flush_posted or (
                    self._held and len(self._queued_payloads) >= self._batch_max)
                if post:
                    self._held = False  # the posted flush sends them
                self._flush_posted = True
            if post:
                self._driver.post(self._flush, False, True)
            futures += futs
        return futures

    def _checked(self, payload) -> bytes:
        if type(payload) is not bytes:
            if not isinstance(payload, bytes | bytearray | memoryview):
                raise TypeError(f"payload must be bytes, got {type(payload).__name__}")
            payload = bytes(payload)  # the caller may reuse its buffer
        if len(payload) > self._entry_bytes_max:
            raise ValueError(f"payload of {len(payload)} bytes exceeds the "
                             f"{self._entry_bytes_max}-byte entry limit")
        return payload

    def _add(self, payload, linger: bool) -> AddFuture:
        payload = self._checked(payload)
        if self._closed:
            raise ClientClosedError(f"ledger handle {self.id} is closed")
        fut = AddFuture(self._future_condition)
        size = fut.payload_bytes = len(payload)
        if self._metrics is not None:
            fut.t0 = time.perf_counter()
        with self._queue_lock:
            if self._client_closed:  # checked under the lock client_closed() takes
                raise ClientClosedError(f"the client of ledger {self.id} is closed")
            if self._inflight >= self._inflight_max or \
                    self._inflight_bytes + size > self._inflight_bytes_max:
                self._wait_for_room(size)  # back-pressure: bounded adds and bytes in flight
            self._inflight += 1
            self._inflight_bytes += size
            self._queued_payloads.append(payload)
            self._queued_futures.append(fut)
            self._no_linger = self._no_linger or not linger
            # a held batch goes at once when a caller waits or it became full
            post = not self._flush_posted or (self._held and (
                not linger or len(self._queued_payloads) >= self._batch_max))
            if post:
                self._held = False  # the posted flush sends them
            self._flush_posted = True
        if post:
            self._driver.post(self._flush, False, True)
        return fut

    def _wait_for_room(self, size: int, count: int = 1) -> None:
        """Holding ``_queue_lock``: wait until ``count`` more adds of ``size``
        bytes in all fit (adds bigger than the byte limit go once nothing is in
        flight; ``count`` is at most ``inflight_adds_max``); raise
        ``ClientClosedError`` once the client is closed."""
        if self._room is None:
            self._room = threading.Condition(self._queue_lock)
        self._room_waiters += 1
        try:
            while True:
                if self._client_closed:
                    raise ClientClosedError(f"the client of ledger {self.id} is closed")
                if self._inflight + count <= self._inflight_max and (
                        not self._inflight
                        or self._inflight_bytes + size <= self._inflight_bytes_max):
                    return
                self._room.wait()
        finally:
            self._room_waiters -= 1

    def _flush(self, force: bool = False, fresh: bool = False) -> None:
        """Driver thread: hand every queued payload to the writer at once.

        Adaptive batching: a batch smaller than ``add_batch_entries_max`` goes
        at once while fewer than ``add_batches_inflight`` of this handle's
        batches await their ack quorum; otherwise it is held, gathering the
        adds that arrive meanwhile, until one of them is acknowledged or
        ``add_linger_us`` has passed.  So an idle handle sends an add with
        no delay, and one busy with adds arriving one by one sends a few per
        message (as many as arrive in a round trip) without a timer per
        message.  A caller that waits (``add``), a full batch and ``force``
        never wait.  ``fresh``: posted by an add, so a batch that leaves at
        once may still wait for company at the driver, with other ledgers'
        adds to the same bookies (``add_messages_inflight``); a batch that
        was held here, or that a caller waits for, never waits twice."""
        with self._queue_lock:
            queued = len(self._queued_payloads)
            if not force and 0 < queued < self._batch_max and self._linger_s > 0 \
                    and not self._no_linger and len(self._batch_ends) >= self._hold_batches:
                if not self._held:  # _flush_posted stays set: add_async posts nothing
                    self._held = True
                    gen = self._hold_gen
                    self._driver.call_later_s(self._linger_s, self._flush_late, gen)
                return
            holdable = fresh and not force and not self._no_linger
            self._held = self._no_linger = False
            payloads, futures = self._queued_payloads, self._queued_futures
            self._queued_payloads, self._queued_futures = [], []
            self._flush_posted = False
        self._hold_gen += 1  # a pending linger deadline is moot
        if not payloads:
            return
        first = self._writer.last_add_pushed + 1
        self._futures.update(zip(range(first, first + len(futures)), futures, strict=True))
        self._batch_ends.append(first + len(futures) - 1)
        # every payload passed _checked against the writer's own entry_bytes_max
        actions = self._writer.add_many(payloads, self._driver.now_ms(), checked=True)
        self._driver.run(self._writer, actions, holdable)

    def _flush_late(self, gen: int) -> None:
        """Driver thread: the linger deadline of a held batch."""
        if gen == self._hold_gen and self._held:
            self._flush(force=True)

    def _acknowledged(self, last: int) -> None:
        """Driver thread: adds up to ``last`` are settled; a held batch goes
        once fewer than ``add_batches_inflight`` batches are outstanding."""
        ends = self._batch_ends
        done = 0
        while done < len(ends) and ends[done] <= last:
            done += 1
        del ends[:done]
        if self._held and len(ends) < self._hold_batches:
            self._flush()

    def on_result(self, action) -> None:
        """Driver thread: a result of the writer core."""
        if isinstance(action, ev.CompleteAdds):
            self._settle(action.first_entry_id, action.last_entry_id, None)
            self._acknowledged(action.last_entry_id)
        elif isinstance(action, ev.FailAdds):
            self._settle(action.first_entry_id, action.last_entry_id,
                         self._driver.error(action.code, f"ledger {self.id}"))
            self._acknowledged(action.last_entry_id)
        elif isinstance(action, ev.CloseDone) and self._close_done is not None:
            if not self._close_done.done():
                self._close_done.set_result(action)

    def _settle(self, first: int, last: int, error) -> None:
        futures = self._futures
        settled = [(e, futures.pop(e)) for e in range(first, last + 1) if e in futures]
        if settled:
            freed = sum(fut.payload_bytes for _, fut in settled)
            with self._queue_lock:  # room first: callbacks may add again
                self._inflight -= len(settled)
                self._inflight_bytes -= freed
                if self._room_waiters:
                    self._room.notify_all()
            _complete(self._future_condition, settled, error)
            if self._metrics is not None:
                self._metrics.settled([fut for _, fut in settled], error is not None)

    def client_closed(self) -> None:
        """The driver stopped (``Client.close``): every add not yet settled
        fails with ``ClientClosedError`` (it may or may not be stored: its
        acks can no longer come), and adds waiting for room raise it."""
        error = ClientClosedError(f"the client was closed with this add to ledger {self.id} "
                                  f"in flight: it may or may not be stored")
        with self._queue_lock:
            self._client_closed = True
            queued, self._queued_futures, self._queued_payloads = self._queued_futures, [], []
            if self._room is not None:
                self._room.notify_all()
        settled = [*self._futures.items(), *((None, fut) for fut in queued)]
        self._futures.clear()
        _complete(self._future_condition, settled, error)
        if self._close_done is not None and not self._close_done.done():
            self._close_done.set_exception(error)

    # -- close --------------------------------------------------------------------
    def close(self) -> None:
        """Wait for the adds in flight, then close the ledger at its LAC.
        Raises ``LedgerFencedError`` if a recovery took the ledger over."""
        if self._closed:
            return
        self._closed = True
        self._driver.call(self._flush, True).result()
        pending = list(self._futures.values())
        for fut in pending:
            try:
                fut.result(timeout=limits.CLIENT_CALL_TIMEOUT_S_MAX)
            except Exception:  # noqa: S110 - the add's own caller sees its error
                pass
        self._close_done = Future()

        def start():
            self._driver.run(self._writer, self._writer.close(self._driver.now_ms()))

        self._driver.call(start).result()
        try:
            done = wait_result(self._close_done, limits.CLIENT_CALL_TIMEOUT_S_MAX,
                               f"close of ledger {self.id}")
        finally:
            self._driver.post(self._driver.unregister, self._writer)
            if self._metrics is not None:
                self._metrics.untrack(self)
        if done.code != OK:
            raise self._driver.error(done.code, f"close of ledger {self.id}")

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ReadHandle:
    """A reader of a ledger (recovered and closed, or open up to its LAC)."""

    def __init__(self, client, metadata, key: bytes):
        self._client = client
        self._driver = client.driver
        self.id = metadata.ledger_id
        self._key = key
        rcfg = ReaderConfig(read_timeout_ms=client.config.read_timeout_ms,
                            read_batch_entries=client.config.read_batch_entries_max,
                            long_poll=True)
        self._reader = LedgerReader(metadata, _digest(metadata, key), master_key=key,
                                    config=rcfg, ids=self._driver.ids,
                                    verify_batch=verify_run_fast)
        self._waiting: dict[int, Future] = {}
        # read-ahead: ((first, last), started read) of the range after the last read()
        self._ahead: tuple | None = None
        self._ahead_lock = threading.Lock()
        self._driver.call(self._driver.register, self._reader, self).result()
        if metadata.state != CLOSED:
            self._call(lambda: self._reader.open(self._driver.now_ms()), None)

    @property
    def last_add_confirmed(self) -> int:
        return self._reader.last_add_confirmed

    @property
    def metadata(self):
        return self._reader.metadata

    def read_chunks(self, first_entry_id: int, last_entry_id: int):
        """Bulk catch-up read: entries ``first..last`` (at most the LAC) as
        ``appliance.client.bulk_read.VerifiedChunk`` s, in order, each entry once:
        ``chunk.first_entry_id``, ``chunk.count``, and payload ``i`` is
        ``chunk.payloads[chunk.offsets[i]:chunk.offsets[i + 1]]`` (one buffer
        per chunk, no object per entry).  The same verified bytes as ``read``
        (digest, ledger and entry ids checked; failover between replicas),
        fetched straight from the bookies with READ_PACKED, several requests
        in flight: the fast way to replay a long ledger.  Raises like ``read``
        (``NoSuchEntryError`` past the LAC, before anything is sent)."""
        # The bulk reader loads on the first bulk read (Spark, replays): in
        # every other client it would be 6 more modules and ~230 more objects
        # for the collector to scan (measured 2026-11-27).
        from appliance.client.bulk_read import BulkReadConfig, BulkReader
        from appliance.curve import bookie_routes

        self._check_range(first_entry_id, last_entry_id)
        cfg = self._client.config
        config = BulkReadConfig(read_timeout_ms=cfg.read_timeout_ms,
                                batch_entries_max=cfg.read_batch_entries_max,
                                batch_bytes_max=cfg.read_batch_bytes_max)

        endpoints, server_keys = bookie_routes(self._driver.curve,
                                               self._client.registry.available())
        metadata, key = self.metadata, self._key
        curve_keys = self._driver.curve.keys if self._driver.curve is not None else None

        def chunks():
            with BulkReader(endpoints, config, curve_keys=curve_keys,
                            server_keys=server_keys) as reader:
                yield from reader.read(metadata, first_entry_id, last_entry_id, key)
        return chunks()

    def client_closed(self) -> None:
        """The driver stopped (``Client.close``): reads and LAC waits in
        flight fail with ``ClientClosedError``."""
        waiting, self._waiting = self._waiting, {}
        error = ClientClosedError(f"the client was closed during a read of ledger {self.id}")
        for fut in waiting.values():
            if not fut.done():
                fut.set_exception(error)

    def on_result(self, action) -> None:
        key = getattr(action, "read_id", None)
        if isinstance(action, ev.OpenDone):
            key = ("open", action.ledger_id)
        fut = self._waiting.pop(key, None)
        if fut is not None and not fut.done():
            fut.set_result(action)

    def _call(self, start, read_id):
        """Run ``start`` on the driver thread and wait for the result action
        whose read id is ``read_id`` (None: the open)."""
        key = read_id if read_id is not None else ("open", self.id)
        fut: Future = Future()

        def run():
            self._waiting[key] = fut
            self._driver.run(self._reader, start())

        self._driver.call(run).result()
        result = wait_result(fut, limits.CLIENT_CALL_TIMEOUT_S_MAX, f"read of ledger {self.id}")
        if result.code != OK:
            raise self._driver.error(result.code, f"ledger {self.id}")
        return result

    def _check_range(self, first_entry_id: int, last_entry_id: int) -> None:
        """Before anything is sent: ids are ints >= 0, in order, within the LAC."""
        check_entry_id("first_entry_id", first_entry_id)
        check_entry_id("last_entry_id", last_entry_id)
        if last_entry_id < first_entry_id:
            raise ValueError(f"last_entry_id ({last_entry_id}) < first_entry_id "
                             f"({first_entry_id})")
        if last_entry_id > self.last_add_confirmed:
            raise NoSuchEntryError(f"ledger {self.id}: entry {last_entry_id} is past the last "
                                   f"add confirmed ({self.last_add_confirmed})")

    def read(self, first_entry_id: int, last_entry_id: int) -> list[Entry]:
        """Entries first..last (inclusive), in order.  Reading past the LAC
        raises ``NoSuchEntryError``."""
        self._check_range(first_entry_id, last_entry_id)
        chunks = [(s, min(s + READ_CHUNK_ENTRIES - 1, last_entry_id))
                  for s in range(first_entry_id, last_entry_id + 1, READ_CHUNK_ENTRIES)]
        with self._ahead_lock:
            ahead, self._ahead = self._ahead, None
        pending = ahead[1] if ahead is not None and ahead[0] == chunks[0] else None
        speculative = pending is not None
        if pending is None:
            pending = self._start_read(*chunks[0])
        out: list[Entry] = []
        for i, chunk in enumerate(chunks):
            following = chunks[i + 1] if i + 1 < len(chunks) else self._next_range(chunk)
            started = self._start_read(*following) if following is not None else None
            done = self._finish_read(pending, chunk, retry=speculative)
            out += map(tuple.__new__, repeat(Entry), zip(
                repeat(self.id), range(chunk[0], chunk[1] + 1), map(bytes, done.payloads)))
            pending, speculative = started, False
        if pending is not None:  # the caller likely asks for it next: keep it in flight
            with self._ahead_lock:
                self._ahead = (following, pending)
        return out

    def _next_range(self, chunk: tuple[int, int]) -> tuple[int, int] | None:
        """The range of the same size after ``chunk``, if it is below the LAC."""
        last = chunk[1] + chunk[1] - chunk[0] + 1
        return (chunk[1] + 1, last) if last <= self.last_add_confirmed else None

    def _start_read(self, first: int, last: int) -> tuple[Future, Future]:
        """Start ``read(first, last)`` on the driver thread without waiting:
        (the start's future, the ``ReadDone``'s future)."""
        read_id = next(self._driver.ids)
        fut: Future = Future()

        def run():
            self._waiting[read_id] = fut
            self._driver.run(self._reader, self._reader.read(first, last, self._driver.now_ms(),
                                                             read_id=read_id))

        return self._driver.call(run), fut

    def _finish_read(self, started: tuple[Future, Future], chunk: tuple[int, int],
                     retry: bool):
        """The ``ReadDone`` of a started read; ``retry``: a read started ahead
        that failed is read again now (the caller's own attempt)."""
        try:
            started[0].result(timeout=limits.CLIENT_CALL_TIMEOUT_S_MAX)
            result = wait_result(started[1], limits.CLIENT_CALL_TIMEOUT_S_MAX,
                                 f"read of ledger {self.id}")
            if result.code == OK:
                return result
            if not retry:
                raise self._driver.error(result.code, f"ledger {self.id}")
        except BKError:
            if not retry:
                raise
        return self._finish_read(self._start_read(*chunk), chunk, retry=False)

    def read_lac(self) -> int:
        """Ask the bookies for the LAC now; returns it (and remembers it)."""
        read_id = next(self._driver.ids)
        done = self._call(lambda: self._reader.read_lac(self._driver.now_ms(), read_id=read_id),
                          read_id)
        return done.lac

    def wait_for_lac(self, above: int, timeout_s: float) -> int:
        """Block until the LAC exceeds ``above`` or ``timeout_s`` passed;
        returns the LAC then (``<= above`` on timeout).  The bookies are asked
        with WAIT_LAC long polls: each answers as soon as it learns a LAC past
        ``above``, so a tailing reader sees a new entry about one round trip
        after the writer's next message reached the bookies.  A CLOSED
        ledger answers at once."""
        if not isinstance(above, int) or isinstance(above, bool) or above < -1:
            raise ValueError(f"above must be an int >= -1, got {above!r}")
        if not isinstance(timeout_s, int | float) or timeout_s < 0:
            raise ValueError(f"timeout_s must be >= 0, got {timeout_s!r}")
        read_id = next(self._driver.ids)
        fut: Future = Future()
        timeout_ms = max(1, int(timeout_s * 1000))

        def run():
            self._waiting[read_id] = fut
            self._driver.run(self._reader, self._reader.wait_for_lac(
                above, timeout_ms, self._driver.now_ms(), read_id=read_id))

        self._driver.call(run).result()
        result = wait_result(fut, limits.CLIENT_CALL_TIMEOUT_S_MAX + timeout_s,
                             f"LAC wait on ledger {self.id}")
        if result.code not in (OK, BKTimeoutError.code):
            raise self._driver.error(result.code, f"ledger {self.id}")
        return result.lac

    def close(self) -> None:
        self._driver.post(self._driver.unregister, self._reader)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
