"""The one writer of a log (``Log.writer()``).

Opening takes the log over (``take_ownership``: the epoch goes up, every
older writer is fenced from here), recovers the previous writer's segment if
it was left IN_PROGRESS (its ledger opened with recovery: fenced and closed
at its last acknowledged entry, so whatever that writer had acknowledged
stays and it can add no more), completes it, and starts a segment of its
own on a new ledger.

Writes: records are buffered and packed many to a ledger entry
(``appliance.protocol.log_entry``).  An entry leaves when the buffer holds
``log.flush_bytes``, when its oldest record waited ``log.flush_interval_us``,
or on ``flush()`` / a blocking ``write()``.  A write's future resolves to its
``DLSN`` once the entry is acknowledged by the ledger layer (durable on an
ack quorum), in order.  When the writer is idle after an entry was
acknowledged it adds one *control* entry (after ``log.control_interval_ms``)
so the bookies learn the LAC and tailing readers see the last records.
Rollover: before an entry leaves, a segment over ``log.segment_bytes_max`` /
``segment_records_max`` / ``segment_age_ms`` is closed, completed and a new
one started, on a pool thread (``LOG_ROLL_WORKERS`` per process), not on
the caller's: the close waits for the segment's last entries (up to
``heal_close_wait_ms`` while a bookie is slow) and four metadata writes,
and neither a ``write_async`` nor the log server's loop serving every other
log waits with it.  Meanwhile the records sent are held as entries and
leave, in order, in the new segment; ``flush`` and ``close`` wait for the
roll.

Tagged writers (the log service's owners, ``tagged=True``): every record
carries its producer's ``(producer_id, seq)`` in the entry's tags column
(``appliance.protocol.log_entry``), given to ``write_many_async`` or
``write_run_async`` (one future for a request's records, resolved to their
position runs once the last is acknowledged).  Driven writers
(``driven=True``, the owners too) have no flush timer and no flusher
thread: their caller decides what leaves when (``add_entry``: one entry of
the records it cut, ``add_control``: a control entry; the log owner core,
``appliance.protocol.log_owner``, counts its entries in flight and the
ledger's window from their futures, so an add never waits for room), and
their entries are never held by the ledger handle.  A process owning a
thousand logs has no thread per log.

Listening (``listen``, the log service's read cache): a callback is told
of every entry the ledger acknowledged (its ack quorum durable, so the
records are in the log at those DLSNs for good), in entry order, control
entries included (no records), on the ledger's completion thread.

Threads: the buffer, the segment's fields, ``_closed``, ``_rolling``,
``_held`` and ``stats`` are guarded by ``_lock`` (the caller's threads, the
flusher, the roll's pool thread); ``_acknowledged`` belongs to the ledger
client's driver thread alone (``acknowledged_now`` asks it there).  Still
read there without the lock (to be moved onto that thread): ``_listener``
(set under the lock by the read cache's thread) and ``_error`` (first
failure wins, ``_fail``).  A driven writer's caller (a log server's loop thread) is
the only one to send its entries.

Errors are sticky: once a write fails (``LogFencedError`` when a newer writer
took over; any other ledger error as it came), that write and every later
one fail with the same error; open a new writer to go on.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

from appliance.client.add_future import AddFuture, complete_futures
from appliance.client.calls import wait_result
from appliance.errors import (
    BKError,
    ClientClosedError,
    LedgerClosedError,
    LedgerFencedError,
    LogFencedError,
    NoSuchLedgerError,
)
from appliance.protocol import limits
from appliance.protocol.log_entry import (
    HEADER_BYTES,
    RECORD_OVERHEAD,
    TAG_BYTES,
    EntryHeader,
    pack_entry,
    read_header,
)
from appliance.protocol.logs import (
    DLSN,
    IN_PROGRESS,
    NO_TXID,
    RolloverPolicy,
    SegmentEnd,
    check_txid,
    complete_segment,
    dlsn_of,
    start_segment,
    take_ownership,
)

log = logging.getLogger("appliance.logs")

IDLE_WAIT_S = 1.0  # the flusher's longest sleep with nothing to do

_roll_pool: tuple[int, ThreadPoolExecutor] | None = None  # (pid, pool)
_roll_pool_lock = threading.Lock()


def _roller() -> ThreadPoolExecutor:
    """The process's threads that roll writers' segments over
    (``LOG_ROLL_WORKERS``; made on first use, and again in a forked child,
    which has none of its parent's threads)."""
    global _roll_pool
    with _roll_pool_lock:
        if _roll_pool is None or _roll_pool[0] != os.getpid():
            _roll_pool = (os.getpid(), ThreadPoolExecutor(limits.LOG_ROLL_WORKERS, "log-roll"))
        return _roll_pool[1]


class RecordRun:
    """The records of one ``write_run_async`` call: one future for all of
    them (no future per record).  Its result: their positions as runs
    ``[segment seq, entry id, first slot, n]`` in order."""

    __slots__ = ("future", "parts", "left")

    def __init__(self, future: Future, records: int):
        self.future, self.parts, self.left = future, [], records


def settlers(futures: list) -> list:
    """The futures to fail for an entry's record slots (a run's once)."""
    return [f.future if f.__class__ is RecordRun else f for f in futures]


def as_log_error(exc: BaseException, name: str) -> BaseException:
    """A ledger error seen by a log writer, as the log's error."""
    if isinstance(exc, LedgerFencedError | LedgerClosedError):
        return LogFencedError(f"log {name!r}: another writer took the log over "
                              f"(this writer's segment was fenced)")
    return exc


def segment_end(client, seq: int, ledger_id: int, password: bytes) -> SegmentEnd:
    """Recover (fence and close) a segment's ledger and read what it holds
    from its last entry's header."""
    try:
        rh = client.open_ledger(ledger_id, password, recovery=True)
    except NoSuchLedgerError:
        return SegmentEnd()
    try:
        last = rh.metadata.last_entry_id
        if last < 0:
            return SegmentEnd()
        (entry,) = rh.read(last, last)
        h = read_header(entry.payload)
        return SegmentEnd(records=h.records, first_txid=h.first_txid, last_txid=h.last_txid,
                          last_dlsn=DLSN(seq, h.last_entry, h.last_slot)
                          if h.last_entry >= 0 else None, last_entry_id=last)
    finally:
        rh.close()


class LogWriter:
    def __init__(self, client, logs, name: str, password: bytes, config, owner: str,
                 *, tagged: bool = False, driven: bool = False):
        self._client = client
        self._logs = logs
        self.name = name
        self._password = password
        self._policy = RolloverPolicy(config.segment_bytes_max, config.segment_records_max,
                                      config.segment_age_ms)
        self._flush_bytes = config.flush_bytes
        self._flush_s = config.flush_interval_us / 1e6
        self._control_s = config.control_interval_ms / 1000.0
        self._entry_max = client.payload_bytes_max
        self._tagged = tagged
        self._driven = driven  # the caller sends entries (add_entry): no flush timer
        self._record_overhead = RECORD_OVERHEAD + (TAG_BYTES if tagged else 0)
        self.record_bytes_max = self._entry_max - HEADER_BYTES - self._record_overhead
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        # one condition shared by every record's future (one per record cost
        # more than the rest of a write)
        self._futures_done = threading.Condition()
        self._error: BaseException | None = None
        self._closed = False
        self._buf_txids: list[int] = []
        self._buf_payloads: list[bytes] = []
        self._buf_futures: list[Future] = []
        self._buf_tags: list | None = [] if tagged else None
        self._buf_bytes = 0
        self._buf_since = 0.0
        self._last_add: Future | None = None
        self._control_due = False  # an entry with records was sent; no entry after it yet
        self._acked_at = 0.0
        # (seq, entry id) of the last entry acknowledged: the ledger client's
        # driver thread alone writes and reads it (_on_added, acknowledged_now)
        self._acknowledged: tuple[int, int] | None = None
        self._listener = None  # (seq, entry_id, txids, payloads) of each acknowledged entry
        self._rolling = False  # the segment is rolling over (_roll)
        self._held: list[tuple] = []  # entries sent while it rolls (_take_buffer's)
        self.stats = {"entries": 0, "control_entries": 0, "segments_started": 0}

        logs.create_log(name)
        md, _ = logs.update_log(name, lambda m: take_ownership(m, owner))
        self.epoch = md.epoch
        md = self._recover_previous(md)
        self._last_txid = md.last_txid
        self._start_segment()
        self._thread = None  # driven: the caller drives time (add_control), no thread
        if not driven:
            self._thread = threading.Thread(target=self._run, name=f"log-writer-{name}",
                                            daemon=True)
            self._thread.start()

    # -- segments --------------------------------------------------------------------
    def _recover_previous(self, md):
        seg = md.in_progress
        if seg is None:
            return md
        end = segment_end(self._client, seg.seq, seg.ledger_id, self._password)
        log.info("log %s: recovered segment %d (ledger %d): %d records", self.name, seg.seq,
                 seg.ledger_id, end.records)

        def done(m):
            current = m.segment(seg.seq)
            if current is None or current.state != IN_PROGRESS:
                return None
            return complete_segment(m, self.epoch, seg.seq, end)
        md, _ = self._logs.update_log(self.name, done)
        return md

    def _start_segment(self) -> None:
        self._use_segment(*self._new_segment())

    def _new_segment(self) -> tuple:
        """A ledger and the log's new IN_PROGRESS segment on it (blocking)."""
        wh = self._client.create_ledger(password=self._password, custom={"log": self.name})
        try:
            md, _ = self._logs.update_log(self.name, lambda m: start_segment(
                m, self.epoch, wh.id, self._logs.clock_ms()))
        except BaseException:
            self._discard(wh)
            raise
        return wh, md.in_progress

    def _use_segment(self, wh, seg) -> None:
        self._wh = wh
        self._seg = seg
        self._next_entry = 0
        self._seg_records = self._seg_bytes = 0
        self._seg_first = self._seg_last = NO_TXID
        self._seg_last_data = (-1, 0)
        self._seg_started = time.monotonic()
        self.stats["segments_started"] += 1

    def _discard(self, wh) -> None:
        """A ledger created for a segment the log never took: remove it."""
        try:
            wh.close()
            self._client.delete_ledger(wh.id, self._password)
        except BKError as exc:
            log.warning("log %s: could not remove unused ledger %d: %s", self.name, wh.id, exc)

    def _complete_current(self) -> None:
        """Close the segment's ledger (every entry acknowledged) and mark it
        COMPLETED: holding the lock (``close``), or on the roll's thread
        (``_roll``: nothing sends while it rolls)."""
        try:
            self._wh.close()
        except BKError as exc:
            raise self._fail(as_log_error(exc, self.name)) from exc
        seq, (last_entry, last_slot) = self._seg.seq, self._seg_last_data
        end = SegmentEnd(records=self._seg_records, first_txid=self._seg_first,
                         last_txid=self._seg_last,
                         last_dlsn=DLSN(seq, last_entry, last_slot) if last_entry >= 0 else None,
                         last_entry_id=self._next_entry - 1)
        try:
            self._logs.update_log(self.name, lambda m: complete_segment(m, self.epoch, seq, end))
        except BKError as exc:
            raise self._fail(exc) from exc

    def _fail(self, exc: BaseException) -> BaseException:
        if self._error is None:
            self._error = exc
        return self._error

    # -- writes ----------------------------------------------------------------------
    def write(self, payload, txid: int | None = None) -> DLSN:
        """Append one record; blocks until it is durable; its DLSN."""
        fut = self.write_async(payload, txid, linger=False)
        return wait_result(fut, limits.CLIENT_CALL_TIMEOUT_S_MAX, f"write to log {self.name!r}")

    def write_async(self, payload, txid: int | None = None, *, linger: bool = True) -> Future:
        """Append one record; the future's result is its DLSN.  ``txid``
        (strictly above the previous one) or previous + 1."""
        payload = self._checked(payload)
        if self._tagged:
            raise TypeError("a tagged writer takes records with tags: write_many_async")
        if txid is not None:
            check_txid(txid)
        fut = AddFuture(self._futures_done)
        size = len(payload) + RECORD_OVERHEAD
        with self._lock:  # one record: the short way (write_many_async for many)
            self._check_usable()
            if txid is None:
                txid = self._last_txid + 1 if self._last_txid != NO_TXID else 1
            elif txid <= self._last_txid:
                raise ValueError(f"txid {txid} does not increase: the log's last txid is "
                                 f"{self._last_txid}")
            if self._buf_bytes + size + HEADER_BYTES > self._entry_max:
                self._flush_locked()
            if not self._buf_payloads:
                self._buf_since = time.monotonic()
                self._wake.notify()
            self._last_txid = txid
            self._buf_txids.append(txid)
            self._buf_payloads.append(payload)
            self._buf_futures.append(fut)
            self._buf_bytes += size
            if self._buf_bytes >= self._flush_bytes or not linger:
                self._flush_locked()
        return fut

    def write_many_async(self, payloads, txids=None, tags=None) -> list[Future]:
        """Append every payload, in order, as consecutive records; one future
        per record (its DLSN), as ``write_async`` would give, for a fraction
        of the cost per record.  ``txids``: one per payload, strictly
        increasing and above the log's last, or None (previous + 1 each).
        ``tags``: one ``(producer_id, seq)`` per payload, for a tagged
        writer only (and required there).
        Everything is checked before anything is queued."""
        batch = [self._checked(p) for p in payloads]
        if (tags is not None) != self._tagged or (tags is not None and len(tags) != len(batch)):
            raise ValueError("tags: one per payload for a tagged writer, none otherwise")
        if txids is not None:
            txids = [check_txid(t) for t in txids]
            if len(txids) != len(batch):
                raise ValueError(f"{len(txids)} txids for {len(batch)} payloads")
            if any(b <= a for a, b in zip(txids, txids[1:], strict=False)):
                raise ValueError("txids must strictly increase")
        done = self._futures_done
        futures = [AddFuture(done) for _ in batch]
        with self._lock:
            self._append_locked(batch, txids, futures, tags)
        return futures

    def write_run_async(self, payloads, tags) -> Future:
        """``write_many_async`` of a tagged writer with one future for the
        whole run: its result is the records' positions as runs
        ``[segment seq, entry id, first slot, n]`` (``RecordRun``); a
        future per record cost the log service's owner more than the rest
        of a record's handling."""
        batch = [self._checked(p) for p in payloads]
        if not self._tagged or len(tags) != len(batch) or not batch:
            raise ValueError("write_run_async: a tagged writer, one tag per payload, >= 1")
        run = RecordRun(AddFuture(self._futures_done), len(batch))
        with self._lock:
            self._append_locked(batch, None, itertools.repeat(run, len(batch)), tags)
        return run.future

    def _checked(self, payload) -> bytes:
        if type(payload) is not bytes:
            if not isinstance(payload, bytes | bytearray | memoryview):
                raise TypeError(f"payload must be bytes, got {type(payload).__name__}")
            payload = bytes(payload)
        if len(payload) > self.record_bytes_max:
            raise ValueError(f"record of {len(payload)} bytes exceeds the "
                             f"{self.record_bytes_max}-byte record limit")
        return payload

    def _append_locked(self, payloads: list, txids, futures: list, tags=None) -> None:
        """Holding the lock: buffer records, sending an entry whenever the
        buffer reaches ``flush_bytes`` (or the next record would not fit)."""
        self._check_usable()
        last = self._last_txid
        if txids is None:
            first = last + 1 if last != NO_TXID else 1
            txids = range(first, first + len(payloads))
        elif txids[0] <= last:
            raise ValueError(f"txid {txids[0]} does not increase: the log's last txid is "
                             f"{last}")
        if not self._buf_payloads and payloads:
            self._buf_since = time.monotonic()
            if not self._driven:
                self._wake.notify()
        room = self._entry_max - HEADER_BYTES
        flush_bytes = self._flush_bytes
        buf_t, buf_p, buf_f = self._buf_txids, self._buf_payloads, self._buf_futures
        buffered = self._buf_bytes
        overhead = self._record_overhead
        for i, (payload, txid, fut) in enumerate(zip(payloads, txids, futures, strict=True)):
            size = len(payload) + overhead
            if buffered + size > room and buf_p:
                self._buf_bytes = buffered
                self._flush_locked()
                buf_t, buf_p, buf_f = self._buf_txids, self._buf_payloads, self._buf_futures
                buffered = 0
                self._buf_since = time.monotonic()
            buf_t.append(txid)
            buf_p.append(payload)
            buf_f.append(fut)
            if tags is not None:
                self._buf_tags.append(tags[i])
            self._last_txid = txid
            buffered += size
            if buffered >= flush_bytes:
                self._buf_bytes = buffered
                self._flush_locked()
                buf_t, buf_p, buf_f = self._buf_txids, self._buf_payloads, self._buf_futures
                buffered = 0
                self._buf_since = time.monotonic()
        self._buf_bytes = buffered

    def _check_usable(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closed:
            raise ClientClosedError(f"writer of log {self.name!r} is closed")

    def _flush_locked(self, control: bool = False) -> None:
        """Holding the lock: send the buffered records as one entry (or a
        control entry)."""
        if not self._buf_payloads and not control:
            return
        if self._error is not None:
            self._fail_buffer(self._error)
            return
        if self._rolling or (self._buf_payloads and self._roll_due()):
            if self._buf_payloads:  # a control entry is not needed: the roll ends the segment
                self._held.append(self._take_buffer())
            if not self._rolling:
                self._rolling = True
                _roller().submit(self._roll)
            return
        self._send_entry(*self._take_buffer(), control)

    def _roll_due(self) -> bool:
        return self._policy.due(self._seg_bytes, self._seg_records,
                                int((time.monotonic() - self._seg_started) * 1000))

    def _take_buffer(self) -> tuple:
        """Holding the lock: the buffered records, the buffer emptied."""
        txids, payloads, futures = self._buf_txids, self._buf_payloads, self._buf_futures
        self._buf_txids, self._buf_payloads, self._buf_futures = [], [], []
        tags = self._buf_tags
        if tags is not None:
            self._buf_tags = []
        size, self._buf_bytes = self._buf_bytes, 0
        return txids, payloads, futures, tags, size

    def _send_entry(self, txids, payloads, futures, tags, size, control: bool = False) -> None:
        """Holding the lock: records (or none: a control entry) as the
        segment's next entry (a roll that is due was started before:
        ``_flush_locked``)."""
        try:
            entry_id = self._next_entry
            if payloads:
                self._seg_records += len(payloads)
                self._seg_bytes += size
                if self._seg_first == NO_TXID:
                    self._seg_first = txids[0]
                self._seg_last = txids[-1]
                self._seg_last_data = (entry_id, len(payloads) - 1)
            header = EntryHeader(control and not payloads, len(payloads), self._seg_records,
                                 self._seg_first, self._seg_last, *self._seg_last_data)
            data = pack_entry(header, txids, payloads, tags if payloads else None)
            add = self._wh.add_async(data, linger=not self._driven)  # driven: batched here
        except BaseException as exc:
            err = self._fail(as_log_error(exc, self.name))
            complete_futures(self._futures_done, [(None, f) for f in settlers(futures)], err)
            if isinstance(exc, BKError):
                return
            raise
        self._next_entry += 1
        self._last_add = add
        self._control_due = bool(payloads)
        self.stats["entries" if payloads else "control_entries"] += 1
        seq = self._seg.seq
        add.add_done_callback(
            lambda f: self._on_added(f, seq, entry_id, futures, txids, payloads))

    def _fail_buffer(self, err: BaseException) -> None:
        futures, self._buf_futures = self._buf_futures, []
        self._buf_txids, self._buf_payloads, self._buf_bytes = [], [], 0
        if self._buf_tags is not None:
            self._buf_tags = []
        complete_futures(self._futures_done, [(None, f) for f in settlers(futures)], err)

    def _roll(self) -> None:
        """A pool thread, the lock not held (the caller's loop goes on):
        close and complete the segment, start the next, then send the
        entries held meanwhile.  Nothing else sends while ``_rolling``, so
        the segment's fields are stable here."""
        try:
            self._complete_current()
            wh, seg = self._new_segment()
        except BaseException as exc:  # noqa: BLE001 - kept as the writer's error
            log.warning("log %s: segment rollover failed: %s", self.name, exc)
            with self._lock:
                err = self._fail(as_log_error(exc, self.name) if isinstance(exc, BKError)
                                 else exc)
                held, self._held, self._rolling = self._held, [], False
                self._wake.notify_all()
            complete_futures(self._futures_done,
                             [(None, f) for h in held for f in settlers(h[2])], err)
            return
        with self._lock:
            self._use_segment(wh, seg)
            held, self._held, self._rolling = self._held, [], False
            for i, entry in enumerate(held):
                if self._error is not None:  # an entry of the old segment failed meanwhile
                    complete_futures(self._futures_done, [(None, f) for h in held[i:]
                                                          for f in settlers(h[2])], self._error)
                    break
                self._send_entry(*entry)
            self._wake.notify_all()  # flush() and close() wait for the roll

    def _send_buffer_locked(self) -> None:
        """Holding the lock: send the buffered records and wait until they
        are sent.  A full segment makes this flush start a roll: its records
        then leave in the next segment, from the roll's thread, so the wait
        covers that roll too (``close`` must not complete the segment, or
        ``flush`` take its last add, while the roll closes it)."""
        self._wait_roll_locked()
        self._flush_locked()
        self._wait_roll_locked()

    def _wait_roll_locked(self) -> None:
        """Holding the lock: until no roll is under way (it always ends:
        the ledger close and the metadata writes have their own timeouts)."""
        while self._rolling:
            self._wake.wait(IDLE_WAIT_S)

    def _on_added(self, add: Future, seq: int, entry_id: int, futures: list[Future],
                  txids: list, payloads: list) -> None:
        """Driver thread (no lock taken): settle the records of one entry."""
        exc = add.exception()
        if exc is None and add.result() != entry_id:
            exc = BKError(f"log {self.name!r}: entry {add.result()} acknowledged where "
                          f"{entry_id} was expected")
        if exc is not None:
            err = self._fail(as_log_error(exc, self.name))
            complete_futures(self._futures_done, [(None, f) for f in settlers(futures)], err)
            return
        self._acked_at = time.monotonic()
        self._acknowledged = (seq, entry_id)
        listener = self._listener
        if listener is not None:
            listener(seq, entry_id, txids, payloads)
        singles, runs, run, part = [], [], None, None
        for slot, fut in enumerate(futures):
            if fut.__class__ is not RecordRun:
                singles.append((dlsn_of(seq, entry_id, slot), fut))
            elif fut is run:
                part[3] += 1
            else:
                run, part = fut, [seq, entry_id, slot, 1]
                fut.parts.append(part)
                runs.append((fut, part))
        for run, part in runs:  # a run whose last records these are is done
            run.left -= part[3]
            if not run.left:
                singles.append((run.parts, run.future))
        complete_futures(self._futures_done, singles, None)

    # -- the flusher: time-based flushes and control entries ---------------------------
    def _run(self) -> None:
        with self._lock:
            while not self._closed:
                now = time.monotonic()
                wait = IDLE_WAIT_S
                try:
                    if self._rolling:
                        pass  # nothing leaves until the roll ends (it notifies _wake)
                    elif self._buf_payloads and not self._driven:
                        due = self._buf_since + self._flush_s
                        if now >= due:
                            self._flush_locked()
                            continue
                        wait = due - now
                    elif self._control_due and self._control_s and self._error is None:
                        last = self._last_add
                        if last is not None and last.done():
                            due = self._acked_at + self._control_s
                            if now >= due:
                                self._flush_locked(control=True)
                                continue
                            wait = due - now
                        else:
                            wait = min(self._control_s, IDLE_WAIT_S)
                except BaseException as exc:  # noqa: BLE001 - kept as the writer's error
                    self._fail(exc)
                    log.warning("log %s: flush failed: %s", self.name, exc)
                self._wake.wait(max(wait, 0.0001))

    def listen(self, listener) -> tuple[DLSN, int]:
        """Call ``listener(seq, entry_id, txids, payloads)`` for every entry
        acknowledged from now on (None: stop).  Returns where that begins:
        the position after the last record sent so far (every later record
        is in an entry the listener is told of), and the id of the first
        such entry in this segment (an entry sent before may still be
        acknowledged after: the listener ignores those)."""
        with self._lock:
            self._listener = listener
            last_entry, last_slot = self._seg_last_data
            start = DLSN(self._seg.seq, last_entry, last_slot + 1) if last_entry >= 0 \
                else DLSN(self._seg.seq, 0, 0)
            return start, self._next_entry

    def acknowledged_now(self) -> tuple[int, int] | None:
        """(seq, entry id) of the last entry acknowledged so far (None before
        any), read on the ledger client's driver thread, which alone writes
        it.  From another thread that holds no lock the driver may wait for;
        ``BKError`` if the client is closed."""
        return self._client.driver.call(lambda: self._acknowledged).result(
            timeout=limits.CLIENT_CALL_TIMEOUT_S_MAX)

    # -- flush and close ------------------------------------------------------------------
    def add_entry(self, payloads, tags) -> Future:
        """A driven writer's next entry: exactly these records (cut by the
        caller to fit one entry: the buffer's own rule), sent now; the
        future's result is their positions as runs ``[segment seq, entry
        id, first slot, n]`` (``write_run_async``'s).  Raises the writer's
        error if it is broken."""
        batch = [self._checked(p) for p in payloads]
        if not self._driven or not self._tagged or len(tags) != len(batch) or not batch:
            raise ValueError("add_entry: a driven tagged writer, one tag per payload, >= 1")
        run = RecordRun(AddFuture(self._futures_done), len(batch))
        with self._lock:
            self._append_locked(batch, None, itertools.repeat(run, len(batch)), tags)
            self._flush_locked()
        return run.future

    def add_control(self) -> Future:
        """A driven writer's control entry (no records: the bookies learn the
        LAC from it), sent now; the future is done once it is acknowledged
        (at once when a segment roll is under way: the roll's close ends
        the segment at its last entry)."""
        with self._lock:
            self._check_usable()
            done = Future()
            if self._rolling:
                done.set_result(None)
                return done
            self._flush_locked(control=True)
            if self._error is not None:
                done.set_exception(self._error)
                return done
            return self._last_add

    def flush(self) -> None:
        """Send what is buffered and wait until everything written so far is
        durable (or raise the writer's error)."""
        with self._lock:
            self._check_usable()
            self._send_buffer_locked()
            last = self._last_add
        if last is not None:
            try:
                wait_result(last, limits.CLIENT_CALL_TIMEOUT_S_MAX, f"flush of log {self.name!r}")
            except BKError as exc:
                raise as_log_error(exc, self.name) from exc
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        """Flush, close the segment's ledger and mark the segment COMPLETED.
        Raises the writer's error if a write had failed (or the close found
        the writer fenced); a second call does nothing."""
        with self._lock:
            if self._closed:
                return
            if self._error is None:
                self._send_buffer_locked()
            self._wait_roll_locked()
            self._closed = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout=limits.CLIENT_CALL_TIMEOUT_S_MAX)
        with self._lock:
            if self._error is None:
                try:
                    self._complete_current()
                except BKError:
                    pass  # kept in self._error
            else:
                try:  # release the ledger handle; its error is already ours
                    self._wh.close()
                except BKError:
                    pass
        if self._error is not None:
            raise self._error

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
