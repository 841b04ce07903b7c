"""The ledger writer: entry ids, write sets, ack quorums, in-order
acknowledgement, LAC piggybacking, ensemble changes and the writer's close.

Guarantees (each checked by the simulation in ``tests/sim``):

* An entry is acknowledged (``CompleteAdds``) only once ``Qa`` bookies of its
  write set *in the fragment that holds it* have acknowledged it, and only
  after every lower entry: the LAC is a prefix of durably replicated entries.
* Every entry carries the LAC of the moment it was made.
* A bookie that errs (or disconnects) is replaced by an ensemble change: a
  new fragment from ``LAC + 1`` written to metadata by CAS before any entry is
  sent to the replacement, chosen host-aware (``placement``).  One that leaves adds unanswered for
  ``add_timeout_ms`` first gets them resent (``add_retries_max`` times in a
  row: a resend is the same record under the same id, no different from a
  duplicated message), then it is replaced.  Acks the failed bookie gave to
  unacknowledged entries are forgotten at once (it is not in their new write
  set).  On a CAS conflict the writer rereads: if the ledger is no longer
  OPEN every pending add fails with ``LedgerFencedError``; if only bookies of
  sealed fragments changed (re-replication: those entries were acknowledged
  before the next fragment began) it adopts the metadata and retries.
* ``close()`` freezes the LAC and CASes the ledger to CLOSED at it; on a
  conflict: IN_RECOVERY -> ``LedgerFencedError``; CLOSED at the same entry ->
  success; CLOSED elsewhere -> ``MetadataVersionError``.  Adds still pending
  fail with ``LedgerClosedError`` ("may or may not be stored").  A close
  that succeeded then emits one ``SendWriteClose`` per bookie of the current
  ensemble (BP-32, advisory: after ``CloseDone``, and no reply is awaited).

Faults survived: lost, duplicated, reordered and late replies (acks are a
set per entry; replies from bookies outside an entry's current write set are
ignored), bookie crashes and timeouts (ensemble change), a concurrent
recovery (fenced replies or a CAS conflict stop the writer).

Cost: O(Qw) per add and O(1) per ack; a periodic tick (one timer) checks
each bookie's oldest unacknowledged add, not every entry.  The rules above
it holds the state for are also checked in place with ``invariant()``
(docs/PROTOCOL_CORE.md, "In-core invariants"): O(1) per acknowledged entry.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from appliance.protocol import events as ev
from appliance.protocol.core import CoreBase
from appliance.protocol.entry import HEADER, HEADER_BYTES
from appliance.protocol.errors import (
    OK,
    BKTimeoutError,
    LedgerClosedError,
    LedgerFencedError,
    MetadataVersionError,
    NotEnoughBookiesError,
    TooManyRequestsError,
    UnauthorizedError,
)
from appliance.protocol.invariant import invariant
from appliance.protocol.metadata import CLOSED, IN_RECOVERY, OPEN, LedgerMetadata
from appliance.protocol.placement import check_mode
from appliance.protocol.quorum import ALL_PROTECTIONS, Protections, WriteSets, in_write_set

OPEN_STATE, CLOSING, CLOSED_STATE, FENCED, FAILED = "open", "closing", "closed", "fenced", "failed"


@dataclass(frozen=True)
class WriterConfig:
    # A bookie that leaves an add unacknowledged this long gets it resent,
    # and after add_retries_max such timeouts in a row it is replaced.
    # Shorter: faster failover; longer: fewer needless ensemble changes.
    add_timeout_ms: int = 3_000
    # Resends before a silent bookie is replaced.  More rides out longer
    # stalls (bookies sharing a disk all stall together, and replacing them
    # all ends in NotEnoughBookiesError); fewer replaces a hung bookie sooner
    # (after about (add_retries_max + 1) * add_timeout_ms).  A bookie that
    # answers with an error or disconnects is replaced at once.
    add_retries_max: int = 1
    # Adds in flight (sent, not yet acknowledged).  Bounds memory; add()
    # beyond it raises TooManyRequestsError so the driver applies backpressure.
    pending_adds_max: int = 10_000
    # Largest payload accepted, in bytes.
    entry_bytes_max: int = 1 << 20
    # CAS conflicts tolerated per metadata operation before giving up.
    metadata_retries_max: int = 8
    # Ensemble changes in a row without the LAC moving before the writer
    # gives up with NotEnoughBookiesError (a bound on churn).
    ensemble_changes_max: int = 16
    # Send the LAC to the ensemble when it has not moved on in this long, so
    # tailing readers see the last entry (0 = never).  Costs one small
    # message per bookie per interval while the writer is idle.
    explicit_lac_interval_ms: int = 0
    # How replacements are placed (appliance.protocol.placement): "host" and
    # "rack" keep the write sets holding the position on distinct hosts when
    # a spare allows it (then prefer another rack); "none" takes the first spare.
    placement: str = "host"

    def tick_ms(self) -> int:
        tick = max(1, self.add_timeout_ms // 4)
        if self.explicit_lac_interval_ms > 0:
            tick = min(tick, self.explicit_lac_interval_ms)
        return tick


class _MetaOp:
    """One in-flight metadata operation (ensemble change or close)."""

    __slots__ = ("kind", "write_id", "read_id", "metadata", "replaced", "tries")

    def __init__(self, kind: str, write_id: int, metadata: LedgerMetadata,
                 replaced: frozenset = frozenset(), tries: int = 0):
        self.kind = kind
        self.write_id = write_id
        self.read_id: int | None = None
        self.metadata = metadata
        self.replaced = replaced
        self.tries = tries


class LedgerWriter(CoreBase):
    """Client-side writer of one OPEN ledger (see module docstring)."""

    def __init__(self, metadata: LedgerMetadata, version: int, master_key: bytes, digest, *,
                 config: WriterConfig | None = None, available_bookies: Sequence[str] = (),
                 ids: Iterator[int] | None = None, locations: Mapping | None = None,
                 protections: Protections = ALL_PROTECTIONS):
        super().__init__(metadata.ledger_id, ids)
        invariant(metadata.state == OPEN, f"ledger {metadata.ledger_id} is not OPEN")
        self.config = config or WriterConfig()
        self._change_holds_acks = protections.change_holds_acks  # off: the simulation only
        self._late_refusal = protections.late_refusal  # off: the simulation only
        self.placement = check_mode(self.config.placement)
        self.locations.update(locations or {})
        self._md, self._version = metadata, version
        self._key, self._digest = master_key, digest
        self._qw, self._qa = metadata.write_quorum, metadata.ack_quorum
        self._size = metadata.ensemble_size
        self._ws = WriteSets(metadata.last_fragment[1], self._qw)
        # per first position (entry id % E): the bit mask of the positions
        # outside its write set, none of which may acknowledge the entry
        # (checked in _advance; depends on E and Qw only, not on the bookies)
        self._not_ws_masks = tuple(~sum(1 << p for p in ps) for ps in self._ws.positions)
        self.available_bookies = tuple(available_bookies)
        self.last_add_confirmed = -1
        self.last_add_pushed = -1
        self.length = 0  # payload bytes of entries 0..last_add_confirmed
        self._length_pushed = 0
        # Adds in flight, by entry id: the record, and the ensemble positions that
        # acknowledged it (bit i: position i; the ack count is its popcount).  Plain
        # dicts of bytes and ints: no object per add (cheaper to make, and nothing
        # more for the garbage collector to scan).
        self._data: dict[int, bytes] = {}
        self._acks: dict[int, int] = {}
        self._held: set[int] = set()  # made during an ensemble change: not sent yet
        self._overhead = HEADER_BYTES + digest.size  # record bytes that are not payload
        self._failed: set[int] = set()  # ensemble positions awaiting replacement
        self._op: _MetaOp | None = None
        self._close_requested = False
        self._state = OPEN_STATE
        self.error_code = OK
        # per position: batches sent, (entry ids, sent ms): immutable tuples of
        # ints, one shared by every position of an E=W batch, which the garbage
        # collector stops tracking (lists of them, one per position, were a
        # tenth of the objects each add kept alive); and the index of the first
        # entry of the front batch that may still be unacknowledged (lists, not
        # deques: a deque is 760 bytes even empty, and a client holds one
        # writer per open ledger; the front is dropped by one slice deletion)
        self._outstanding: list[list] = [[] for _ in range(self._size)]
        self._cursor = [0] * self._size
        self._retries = [0] * self._size  # timeouts in a row per position
        self._resent_ms = [-1] * self._size  # when each position was last resent to
        self.add_retries = 0  # batches resent after a timeout (a counter for tests/stats)
        self._tick: int | None = None
        self.lac_written = -1  # highest LAC sent with SendWriteLac (explicit LAC)
        self._lac_moved_ms = 0
        self._changes_in_a_row = 0
        self.ensemble_changes = 0

    # -- queries ------------------------------------------------------------------
    @property
    def state(self) -> str:
        return self._state

    @property
    def metadata(self) -> LedgerMetadata:
        return self._md

    @property
    def pending_count(self) -> int:
        return len(self._data)

    # -- user calls ---------------------------------------------------------------
    def add(self, payload: bytes, now_ms: int) -> list:
        """Queue one entry; its id is ``last_add_pushed`` afterwards."""
        return self.add_many((payload,), now_ms)

    def add_many(self, payloads: Sequence[bytes], now_ms: int, checked: bool = False) -> list:
        """Queue entries with consecutive ids (one ``SendAdd`` per bookie).
        ``checked``: the caller already checked every payload's type and its
        size against ``entry_bytes_max`` (a write handle does, as each add
        arrives), so they are not checked again here."""
        if not checked:
            self._check_payloads(payloads)
        first = self.last_add_pushed + 1
        if self._state != OPEN_STATE:
            self.last_add_pushed += len(payloads)
            code = self.error_code if self.error_code != OK else LedgerClosedError.code
            self._out.append(ev.FailAdds(self.ledger_id, first, self.last_add_pushed, code))
            return self._take()
        if len(self._data) + len(payloads) > self.config.pending_adds_max:
            raise TooManyRequestsError(f"{len(self._data)} adds in flight; limit is "
                                       f"pending_adds_max={self.config.pending_adds_max}")
        held = self._op is not None
        ids, records = self._make_entries(payloads, held)
        if not held:
            self._send(ids, records, None, now_ms)
        self._arm_tick()
        return self._take()

    def close(self, now_ms: int) -> list:
        """Close at the LAC; one ``CloseDone`` reports the outcome.  Calling it
        again while that close is in flight adds nothing; after it, it
        reports the same outcome again."""
        if self._state == CLOSED_STATE:
            self._out.append(ev.CloseDone(self.ledger_id, OK, self.last_add_confirmed))
        elif self._state == FENCED:
            self._out.append(ev.CloseDone(self.ledger_id, self.error_code,
                                          self.last_add_confirmed))
        elif not self._close_requested:
            self._close_requested = True
            self._state = CLOSING  # the LAC is frozen from here on
            if self._op is None:
                self._start_close()
        return self._take()

    def _check_payloads(self, payloads: Sequence[bytes]) -> None:
        limit = self.config.entry_bytes_max
        for payload in payloads:
            if not isinstance(payload, bytes | bytearray | memoryview):
                raise TypeError(f"payload must be bytes, got {type(payload).__name__}")
            if len(payload) > limit:
                raise ValueError(f"payload of {len(payload)} bytes exceeds "
                                 f"entry_bytes_max={limit}")

    def _make_entries(self, payloads: Sequence[bytes], held: bool) -> tuple[list, list]:
        """The new entries' ids and records (now pending)."""
        lac, length = self.last_add_confirmed, self._length_pushed
        first = entry_id = self.last_add_pushed + 1
        invariant(lac < first, "ledger %d: entry %d would carry LAC %d, not below its id",
                  self.ledger_id, first, lac)
        pack, compute, ledger = HEADER.pack, self._digest.compute, self.ledger_id
        records = []
        for payload in payloads:
            length += len(payload)
            header = pack(ledger, entry_id, lac, length)
            records.append(b"".join((header, compute(header, payload), payload)))
            entry_id += 1
        ids = range(first, entry_id)
        self._data.update(zip(ids, records, strict=True))
        self._acks.update(dict.fromkeys(ids, 0))
        if held:
            self._held.update(ids)
        self.last_add_pushed, self._length_pushed = entry_id - 1, length
        return list(ids), records

    def _records(self, entry_ids: Sequence[int]) -> list[bytes]:
        data = self._data
        return [data[e] for e in entry_ids]

    # -- sending --------------------------------------------------------------------
    def _send(self, entry_ids: Sequence[int], records: Sequence[bytes],
              only: frozenset | None, now_ms: int) -> None:
        """Send entries (ids and their records) to their write sets (or only to
        positions ``only``).  Each bookie's batch is remembered once
        (``_outstanding``), not per entry."""
        size = self._size
        if self._qw == size:  # every position stores every entry: one batch for all
            if not entry_ids:
                return
            sent, datas = (tuple(entry_ids), now_ms), tuple(records)
            batches = ((pos, sent, datas) for pos in range(size) if only is None or pos in only)
        else:
            lists: dict[int, tuple[list, list]] = {}
            positions_of = self._ws.positions
            for entry_id, record in zip(entry_ids, records, strict=True):
                for pos in positions_of[entry_id % size]:
                    if only is None or pos in only:
                        ids, recs = lists.setdefault(pos, ([], []))
                        ids.append(entry_id)
                        recs.append(record)
            batches = ((pos, (tuple(ids), now_ms), tuple(recs))
                       for pos, (ids, recs) in lists.items())
        for pos, sent, datas in batches:
            self._outstanding[pos].append(sent)
            self._out.append(ev.SendAdd(self._next_id(), self._ws.ensemble[pos], self.ledger_id,
                                        sent[0], datas, False, self._key))

    # -- replies ----------------------------------------------------------------------
    def _on_add_response(self, event: ev.AddResponse) -> None:
        acks = self._acks.get(event.entry_id)
        pos = self._ws.index.get(event.bookie_id)
        if (self._state != OPEN_STATE or pos is None
                or not in_write_set(pos, event.entry_id, self._size, self._qw)):
            self._stale()
            return
        code = event.code
        if acks is None or event.entry_id in self._held:
            if acks is None and code != OK and event.entry_id <= self.last_add_confirmed \
                    and self._late_refusal:
                # The ack quorum confirmed the entry before this bookie
                # refused it (read-only, I/O error, ...): the entry is a copy
                # short and every later one would be too, so the refusal
                # counts as it would have a moment earlier (as BookKeeper
                # changes the ensemble on any failed write).
                self._refused(pos, code, event.now_ms)
            else:  # acknowledged already (a late ack), or never sent
                self._stale()
            return
        if code == OK:
            bit = 1 << pos
            if pos in self._failed or acks & bit:
                return
            acks |= bit
            self._acks[event.entry_id] = acks
            if acks.bit_count() >= self._qa and event.entry_id == self.last_add_confirmed + 1:
                self._advance(event.now_ms)
        else:
            self._refused(pos, code, event.now_ms)

    def _refused(self, pos: int, code: int, now_ms: int) -> None:
        """The bookie at ``pos`` answered an add of its write set with ``code``."""
        if code == LedgerFencedError.code:
            self._stop(FENCED, LedgerFencedError.code)
        elif code == UnauthorizedError.code:
            self._stop(FAILED, UnauthorizedError.code)
        elif code != BKTimeoutError.code:  # no answer is not an error: the tick retries
            self._bookie_failed(pos, now_ms)

    def _on_add_responses(self, event: ev.AddResponses) -> None:
        """The batch path: the checks that hold for the whole batch once, then
        a tight loop; anything but OK falls back to the one-reply path."""
        pos = self._ws.index.get(event.bookie_id)
        if self._state != OPEN_STATE or pos is None or pos in self._failed:
            super()._on_add_responses(event)
            return
        entry_ids, codes = event.entry_ids, event.codes
        if entry_ids and max(entry_ids) <= self.last_add_confirmed and \
                codes.count(OK) == len(codes) == len(entry_ids):
            # the usual last reply of a write quorum wider than the ack quorum:
            # every entry acknowledged already, so each is a late ack (as below)
            self.stale_replies += len(entry_ids)
            return
        bit, size, qw, qa = 1 << pos, self._size, self._qw, self._qa
        acks_map, held, advance = self._acks, self._held, False
        next_id = self.last_add_confirmed + 1
        for entry_id, code in zip(event.entry_ids, event.codes, strict=True):
            if code != OK:
                self._on_add_response(ev.AddResponse(event.request_id, event.bookie_id,
                                                     event.ledger_id, entry_id, code,
                                                     event.now_ms))
                if self._state != OPEN_STATE or pos in self._failed:
                    break  # this bookie's remaining acks no longer count
                continue
            acks = acks_map.get(entry_id)
            if acks is None or (held and entry_id in held):  # acknowledged already (the
                self.stale_replies += 1  # late ack of a quorum), or never sent: as
                continue  # _on_add_response
            if acks & bit or (pos - entry_id) % size >= qw:
                continue
            acks |= bit
            acks_map[entry_id] = acks
            if entry_id == next_id and acks.bit_count() >= qa:
                advance = True
        if advance and self._state == OPEN_STATE:
            self._advance(event.now_ms)

    def _advance(self, now_ms: int) -> None:
        op = self._op
        if op is not None and op.kind == "ensemble" and self._change_holds_acks:
            # No entry is acknowledged while an ensemble change is in flight
            # (as BookKeeper holds its add callbacks): the new fragment starts
            # at the LAC of the change's start, and an entry confirmed now by
            # the surviving bookies would leave ``_data`` unsent to the
            # replacement the metadata names for it - a copy short for good.
            # ``_apply_ensemble_change`` advances once it has resent them.
            return
        first = entry_id = self.last_add_confirmed + 1
        acks_map, data_map, held, qa = self._acks, self._data, self._held, self._qa
        length, overhead = self.length, self._overhead
        outside, size, stray = self._not_ws_masks, self._size, 0
        if self._failed:  # rare: a position awaits replacement; its acks were forgotten
            gone = sum(1 << p for p in self._failed)
            outside = tuple(m | gone for m in outside)
        while True:
            acks = acks_map.get(entry_id)
            if acks is None or acks.bit_count() < qa or (held and entry_id in held):
                break
            stray |= acks & outside[entry_id % size]  # acks from outside its write set
            del acks_map[entry_id]
            length += len(data_map.pop(entry_id)) - overhead
            entry_id += 1
        self.length = length
        if entry_id > first:
            if stray or self._state != OPEN_STATE or entry_id - 1 > self.last_add_pushed \
                    or (op is not None and op.kind == "ensemble" and self._change_holds_acks):
                self._check_acknowledged(first, entry_id - 1, stray)  # raises
            self.last_add_confirmed = entry_id - 1
            self._changes_in_a_row = 0
            self._lac_moved_ms = now_ms
            self._out.append(ev.CompleteAdds(self.ledger_id, first, entry_id - 1))
            self._arm_tick(now_ms)

    def _check_acknowledged(self, first: int, last: int, stray: int) -> None:
        """The rules of acknowledging ``first..last``, with their messages:
        called only when ``_advance``'s one-line guard saw one broken (the
        guard is the per-ack cost: a few comparisons, no call)."""
        lid = self.ledger_id
        invariant(self._state == OPEN_STATE, "ledger %d: writer acknowledging %d..%d in state "
                  "%s (the LAC is frozen from close() or a stop on)", lid, first, last,
                  self._state)
        invariant(last <= self.last_add_pushed, "ledger %d: acknowledging %d..%d, made only "
                  "up to %d", lid, first, last, self.last_add_pushed)
        invariant(not stray, "ledger %d: %d..%d acknowledged with acks from positions %s, "
                  "outside their write sets or awaiting replacement (Qa acks of the write "
                  "set are needed)", lid, first, last, bin(stray))
        op = self._op
        invariant(op is None or op.kind != "ensemble" or not self._change_holds_acks,
                  "ledger %d: %d..%d acknowledged while an ensemble change is in flight",
                  lid, first, last)

    def _bookie_failed(self, pos: int, now_ms: int) -> None:
        if self._state != OPEN_STATE or pos in self._failed:
            return
        self._failed.add(pos)
        bit = 1 << pos
        acks_map = self._acks
        for entry_id, acks in acks_map.items():  # rare: only on a failure
            if acks & bit:
                acks_map[entry_id] = acks & ~bit
        if self._op is None:
            self._start_ensemble_change()

    # -- ensemble change ------------------------------------------------------------
    def _start_ensemble_change(self, tries: int = 0) -> None:
        if self._changes_in_a_row >= self.config.ensemble_changes_max:
            self._stop(FAILED, NotEnoughBookiesError.code)
            return
        taken = set(self._ws.ensemble)
        spares = [b for b in self.available_bookies if b not in taken]
        replaced = sorted(self._failed)
        ensemble = self.replace_bookies(self._ws.ensemble, self._qw, replaced, spares)
        if ensemble is None:
            self._stop(FAILED, NotEnoughBookiesError.code)
            return
        start = self.last_add_confirmed + 1
        invariant(start >= self._md.last_fragment[0], "ledger %d: writer would start a "
                  "fragment at %d, before the last one at %d", self.ledger_id, start,
                  self._md.last_fragment[0], rule="fragments")
        new_md = self._md.with_fragment(start, ensemble)
        self._changes_in_a_row += 1
        self.ensemble_changes += 1
        self._write_metadata("ensemble", new_md, frozenset(replaced), tries)

    def _apply_ensemble_change(self, op: _MetaOp, version: int, now_ms: int) -> None:
        start = op.metadata.last_fragment[0]
        invariant(not self._change_holds_acks or start == self.last_add_confirmed + 1,
                  "ledger %d: the LAC moved to %d while the change to a fragment at %d was "
                  "in flight", self.ledger_id, self.last_add_confirmed, start)
        self._md, self._version = op.metadata, version
        self._ws = WriteSets(op.metadata.last_fragment[1], self._qw)
        self._failed -= op.replaced
        for pos in op.replaced:
            self._outstanding[pos] = []
            self._cursor[pos] = 0
            self._retries[pos], self._resent_ms[pos] = 0, -1
        held_set = self._held
        sent = [e for e in self._data if e not in held_set]
        held = [e for e in self._data if e in held_set]
        self._send(sent, self._records(sent), op.replaced, now_ms)
        self._held = set()
        self._send(held, self._records(held), None, now_ms)
        if self._state == OPEN_STATE:  # acks the surviving bookies gave meanwhile
            self._advance(now_ms)
        self._arm_tick()
        if self._close_requested:
            self._start_close()
        elif self._failed:
            self._start_ensemble_change()

    # -- close ------------------------------------------------------------------------
    def _start_close(self, tries: int = 0) -> None:
        new_md = self._md.to_closed(self.last_add_confirmed, self.length)
        self._write_metadata("close", new_md, frozenset(), tries)

    def _closed_by_us(self, code: int) -> None:
        if code == OK:
            md = self._md
            invariant(md.state == CLOSED and md.last_entry_id == self.last_add_confirmed,
                      "ledger %d: writer reports a close at its LAC %d; the metadata is %s "
                      "at %d", self.ledger_id, self.last_add_confirmed, md.state,
                      md.last_entry_id, rule="one-close")
        self._fail_pending(LedgerClosedError.code)
        self._state = CLOSED_STATE if code == OK else FENCED
        self.error_code = LedgerClosedError.code if code == OK else code
        self._out.append(ev.CloseDone(self.ledger_id, code, self.last_add_confirmed))
        if code == OK:  # BP-32: advisory, after the close is done; nothing waits for it
            for bookie in self._ws.ensemble:
                self._out.append(ev.SendWriteClose(self._next_id(), bookie, self.ledger_id,
                                                   self._key))

    # -- metadata loop ------------------------------------------------------------------
    def _write_metadata(self, kind: str, new_md: LedgerMetadata, replaced: frozenset,
                        tries: int) -> None:
        op = _MetaOp(kind, self._next_id(), new_md, replaced, tries)
        self._op = op
        self._out.append(ev.WriteMetadata(op.write_id, self.ledger_id, new_md, self._version))

    def _on_metadata_written(self, event: ev.MetadataWritten) -> None:
        op = self._op
        if op is None or event.request_id != op.write_id:
            self._stale()
            return
        if event.code != OK:  # conflict (or store error): reread, then decide
            op.read_id = self._next_id()
            self._out.append(ev.ReadMetadata(op.read_id, self.ledger_id))
            return
        self._op = None
        if op.kind == "close":
            self._md, self._version = op.metadata, event.version
            self._closed_by_us(OK)
        elif self._state in (OPEN_STATE, CLOSING):
            self._apply_ensemble_change(op, event.version, event.now_ms)
        else:  # stopped meanwhile: keep the metadata view exact all the same
            self._md, self._version = op.metadata, event.version

    def _on_metadata_read(self, event: ev.MetadataRead) -> None:
        op = self._op
        if op is None or event.request_id != op.read_id:
            self._stale()
            return
        self._op = None
        md = event.metadata
        if event.code != OK or md is None:
            self._retry_or_stop(op, event)
            return
        invariant(md.state != CLOSED or md.last_entry_id >= self.last_add_confirmed,
                  "ledger %d: closed at %d below the writer's LAC %d", self.ledger_id,
                  md.last_entry_id, self.last_add_confirmed, rule="no-divergence")
        if md.state == OPEN and md.ensembles != self._md.ensembles \
                and not self._md.sealed_bookies_replaced(md):
            # only this writer changes an OPEN ledger's last fragment: someone is meddling
            self._stop(FENCED, MetadataVersionError.code)
        elif md.state == OPEN:
            # re-replication may have re-pointed a sealed fragment (its entries are all
            # acknowledged): adopt it, so the retried change or close keeps it
            self._md, self._version = md, event.version
            self._retry_or_stop(op, event)
        elif op.kind == "close" and md.state == CLOSED:
            self._md, self._version = md, event.version
            same = md.last_entry_id == self.last_add_confirmed
            self._closed_by_us(OK if same else MetadataVersionError.code)
        else:  # IN_RECOVERY or CLOSED by a recovery: this writer was fenced
            self._md, self._version = md, event.version
            self._stop(FENCED, LedgerFencedError.code)

    def _retry_or_stop(self, op: _MetaOp, event: ev.MetadataRead) -> None:
        if op.tries + 1 > self.config.metadata_retries_max:
            # the store's own error when it could not even be read (unreachable:
            # MetadataUnavailableError), else the conflicts that used every retry
            self._stop(FAILED, event.code if event.code != OK else MetadataVersionError.code)
        elif self._close_requested:
            self._start_close(op.tries + 1)
        elif self._state == OPEN_STATE:
            self._start_ensemble_change(op.tries + 1)

    # -- failure ------------------------------------------------------------------------
    def _fail_pending(self, code: int) -> None:
        first = self.last_add_confirmed + 1
        if self.last_add_pushed >= first:
            self._out.append(ev.FailAdds(self.ledger_id, first, self.last_add_pushed, code))
        self._data.clear()
        self._acks.clear()
        self._held.clear()
        for outstanding in self._outstanding:
            outstanding.clear()
        self._cursor = [0] * self._size

    def _stop(self, state: str, code: int) -> None:
        """Fail every pending add; later adds fail at once with ``code``."""
        if self._state in (CLOSED_STATE, FENCED) or (self._state == FAILED and state == FAILED):
            return
        self._fail_pending(code)
        self._state, self.error_code = state, code
        if self._close_requested and self._op is None:
            self._out.append(ev.CloseDone(self.ledger_id, code, self.last_add_confirmed))

    # -- timers: add timeouts and explicit LAC ---------------------------------------
    def _arm_tick(self, now_ms: int | None = None) -> None:
        """Keep one tick armed while adds are pending (their timeouts) or the
        LAC is still to publish.  With only the LAC left (``now_ms`` given),
        the tick falls when the writer will have been idle for
        ``explicit_lac_interval_ms``: the LAC goes out one interval after it
        last moved, not up to a tick later."""
        interval = self.config.explicit_lac_interval_ms
        lac_to_write = interval > 0 and self.last_add_confirmed > self.lac_written
        if self._tick is None and self._state == OPEN_STATE and (self._data or lac_to_write):
            delay = self.config.tick_ms()
            if not self._data and now_ms is not None:
                delay = min(delay, max(1, self._lac_moved_ms + interval - now_ms))
            self._tick = self._timer(delay)

    def _on_timer(self, event: ev.TimerFired) -> None:
        if event.timer_id != self._tick:
            self._stale()
            return
        self._tick = None
        if self._state != OPEN_STATE:
            return
        self._check_timeouts(event.now_ms)
        self._maybe_write_lac(event.now_ms)
        self._arm_tick(event.now_ms)

    def _check_timeouts(self, now_ms: int) -> None:
        """A bookie whose oldest unacknowledged add is ``add_timeout_ms`` old
        gets its unacknowledged adds resent, ``add_retries_max`` times in a
        row (reset once it has caught up), then it is replaced."""
        timeout_ms = self.config.add_timeout_ms
        for pos, outstanding in enumerate(self._outstanding):
            sent_ms = self._oldest_unacked_ms(pos, outstanding)
            if sent_ms is None or sent_ms > self._resent_ms[pos]:
                self._retries[pos] = 0  # everything resent so far was acknowledged
            if sent_ms is None or now_ms - sent_ms < timeout_ms or self._state != OPEN_STATE \
                    or pos in self._failed:
                continue
            if self._retries[pos] < self.config.add_retries_max:
                self._retries[pos] += 1
                self._resent_ms[pos] = now_ms
                self.add_retries += 1
                self._resend(pos, now_ms)
            else:
                self._bookie_failed(pos, now_ms)

    def _oldest_unacked_ms(self, pos: int, outstanding: list) -> int | None:
        """Drop the acknowledged front of ``pos``'s sent batches (one slice
        deletion); when the oldest entry still unacknowledged there was sent
        (None: none)."""
        bit, acks_map, lac = 1 << pos, self._acks, self.last_add_confirmed
        i = self._cursor[pos]
        for j, (entry_ids, sent_ms) in enumerate(outstanding):
            if entry_ids[-1] <= lac:  # every entry up to the LAC is acknowledged
                i = 0
                continue
            if entry_ids[i] <= lac and entry_ids[-1] - entry_ids[0] == len(entry_ids) - 1:
                i = lac + 1 - entry_ids[0]  # consecutive ids: jump over the acknowledged ones
            while i < len(entry_ids):
                acks = acks_map.get(entry_ids[i])
                if acks is not None and not acks & bit:
                    del outstanding[:j]
                    self._cursor[pos] = i
                    return sent_ms
                i += 1
            i = 0
        outstanding.clear()
        self._cursor[pos] = 0
        return None

    def _resend(self, pos: int, now_ms: int) -> None:
        """Send ``pos`` every entry of its write sets it has not acknowledged
        (an add is idempotent: the same record under the same id)."""
        bit, size, qw = 1 << pos, self._size, self._qw
        held = self._held
        again = [e for e, acks in self._acks.items()
                 if e not in held and not acks & bit and in_write_set(pos, e, size, qw)]
        self._outstanding[pos] = []
        self._cursor[pos] = 0
        self._send(again, self._records(again), frozenset((pos,)), now_ms)

    def _maybe_write_lac(self, now_ms: int) -> None:
        interval_ms = self.config.explicit_lac_interval_ms
        lac = self.last_add_confirmed
        idle_ms = now_ms - self._lac_moved_ms
        if interval_ms <= 0 or lac <= self.lac_written or idle_ms < interval_ms:
            return
        self.lac_written = lac
        for bookie in self._ws.ensemble:
            self._out.append(ev.SendWriteLac(self._next_id(), bookie, self.ledger_id, lac,
                                             self._key))


__all__ = ["LedgerWriter", "WriterConfig", "OPEN_STATE", "CLOSING", "CLOSED_STATE", "FENCED",
           "FAILED", "IN_RECOVERY"]
