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
* The delayed ensemble change (``writer_heal``): with no spare for a failed
  bookie, it stays in the ensemble (*lagging*, sent nothing, its acks not
  counted) while every write set keeps ``Qa`` other positions; acknowledged
  entries are kept (within ``heal_bytes_max``) until every bookie of their
  write set acked them, and those a failed bookie missed are re-sent to it
  once it answers again; ``close()`` waits for that, at most
  ``heal_close_wait_ms``.
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

Where each part lives: this module holds ``WriterConfig`` and
``LedgerWriter``'s state and add path (records made, sent to their write
sets); the other parts are ``LedgerWriter``'s bases, one module each:
``writer_acks`` (replies counted, the LAC advanced), ``writer_timers`` (add
timeouts, resends, the explicit LAC), ``writer_ensemble`` (a bookie
replaced), ``writer_heal`` (a bookie kept without a spare, and healed),
``writer_close`` (``close()`` and the stops), ``writer_metadata`` (the CAS
loop under the last two); ``writer_states`` names the states.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from appliance.protocol import events as ev
from appliance.protocol import limits
from appliance.protocol.entry import HEADER, HEADER_BYTES
from appliance.protocol.errors import OK, LedgerClosedError, TooManyRequestsError
from appliance.protocol.invariant import invariant
from appliance.protocol.metadata import IN_RECOVERY, OPEN, LedgerMetadata
from appliance.protocol.placement import check_mode
from appliance.protocol.quorum import ALL_PROTECTIONS, Protections, WriteSets
from appliance.protocol.writer_acks import WriterAcks
from appliance.protocol.writer_close import WriterClose
from appliance.protocol.writer_ensemble import WriterEnsemble
from appliance.protocol.writer_heal import WriterHeal
from appliance.protocol.writer_metadata import MetadataOp, WriterMetadataLoop
from appliance.protocol.writer_states import CLOSED_STATE, CLOSING, FAILED, FENCED, OPEN_STATE
from appliance.protocol.writer_timers import WriterTimers


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
    # Delayed ensemble change (writer_heal): a failed bookie with no spare to
    # replace it stays in the ensemble while every write set keeps its ack
    # quorum; adds go on at Qa copies and the entries it missed are re-sent
    # once it answers.  False: no spare stops the ledger (NotEnoughBookiesError).
    delay_ensemble_change: bool = True
    # Bytes of acknowledged records kept until every bookie of their write
    # set has them (to re-send to a slow or lagging bookie); past it entries
    # are acknowledged at Qa copies and not kept (untracked).  More heals
    # longer stalls; costs client memory.
    heal_bytes_max: int = limits.CLIENT_HEAL_BYTES_MAX
    # close() waits this long for entries still short on a bookie of the
    # ensemble to heal, then closes with them at Qa copies (short_left).
    heal_close_wait_ms: int = limits.CLIENT_HEAL_CLOSE_WAIT_MS

    def tick_ms(self) -> int:
        tick = max(1, self.add_timeout_ms // 4)
        if self.explicit_lac_interval_ms > 0:
            tick = min(tick, self.explicit_lac_interval_ms)
        return tick

class LedgerWriter(WriterAcks, WriterTimers, WriterEnsemble, WriterHeal, WriterClose,
                   WriterMetadataLoop):
    """Client-side writer of one OPEN ledger (see module docstring).

    All of the writer's state is set up here, for every part to read; the
    parts are plain base classes with no state or ``__init__`` of their own.
    A method found in a base costs what it did in one class (the lookup is
    cached per class), so the per-add path has no extra call or
    indirection."""

    def __init__(self, metadata: LedgerMetadata, version: int, master_key: bytes, digest, *,
                 config: WriterConfig | None = None, available_bookies: Sequence[str] = (),
                 ids: Iterator[int] | None = None, locations: Mapping | None = None,
                 protections: Protections = ALL_PROTECTIONS):
        super().__init__(metadata.ledger_id, ids)
        # Every part's state, in one place; which part writes what: each
        # part's module docstring ("State owned here").
        invariant(metadata.state == OPEN, f"ledger {metadata.ledger_id} is not OPEN")
        self.config = config or WriterConfig()
        self._change_holds_acks = protections.change_holds_acks  # off: the simulation only
        self._late_refusal = protections.late_refusal  # off: the simulation only
        self._heal_enabled = protections.heal_short  # off: the simulation only
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
        self._ws_masks = tuple(~m for m in self._not_ws_masks)
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
        # delayed ensemble change (writer_heal): positions kept after a failure
        # for want of a spare, and what was acknowledged without them
        self._lagging: set[int] = set()
        self._lag_mask = 0
        self._trail: dict[int, int] = {}  # acknowledged, some bookie yet to ack: its mask
        self._trail_data: dict[int, bytes] = {}
        self._short: dict[str, dict[int, bytes]] = {}
        self._kept_bytes = 0  # records in _trail_data and _short
        self._heal_ms: dict[str, int] = {}
        self._heal_all: dict[str, bool] = {}
        self._close_wait_from: int | None = None
        self.short_left = 0  # entries still short when the writer ended (stats, tests)
        self.healed_entries = 0  # short entries a lagging bookie acknowledged later
        self.untracked = 0  # acknowledged entries not kept past heal_bytes_max
        self.on_rejoin = None  # optional observer of a lagging bookie taken back (sim)
        self._op: MetadataOp | None = None
        self._close_requested = False
        self._state = OPEN_STATE
        self.error_code = OK
        self.stopped_with = OK  # the first stop's code (writer_close)
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

    # -- user calls (close() is in writer_close) ----------------------------------
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
            lag = self._lag_mask  # lagging positions get nothing (writer_heal)
            batches = ((pos, sent, datas) for pos in range(size)
                       if (only is None or pos in only) and not lag >> pos & 1)
        else:
            lists: dict[int, tuple[list, list]] = {}
            positions_of, lag = self._ws.positions, self._lag_mask
            for entry_id, record in zip(entry_ids, records, strict=True):
                for pos in positions_of[entry_id % size]:
                    if (only is None or pos in only) and not lag >> pos & 1:
                        ids, recs = lists.setdefault(pos, ([], []))
                        ids.append(entry_id)
                        recs.append(record)
            batches = ((pos, (tuple(ids), now_ms), tuple(recs))
                       for pos, (ids, recs) in lists.items())
        for pos, sent, datas in batches:
            self._outstanding[pos].append(sent)
            self._out.append(ev.SendAdd(self._next_id(), self._ws.ensemble[pos], self.ledger_id,
                                        sent[0], datas, False, self._key))



__all__ = ["LedgerWriter", "WriterConfig", "OPEN_STATE", "CLOSING", "CLOSED_STATE", "FENCED",
           "FAILED", "IN_RECOVERY"]
