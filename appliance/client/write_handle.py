"""``WriteHandle`` (``Client.create_ledger``): the single writer of an OPEN
ledger.  It wraps one pure core (``LedgerWriter``) that lives on the
client's driver thread; the handle's methods hand work to that thread and
wait on futures (``AddFuture``).

Adds are batched: ``add_async`` queues the payload and the driver thread
turns everything queued since its last turn into one ``add_many`` call, so
adds to one bookie travel in one wire message.  Entry ids follow the order
of ``add_async`` calls.  Back-pressure: at most ``inflight_adds_max`` adds
and ``inflight_bytes_max`` bytes are in flight; an add beyond them waits
for room (and raises ``ClientClosedError`` once the client is closed).
Every add settles exactly once: with its entry id, its error, or
``ClientClosedError`` when the client closes with it in flight.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future

from appliance.checks.digest import make_digest
from appliance.client.add_future import AddFuture, complete_futures
from appliance.client.calls import wait_result
from appliance.errors import OK, ClientClosedError
from appliance.protocol import events as ev
from appliance.protocol import limits
from appliance.protocol.writer import LedgerWriter, WriterConfig

log = logging.getLogger("appliance.client.write_handle")


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
                            placement=cfg.placement,
                            delay_ensemble_change=cfg.delay_ensemble_change,
                            heal_bytes_max=cfg.heal_bytes_max,
                            heal_close_wait_ms=cfg.heal_close_wait_ms)
        digest = make_digest(metadata.digest_type, key)
        self._writer = LedgerWriter(metadata, version, key, digest, config=wcfg,
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
        self._close_ended: threading.Event | None = None  # set once the first close() ends
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

    def add_async(self, payload: bytes, *, linger: bool = True) -> Future:
        """Append ``payload``; the future's result is the entry id.
        ``linger=False``: never held for company (``add_linger_us``), for a
        caller that batches its adds itself."""
        return self._add(payload, linger=linger)

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

    def has_room(self, count: int, size: int) -> bool:
        """Would ``count`` more adds of ``size`` bytes in all be taken now
        without waiting for room (``_wait_for_room``'s rule: within
        ``inflight_adds_max`` adds, and within ``inflight_bytes_max`` bytes
        unless nothing is in flight)?  For a caller that must never wait (a
        log server's loop serves every log).  Read without the lock: adds
        only leave the window meanwhile, so a True stays true until the
        caller itself adds."""
        inflight = self._inflight
        return inflight + count <= self._inflight_max and (
            not inflight or self._inflight_bytes + size <= self._inflight_bytes_max)

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
                if self.has_room(count, size):
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
            writer = self._writer
            if writer.short_left or writer.untracked:  # the delayed ensemble change
                log.warning("ledger %d closed with %d entries still a copy short on a bookie "
                            "that did not answer in time and %d not kept past "
                            "client.heal_bytes_max: they have ack_quorum copies until "
                            "re-replication", self.id, writer.short_left, writer.untracked)
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
            complete_futures(self._future_condition, settled, error)
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
        complete_futures(self._future_condition, settled, error)
        if self._close_done is not None and not self._close_done.done():
            self._close_done.set_exception(error)

    # -- close --------------------------------------------------------------------
    def close(self) -> None:
        """Wait for the adds in flight, then close the ledger at its LAC.
        Raises ``LedgerFencedError`` if a recovery took the ledger over.  A
        close while another thread's close runs waits for that one to end
        (the ledger is closed, or that close raised) instead of returning
        at once; a close after one ended returns at once."""
        with self._queue_lock:
            first, self._closed = not self._closed, True
            if first:
                self._close_ended = threading.Event()
        if not first:
            if self._close_ended is not None:
                self._close_ended.wait(limits.CLIENT_CALL_TIMEOUT_S_MAX)
            return
        try:
            self._close_once()
        finally:
            self._close_ended.set()

    def _close_once(self) -> None:
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

