"""The ledger reader: reads with failover and speculative reads, LAC reads
(``appliance.protocol.read_lac``), open without recovery, waiting for the
LAC to pass a value.  It never fences and never writes;
every request it sends carries the ledger's master key (bookies refuse
reads without it: ``appliance.protocol.read_access``).

Guarantees:

* A payload reaches the user only after its digest (over header and payload)
  verified *and* its header names the ledger and entry asked for; anything
  else counts as that replica failing and the read moves to the next replica
  of the entry's write set (in the fragment that holds it).
* A read is an explicit negative (``NoSuchEntryError``) only when every
  replica answered an explicit negative; if any replica answered "unknown"
  (error, timeout, BP-46 limbo) the entry gets further rounds, then fails
  with that unknown code.  Reads past the known LAC (or past the last entry
  of a closed ledger) are refused with ``NoSuchEntryError`` before anything
  is sent: an open without recovery reads nothing past the LAC.
* The reader's LAC only grows: from LAC reads, the LAC field of every entry
  read, and the last entry of a CLOSED ledger.
* ``read`` delivers payloads in entry order, one ``ReadDone`` per call.
* Checked in place (``invariant()``): no read returns past the LAC, and a
  CLOSED ledger's end is not below the LAC this reader was told.

* Batch mode (``read_batch_entries > 1`` and E == Qw, so every bookie of a
  fragment stores every entry of it): runs of entries are asked of one
  bookie at a time (``SendReadBatch``), rotating over the fragment.  Only
  the verified in-order prefix of a reply is kept; the first row that is
  not a good record is read again one by one under exactly the rules above
  (so a negative still needs every replica), and the rest of the run goes to
  the next bookie.  Batch mode changes the cost, never the answer.  A
  reply's records may come packed (``read_batch.PackedRecords``: one buffer and the
  lengths); they are checked by the injected ``verify_batch``:
  ``verify_run`` by default (the simulation), a vectorised check with the
  same answers in the client (``appliance.checks.record_check.verify_run_fast``).

* Speculative reads (``speculative_read_timeout_ms``, 0 = off): a request
  without an answer that long is also sent to the next replica of the
  round (a batch: to the next bookie of the fragment, once); the first
  verified payload wins and the other answer is dropped.  A negative from
  either copy counts as its own replica's answer only: the round ends once
  each replica was asked *and* every request out has answered, so an
  explicit negative still needs each replica's own "no" (BP-46), never the
  first answer of a race.  Timers are events: one tick every half
  speculative timeout while reads are out.
* Quarantine (``health``, ``appliance.protocol.quarantine``): replicas are
  asked in write-set order from ``entry % Qw`` with quarantined bookies
  last; errors, timeouts and speculated requests are strikes.  The order
  changes who is asked first, never what counts as an answer.

Bounds: ``read_window_entries`` single-entry reads and
``read_batches_in_flight`` batch requests in flight per read,
``read_entries_max`` per call, ``read_rounds_max`` rounds over the replicas per
entry, a run retried as a batch at most once per bookie of its fragment, a
timeout per request (one periodic tick scans the in-flight requests).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from appliance.protocol import events as ev
from appliance.protocol import limits
from appliance.protocol.core import CoreBase
from appliance.protocol.entry import verify_entry, verify_run
from appliance.protocol.errors import (
    OK,
    BKTimeoutError,
    DataUnknownError,
    DigestMismatchError,
    NoSuchEntryError,
    is_explicit_negative,
)
from appliance.protocol.invariant import invariant
from appliance.protocol.metadata import CLOSED, LedgerMetadata
from appliance.protocol.quarantine import BookieHealth
from appliance.protocol.quorum import ALL_PROTECTIONS, Protections
from appliance.protocol.read_lac import LacReads


@dataclass(frozen=True)
class ReaderConfig:
    # A replica that has not answered a read in this long counts as failed
    # and the next replica is asked.  Shorter: faster failover, more load.
    read_timeout_ms: int = 2_000
    # Entries of one read() in flight at once: throughput vs. memory.
    read_window_entries: int = 64
    # Largest read() span; bigger spans are refused (the driver splits them).
    read_entries_max: int = 10_000
    # Rounds over all replicas of one entry before the read fails.
    read_rounds_max: int = 3
    # wait_for_lac: how often to ask the bookies while waiting (READ_LAC
    # polls), or, with ``long_poll``, the pause after a round that failed.
    lac_poll_interval_ms: int = 100
    # wait_for_lac sends WAIT_LAC long polls (a bookie answers as soon as its
    # LAC passes the value) instead of polling READ_LAC.
    long_poll: bool = False
    # Entries per SendReadBatch when every bookie stores every entry
    # (E == Qw); 1 = one SendRead per entry.  Bigger: fewer messages (the
    # cost of a read is per message, not per entry); smaller: less to redo
    # when a bookie fails mid-batch.
    read_batch_entries: int = 1
    # Batch requests of one read() in flight at once (spread over the
    # fragment's bookies): throughput vs. memory.
    read_batches_in_flight: int = 4
    # A read not answered in this long is also sent to the next replica (in
    # batch mode: to the next bookie of the fragment); the first valid
    # answer wins.  0: off.  Shorter: a stalled bookie costs less, at the
    # price of duplicate reads when every bookie is slow.
    speculative_read_timeout_ms: int = limits.CLIENT_SPECULATIVE_READ_TIMEOUT_MS


class _EntryRead:
    __slots__ = ("entry_id", "replicas", "tried", "negatives", "unknown_code", "rounds",
                 "inflight", "sent_ms", "got")

    def __init__(self, entry_id: int, replicas: tuple[str, ...]):
        self.entry_id = entry_id
        self.replicas = replicas  # in the order they are asked
        self.tried = 0  # replicas asked in this round
        self.negatives = 0  # explicit negatives in this round
        self.unknown_code = OK
        self.rounds = 1
        self.inflight = 0  # requests out (more than one once a read was speculated)
        self.sent_ms = 0  # when the last one went out
        self.got = False  # a verified payload came back


class _ReadOp:
    __slots__ = ("read_id", "first", "last", "next_entry", "payloads", "done", "chunks",
                 "retry", "singles", "batches")

    def __init__(self, read_id: int, first: int, last: int):
        self.read_id, self.first, self.last = read_id, first, last
        self.next_entry = first  # one-by-one mode: the next entry to start
        self.payloads: dict[int, memoryview] = {}
        self.done = False
        # batch mode: runs (first, last, failed requests) still to ask, entries
        # to read one by one (the failover path), requests in flight
        self.chunks: deque[tuple[int, int, int]] = deque()
        self.retry: deque[int] = deque()
        self.singles = 0
        self.batches = 0


class LedgerReader(LacReads):
    """Client-side reader of one ledger (see module docstring; the LAC
    reads are ``appliance.protocol.read_lac``)."""

    _handler_names = {**CoreBase._handler_names,
                      ev.ReadBatchResponse: "_on_read_batch_response"}

    def __init__(self, metadata: LedgerMetadata, digest, *, master_key: bytes,
                 config: ReaderConfig | None = None, ids: Iterator[int] | None = None,
                 verify_batch=verify_run, health: BookieHealth | None = None,
                 protections: Protections = ALL_PROTECTIONS):
        """``master_key``: the ledger's key, sent with every read (bookies
        holding the key refuse reads without it).  ``verify_batch(records,
        digest, ledger_id, first_entry_id)``: the batch check of a reply's
        records, answering exactly as ``verify_run`` (a faster one, e.g.
        ``appliance.checks.record_check.verify_run_fast``, may be injected).
        ``health``: the client's ``BookieHealth`` (strikes, quarantine; may
        be shared by every reader of a client); None: every bookie is
        asked in write-set order.  ``protections``: the simulation's
        switches (production: all on)."""
        super().__init__(metadata.ledger_id, ids)
        self._key = master_key
        self.config = config or ReaderConfig()
        self._health = health
        self.protections = protections
        self.speculative_reads = 0  # reads this reader also sent to another replica
        self._spec_tick: int | None = None
        self._digest = digest
        self._verify_batch = verify_batch
        self._md = metadata
        self.last_add_confirmed = metadata.last_entry_id if metadata.state == CLOSED else -1
        # id -> op, entry, sent, bookie
        self._requests: dict[int, tuple[_ReadOp, _EntryRead, int, str]] = {}
        # id -> op, chunk (first, last, failures), sent, bookie, the ids of a
        # speculated chunk's requests (None: not speculated)
        self._batch_requests: dict[int, tuple] = {}
        self._batches_sent = 0
        self._reads: dict[int, _ReadOp] = {}
        self._lac_requests: dict[int, tuple] = {}  # id -> LAC op, sent (read_lac)
        self._poll_timers: dict[int, object] = {}  # timer -> LAC op
        self._tick: int | None = None

    # -- queries and metadata ------------------------------------------------------------
    @property
    def metadata(self) -> LedgerMetadata:
        return self._md

    @property
    def is_closed(self) -> bool:
        return self._md.state == CLOSED

    def update_metadata(self, metadata: LedgerMetadata) -> list:
        """A newer metadata version (e.g. the ledger got closed): fragments
        and, once CLOSED, the LAC follow it."""
        self._md = metadata
        if metadata.state == CLOSED:
            invariant(metadata.last_entry_id >= self.last_add_confirmed,
                      "ledger %d: closed at %d below the LAC %d a reader was told",
                      self.ledger_id, metadata.last_entry_id, self.last_add_confirmed,
                      rule="no-divergence")
            self._raise_lac(metadata.last_entry_id)
        return self._take()

    def learn_lac(self, entry_id: int) -> int:
        """The writer of an open ledger says entries up to ``entry_id`` are
        acknowledged (a log's owner, answering a reader: read your writes):
        reads may go that far.  Not past a CLOSED ledger's last entry (a
        claim beyond it is ignored).  Returns the LAC."""
        if not isinstance(entry_id, int) or entry_id < -1:
            raise ValueError(f"entry_id must be an int >= -1, got {entry_id!r}")
        if not self.is_closed or entry_id <= self._md.last_entry_id:
            self._raise_lac(entry_id)
        return self.last_add_confirmed

    def _raise_lac(self, lac: int) -> None:
        if lac > self.last_add_confirmed:
            self.last_add_confirmed = lac

    # -- open without recovery ----------------------------------------------------------
    def open(self, now_ms: int) -> list:
        """``OpenDone`` with the LAC: the last entry if CLOSED, else a LAC read."""
        if self.is_closed:
            self._out.append(ev.OpenDone(self.ledger_id, OK, self.last_add_confirmed, self._md))
        else:
            self._start_lac("open", None, None, None, now_ms)
        return self._take()

    # -- entry reads ---------------------------------------------------------------------------
    def read(self, first_entry_id: int, last_entry_id: int, now_ms: int,
             read_id: int | None = None) -> list:
        """Read entries first..last (inclusive); ``ReadDone`` carries them."""
        if first_entry_id < 0 or last_entry_id < first_entry_id:
            raise ValueError(f"need 0 <= first_entry_id <= last_entry_id, got "
                             f"{first_entry_id}..{last_entry_id}")
        if last_entry_id - first_entry_id + 1 > self.config.read_entries_max:
            raise ValueError(f"read of {last_entry_id - first_entry_id + 1} entries exceeds "
                             f"read_entries_max={self.config.read_entries_max}")
        op = _ReadOp(read_id if read_id is not None else self._next_id(),
                     first_entry_id, last_entry_id)
        if last_entry_id > self.last_add_confirmed:
            self._out.append(ev.ReadDone(op.read_id, self.ledger_id, NoSuchEntryError.code,
                                         first_entry_id))
            return self._take()
        self._reads[op.read_id] = op
        if self._batched():
            self._plan_chunks(op)
        self._fill_window(op, now_ms)
        return self._take()

    def _batched(self) -> bool:
        md = self._md
        return self.config.read_batch_entries > 1 and md.write_quorum == md.ensemble_size

    def _plan_chunks(self, op: _ReadOp) -> None:
        """Batch mode: the range as runs of at most ``read_batch_entries``,
        none crossing a fragment boundary."""
        step = self.config.read_batch_entries
        starts = [f for f, _ in self._md.ensembles]
        lo = op.first
        while lo <= op.last:
            ends = [f - 1 for f in starts if f > lo]
            hi = min(op.last, lo + step - 1, *ends)
            op.chunks.append((lo, hi, 0))
            lo = hi + 1
        op.next_entry = op.last + 1  # nothing for the one-by-one sequence

    def _fill_window(self, op: _ReadOp, now_ms: int) -> None:
        window = self.config.read_window_entries
        while not op.done and op.next_entry <= op.last \
                and op.next_entry - op.first - len(op.payloads) < window:
            entry_id = op.next_entry
            op.next_entry += 1
            self._start_entry(op, entry_id, now_ms)
        while not op.done and op.retry and op.singles < window:
            self._start_entry(op, op.retry.popleft(), now_ms)
        while not op.done and op.chunks and op.batches < self.config.read_batches_in_flight:
            self._send_chunk(op, op.chunks.popleft(), now_ms)
        self._arm_tick()

    def _start_entry(self, op: _ReadOp, entry_id: int, now_ms: int) -> None:
        """Replicas are asked from ``entry_id % Qw`` on (reads spread over
        the write set), quarantined ones last."""
        op.singles += 1
        replicas = self._md.write_set(entry_id)
        k = entry_id % len(replicas)
        if k:
            replicas = replicas[k:] + replicas[:k]
        if self._health is not None:
            replicas = self._health.order(replicas, now_ms)
        self._ask_next_replica(op, _EntryRead(entry_id, replicas), now_ms)

    def _send_chunk(self, op: _ReadOp, chunk: tuple[int, int, int], now_ms: int) -> None:
        """One SendReadBatch; successive chunks rotate over the fragment's
        bookies, skipping quarantined ones while another is left."""
        bookies = self._md.fragment_for(chunk[0])[1]
        index = (self._batches_sent + chunk[2]) % len(bookies)
        bookie = bookies[index]
        if self._health is not None and self._health.is_quarantined(bookie, now_ms):
            bookie = self._health.order(bookies[index:] + bookies[:index], now_ms)[0]
        self._batches_sent += 1  # over all reads: successive read() calls spread too
        self._send_batch(op, chunk, bookie, None, now_ms)

    def _send_batch(self, op: _ReadOp, chunk: tuple[int, int, int], bookie: str,
                    group: list | None, now_ms: int) -> int:
        op.batches += 1
        request_id = self._next_id()
        self._batch_requests[request_id] = (op, chunk, now_ms, bookie, group)
        if group is not None:
            group.append(request_id)
        self._out.append(ev.SendReadBatch(request_id, bookie, self.ledger_id, chunk[0],
                                          chunk[1], self._key))
        self._arm_spec_tick()
        return request_id

    def _on_read_batch_response(self, event: ev.ReadBatchResponse) -> None:
        """Keep the verified prefix of the rows.  A cut reply's rest is asked
        again as a batch; the first bad row (error, negative, bad digest) is
        read one by one with the full failover rules of ``SendRead``, and the
        rows after it go to the next bookie.  A request that failed as a whole
        goes to the next bookie, and after a failure on every bookie of the
        fragment its entries are read one by one."""
        found = self._batch_requests.pop(event.request_id, None)
        if found is None:
            self._stale()
            return
        op, (lo, hi, failures), _, bookie, group = found
        op.batches -= 1
        if op.done:
            return
        if event.code != OK and self._health is not None:
            self._health.strike(bookie, event.now_ms)
        if group is not None and not self._first_of_race(op, event, group):
            return
        next_id = self._take_rows(op, event, lo, hi) if event.code == OK else lo
        if next_id <= hi:
            bad_row = event.code == OK and len(event.entry_ids) > next_id - lo
            if event.code != OK:
                failures += 1
            if failures >= len(self._md.fragment_for(lo)[1]):
                op.retry.extend(range(next_id, hi + 1))
            elif bad_row:
                op.retry.append(next_id)
                if next_id < hi:
                    op.chunks.appendleft((next_id + 1, hi, failures + 1))
            elif next_id > lo or event.code != OK:
                op.chunks.appendleft((next_id, hi, failures))
            else:  # an OK reply without a single row: no progress, read one by one
                op.retry.extend(range(next_id, hi + 1))
        self._after_progress(op, event.now_ms)

    def _first_of_race(self, op: _ReadOp, event: ev.ReadBatchResponse, group: list) -> bool:
        """A speculated chunk: the first answer that is a reply wins and the
        copy still out is dropped; a failure is dropped while the copy may
        still answer (True: handle this reply)."""
        others = [r for r in group if r != event.request_id and r in self._batch_requests]
        if not others:
            return True
        if event.code != OK:
            return False
        for request_id in others:
            del self._batch_requests[request_id]
            op.batches -= 1
        return True

    def _take_rows(self, op: _ReadOp, event: ev.ReadBatchResponse, lo: int, hi: int) -> int:
        """Store the verified in-order prefix of the rows; the first id not stored."""
        rows = self._good_rows(event, lo, hi)
        payloads, top_lac = self._verify_batch(event.datas[:rows], self._digest,
                                               self.ledger_id, lo)
        invariant(len(payloads) <= rows, "ledger %d: the batch check returned %d payloads "
                  "of %d rows", self.ledger_id, len(payloads), rows)
        op.payloads.update(zip(range(lo, lo + len(payloads)), payloads, strict=True))
        self._raise_lac(top_lac)
        return lo + len(payloads)

    @staticmethod
    def _good_rows(event: ev.ReadBatchResponse, lo: int, hi: int) -> int:
        """The prefix of rows that are OK and numbered lo, lo + 1, ... hi."""
        ids, codes = event.entry_ids, event.codes
        n = min(len(ids), hi - lo + 1)
        if n and len(codes) == len(ids) and codes.count(OK) == len(codes) \
                and list(ids[:n]) == list(range(lo, lo + n)):
            return n  # the usual reply, checked without a Python loop
        rows = 0
        for entry_id, code in zip(ids, codes, strict=True):
            if entry_id != lo + rows or code != OK or entry_id > hi:
                break
            rows += 1
        return rows

    def _after_progress(self, op: _ReadOp, now_ms: int) -> None:
        if len(op.payloads) == op.last - op.first + 1:
            self._finish_read(op, OK)
        else:
            self._fill_window(op, now_ms)

    def _ask_next_replica(self, op: _ReadOp, entry: _EntryRead, now_ms: int) -> None:
        """Ask the next replica of this round.  Once each was asked, the
        round ends when the last request out has answered (a speculative
        copy may still be out): an explicit negative only when every
        replica answered one, else another round or the unknown code."""
        if op.done:
            return
        replicas = entry.replicas
        if entry.tried == len(replicas):
            if entry.inflight:
                return  # a request is still out: its answer decides
            invariant(entry.negatives <= len(replicas), "ledger %d: entry %d has %d "
                      "negatives from %d replicas", self.ledger_id, entry.entry_id,
                      entry.negatives, len(replicas))
            if entry.negatives == len(replicas):
                self._finish_read(op, NoSuchEntryError.code)
                return
            if entry.rounds >= self.config.read_rounds_max:
                self._finish_read(op, entry.unknown_code)
                return
            entry.rounds += 1
            entry.tried = entry.negatives = 0
        bookie = replicas[entry.tried]
        entry.tried += 1
        entry.inflight += 1
        entry.sent_ms = now_ms
        request_id = self._next_id()
        self._requests[request_id] = (op, entry, now_ms, bookie)
        self._out.append(ev.SendRead(request_id, bookie, self.ledger_id, entry.entry_id,
                                     False, self._key))
        self._arm_spec_tick()

    def _on_read_response(self, event: ev.ReadResponse) -> None:
        found = self._requests.pop(event.request_id, None)
        if found is None:
            self._stale()
            return
        op, entry, _, bookie = found
        entry.inflight -= 1
        if op.done or entry.got:
            return  # the other copy of a speculated read answered first
        if event.code == OK:
            try:
                lac, _, payload = verify_entry(event.data, self._digest, self.ledger_id,
                                               entry.entry_id)
            except DigestMismatchError:
                self._replica_failed(op, entry, bookie, DigestMismatchError.code, event.now_ms)
                return
            self._raise_lac(lac)
            entry.got = True
            op.payloads[entry.entry_id] = payload
            op.singles -= 1
            self._after_progress(op, event.now_ms)
        else:
            self._replica_failed(op, entry, bookie, event.code, event.now_ms)

    def _replica_failed(self, op: _ReadOp, entry: _EntryRead, bookie: str, code: int,
                        now_ms: int) -> None:
        """A replica answered without the entry: an explicit negative is
        counted (it decides only with every replica's), anything else is a
        strike against the bookie; then the next replica is asked."""
        if is_explicit_negative(code):
            entry.negatives += 1
            if not self.protections.read_negative_all:  # the simulation's broken switch
                self._finish_read(op, NoSuchEntryError.code)
                return
        else:
            if entry.unknown_code == OK or code == DataUnknownError.code:
                entry.unknown_code = code
            if self._health is not None:
                self._health.strike(bookie, now_ms)
        self._ask_next_replica(op, entry, now_ms)

    def _finish_read(self, op: _ReadOp, code: int) -> None:
        invariant(code != OK or op.last <= self.last_add_confirmed, "ledger %d: read of "
                  "%d..%d returned past the LAC %d", self.ledger_id, op.first, op.last,
                  self.last_add_confirmed)
        op.done = True
        self._reads.pop(op.read_id, None)
        for request_id in [r for r, found in self._requests.items() if found[0] is op]:
            del self._requests[request_id]
        for request_id in [r for r, found in self._batch_requests.items() if found[0] is op]:
            del self._batch_requests[request_id]
        payloads = tuple(map(op.payloads.__getitem__, range(op.first, op.last + 1))) \
            if code == OK else ()
        self._out.append(ev.ReadDone(op.read_id, self.ledger_id, code, op.first, payloads))

    # -- timers -----------------------------------------------------------------------------------
    def _arm_tick(self) -> None:
        if self._tick is None and (self._requests or self._lac_requests
                                   or self._batch_requests):
            self._tick = self._timer(max(1, self.config.read_timeout_ms // 2))

    def _on_timer(self, event: ev.TimerFired) -> None:
        op = self._poll_timers.pop(event.timer_id, None)
        if op is not None:
            self._send_lac_round(op, event.now_ms)
            return
        if event.timer_id == self._spec_tick:
            self._spec_tick = None
            self._speculate(event.now_ms)
            self._arm_spec_tick()
            return
        if event.timer_id != self._tick:
            self._stale()
            return
        self._tick = None
        self._expire(event.now_ms)
        self._arm_tick()

    def _expire(self, now_ms: int) -> None:
        """Requests older than the read timeout count as failed replies."""
        timeout_ms = self.config.read_timeout_ms
        late = [r for r, found in self._requests.items() if now_ms - found[2] >= timeout_ms]
        for request_id in late:
            found = self._requests.pop(request_id, None)
            if found is None:
                continue
            op, entry, _, bookie = found
            entry.inflight -= 1
            if not op.done and not entry.got:
                self._replica_failed(op, entry, bookie, BKTimeoutError.code, now_ms)
        late = [r for r, found in self._batch_requests.items()
                if now_ms - found[2] >= timeout_ms]
        for request_id in late:
            if request_id in self._batch_requests:
                self._on_read_batch_response(ev.ReadBatchResponse(
                    request_id, "", self.ledger_id, BKTimeoutError.code, now_ms=now_ms))
        late = [r for r, found in self._lac_requests.items() if now_ms - found[1] >= timeout_ms]
        for request_id in late:
            found = self._lac_requests.pop(request_id, None)
            if found is not None:
                found[0].errors += 1
                self._check_lac_round(found[0], now_ms)

    # -- speculative reads ---------------------------------------------------------------------
    def _arm_spec_tick(self) -> None:
        """A tick every half speculative timeout while reads are out: a read
        is speculated between one and one and a half timeouts after it was
        sent."""
        spec_ms = self.config.speculative_read_timeout_ms
        if self._spec_tick is None and spec_ms > 0 and (self._requests or self._batch_requests):
            self._spec_tick = self._timer(max(1, spec_ms // 2))

    def _speculate(self, now_ms: int) -> None:
        """Each read out for a speculative timeout without an answer is also
        sent to the next replica (a single entry: the next of its round; a
        batch: the next bookie of the fragment, once).  The slow bookie gets
        a strike.  The answers then race: the first payload wins, while a
        negative still counts only as that one replica's (see
        ``_ask_next_replica``)."""
        spec_ms = self.config.speculative_read_timeout_ms
        slow = {}
        for op, entry, _, _ in self._requests.values():
            if not op.done and not entry.got and entry.tried < len(entry.replicas) \
                    and now_ms - entry.sent_ms >= spec_ms:
                slow[id(entry)] = (op, entry)
        for op, entry in slow.values():
            self._speculated(entry.replicas[entry.tried - 1], now_ms)
            self._ask_next_replica(op, entry, now_ms)
        late = [(r, found) for r, found in self._batch_requests.items()
                if found[4] is None and not found[0].done and now_ms - found[2] >= spec_ms]
        for request_id, (op, chunk, sent_ms, bookie, _) in late:
            bookies = self._md.fragment_for(chunk[0])[1]
            if len(bookies) < 2:
                continue
            index = bookies.index(bookie) if bookie in bookies else -1
            others = bookies[index + 1:] + bookies[:max(0, index)]
            if self._health is not None:
                others = self._health.order(others, now_ms)
            group = [request_id]
            self._batch_requests[request_id] = (op, chunk, sent_ms, bookie, group)
            self._speculated(bookie, now_ms)
            self._send_batch(op, chunk, others[0], group, now_ms)

    def _speculated(self, slow_bookie: str, now_ms: int) -> None:
        self.speculative_reads += 1
        if self._health is not None:
            self._health.speculative_reads += 1
            self._health.strike(slow_bookie, now_ms)
