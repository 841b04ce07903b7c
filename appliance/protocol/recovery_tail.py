"""The read-forward and write-back phase of a recovery (phases 3 and 4 in
``appliance.protocol.recovery``), split out to keep each module small.

Entries from ``start`` are read (window of ``window_entries``) from their
write sets in the metadata snapshot taken when recovery began, decided by
``classify_recovery_read``, and written back *in entry order* to their write
sets under the recovery's current ensemble.  An entry counts as written back
at ``Qa`` acks.  A failed bookie is replaced in a local fragment from the
lowest entry not yet written back; its acks for entries from there on are
forgotten and those entries are resent to the replacement.  A bookie that
only timed out while no spare is available is not replaced but asked again
(at most ``rounds_max`` times in a row): entries complete with any ``Qa``
acks, so a stopped bookie (apache/bookkeeper #1067) or a slow one fails the
recovery only when the others cannot make up the ack quorum.  When the first
unrecoverable entry ``end`` is known and every entry below it is written
back, the owner closes at ``end - 1`` (with the running length read from that
entry's header, or from one plain read of it when nothing was recovered).
"""

from __future__ import annotations

from appliance.protocol import events as ev
from appliance.protocol.entry import verify_entry
from appliance.protocol.errors import (
    OK,
    BKTimeoutError,
    DataUnknownError,
    DigestMismatchError,
    NotEnoughBookiesError,
    UnauthorizedError,
    is_explicit_negative,
)
from appliance.protocol.invariant import invariant
from appliance.protocol.metadata import LedgerMetadata
from appliance.protocol.quorum import (
    NEGATIVE,
    POSITIVE,
    UNKNOWN,
    WriteSets,
    ack_coverage,
    classify_recovery_read,
    in_write_set,
)

READING, WAITING, READY, WRITING, WRITTEN, DROPPED = range(6)


class _Entry:
    __slots__ = ("entry_id", "round", "answered", "positives", "negatives", "unknowns",
                 "unknown_code", "data", "length", "state", "acks", "count")

    def __init__(self, entry_id: int):
        self.entry_id = entry_id
        self.round = 1
        self.state = READING
        self.data: bytes | None = None
        self.length = 0
        self.acks = 0
        self.count = 0
        self.reset_round()

    def reset_round(self) -> None:
        self.answered: set[str] = set()
        self.positives = self.negatives = self.unknowns = 0
        self.unknown_code = BKTimeoutError.code


class RecoveryTail:
    """Reads from ``start``; owner is the ``LedgerRecovery`` (see module doc)."""

    def __init__(self, owner, metadata: LedgerMetadata, start: int, positive_min: int):
        self.owner = owner
        self.md = metadata  # snapshot: where the old writer put each entry
        self.start = start
        self.positive_min = positive_min
        self.qw, self.qa = metadata.write_quorum, metadata.ack_quorum
        self.size = metadata.ensemble_size
        self.ws = WriteSets(metadata.last_fragment[1], self.qw)
        self.entries: dict[int, _Entry] = {}
        self.next_read = start
        self.next_write = start
        self.written_upto = start - 1
        self.length_written = 0
        self.end: int | None = None  # the first unrecoverable entry
        self.lac_seen = -1  # highest LAC field of the records read (acknowledged)
        self.fragments: list[tuple[int, tuple[str, ...]]] = []  # local fragments
        self.failed_bookies: set[str] = set()
        # position -> (rounds of write-backs resent in a row, when the last was)
        self.resends: dict[int, tuple[int, int]] = {}
        self.add_retries: set[int] = set()  # positions with a refused write-back's retry due
        self.probe_round = 0
        self.probe_answered: set[str] = set()
        self.closing = False

    # -- driving -------------------------------------------------------------------------
    def pump(self, now_ms: int) -> None:
        window = self.owner.config.window_entries
        while (self.end is None or self.next_read < self.end) \
                and self.next_read - self.written_upto - 1 < window:
            entry = _Entry(self.next_read)
            self.entries[entry.entry_id] = entry
            self.next_read += 1
            self._send_reads(entry, now_ms)
        self._start_writes(now_ms)
        self._maybe_close(now_ms)

    def _send_reads(self, entry: _Entry, now_ms: int) -> None:
        owner = self.owner
        fence = owner.protections.recovery_read_fence
        key, ledger = owner.master_key, owner.ledger_id  # sent fencing or not
        for bookie in self.md.write_set(entry.entry_id):
            owner.request("read", now_ms, lambda rid, b=bookie: ev.SendRead(
                rid, b, ledger, entry.entry_id, fence, key), entry, entry.round, bookie)

    # -- recovery reads -----------------------------------------------------------------------
    def on_read(self, found: tuple, event: ev.ReadResponse) -> None:
        if found[0] == "probe":
            self._on_probe(found, event.code, event.data, event.now_ms)
            return
        entry, round_no, bookie = found[2], found[3], found[4]
        if entry.state != READING or round_no != entry.round or bookie in entry.answered:
            self.owner.stale()
            return
        self._count_reply(entry, bookie, event.code, event.data)
        self._decide(entry, event.now_ms)

    def _count_reply(self, entry: _Entry, bookie: str, code: int, data) -> None:
        entry.answered.add(bookie)
        if code == OK:
            try:
                lac, length, _ = verify_entry(data, self.owner.digest, self.owner.ledger_id,
                                              entry.entry_id)
            except DigestMismatchError:
                entry.unknowns += 1
                entry.unknown_code = DigestMismatchError.code
                return
            self.lac_seen = max(self.lac_seen, lac)
            entry.positives += 1
            if entry.data is None:
                entry.data, entry.length = bytes(data), length
        elif is_explicit_negative(code):
            entry.negatives += 1
        else:
            entry.unknowns += 1
            entry.unknown_code = code

    def _decide(self, entry: _Entry, now_ms: int) -> None:
        verdict = classify_recovery_read(entry.positives, entry.negatives, entry.unknowns,
                                         self.qw, self.qa, self.positive_min)
        if verdict == POSITIVE:
            entry.state = READY
            self.pump(now_ms)
        elif verdict == NEGATIVE:
            self._end_at(entry.entry_id, now_ms)
        elif verdict == UNKNOWN:
            if entry.round >= self.owner.config.rounds_max:
                code = entry.unknown_code
                self.owner.finish(code if code != OK else DataUnknownError.code,
                                  self._undecided(entry))
                return
            entry.state = WAITING
            self.owner.backoff(("reread", entry.entry_id, entry.round + 1))

    def _undecided(self, entry: _Entry) -> str:
        """Why ``entry`` stopped the recovery, for the user's error: the
        replies of its last round and what either decision needs."""
        return (f"entry {entry.entry_id} undecided after {entry.round} reads of its write "
                f"set: {entry.positives} had it, {entry.negatives} did not, "
                f"{entry.unknowns} unknown (no answer, an error or a bad copy); keeping it "
                f"needs {self.positive_min} "
                f"that have it, ending the ledger before it needs "
                f"{ack_coverage(self.qw, self.qa)} that do not (retry once those bookies "
                f"answer)")

    def _end_at(self, entry_id: int, now_ms: int) -> None:
        if self.end is None or entry_id < self.end:
            self.end = entry_id
            for later in [e for e in self.entries if e >= entry_id]:
                self.entries.pop(later).state = DROPPED
        self.pump(now_ms)

    def on_retry(self, what: tuple, now_ms: int) -> None:
        if what[0] == "probe":
            self._send_probe(what[1], now_ms)
            return
        if what[0] == "add":
            self._retry_refused_add(what[1], what[2], now_ms)
            return
        entry = self.entries.get(what[1])
        if entry is not None and entry.state == WAITING:
            entry.round = what[2]
            entry.state = READING
            entry.reset_round()
            self._send_reads(entry, now_ms)

    def on_timeout(self, found: tuple, now_ms: int) -> None:
        kind = found[0]
        if kind == "read":
            entry, round_no, bookie = found[2], found[3], found[4]
            if entry.state == READING and round_no == entry.round and bookie not in entry.answered:
                self._count_reply(entry, bookie, BKTimeoutError.code, None)
                self._decide(entry, now_ms)
        elif kind == "probe":
            self._on_probe(found, BKTimeoutError.code, None, now_ms)
        elif kind == "add":
            pos, bookie, waiting = found[2], found[3], found[4]
            stuck = [self.entries[e] for e in sorted(waiting)
                     if self.entries.get(e) is not None and self.entries[e].state == WRITING]
            if self.ws.ensemble[pos] == bookie and stuck:
                self._add_timed_out(pos, stuck, now_ms)

    def _add_timed_out(self, pos: int, stuck: list[_Entry], now_ms: int) -> None:
        """A write-back unanswered for the request timeout while entries of
        it still lack ``Qa`` acks: the bookie is replaced when a spare is
        available.  Without one it is asked again (a recovery add is
        idempotent), ``rounds_max`` times in a row, while the other
        replicas' acks may complete the entries meanwhile: a bookie that is
        merely slow gets its chance and a stopped one is never waited for
        once ``Qa`` others answered; then ``NotEnoughBookies``."""
        if self._spares():
            self._replace(pos, now_ms)
            return
        count, last_ms = self.resends.get(pos, (0, -1))
        if last_ms != now_ms:  # one more round (its requests time out together)
            count += 1
            self.resends[pos] = (count, now_ms)
        if count > self.owner.config.rounds_max:
            self.owner.finish(NotEnoughBookiesError.code)
            return
        self._send_adds(stuck, pos, now_ms)

    def _retry_refused_add(self, pos: int, bookie: str, now_ms: int) -> None:
        """The back-off after a write-back error with no spare is over: the
        entries that still need ``bookie`` for their ``Qa`` acks are sent to
        it again, counted as rounds like a timeout (``_add_timed_out``); the
        entries the other replicas completed meanwhile need nothing more."""
        self.add_retries.discard(pos)
        if self.ws.ensemble[pos] != bookie:
            return  # replaced meanwhile
        bit = 1 << pos
        stuck = [e for _, e in sorted(self.entries.items())
                 if e.state == WRITING and not e.acks & bit
                 and in_write_set(pos, e.entry_id, self.size, self.qw)]
        if stuck:
            self._add_timed_out(pos, stuck, now_ms)

    def _spares(self) -> list[str]:
        """Bookies a failed one may be replaced by: available, not in the
        ensemble, not failed in this recovery."""
        return [b for b in self.owner.available_bookies
                if b not in self.failed_bookies and b not in self.ws.ensemble]

    # -- write-back ---------------------------------------------------------------------------
    def _start_writes(self, now_ms: int) -> None:
        ready = []
        while True:
            entry = self.entries.get(self.next_write)
            if entry is None or entry.state != READY:
                break
            invariant((self.end is None or entry.entry_id < self.end)
                      and entry.positives >= self.positive_min, "ledger %d: writing back "
                      "entry %d (%d positive replies, end %s)", self.owner.ledger_id,
                      entry.entry_id, entry.positives, self.end)
            entry.state = WRITING
            ready.append(entry)
            self.next_write += 1
        if ready:
            self._send_adds(ready, None, now_ms)

    def _send_adds(self, entries: list[_Entry], only_pos: int | None, now_ms: int) -> None:
        batches: dict[int, list[_Entry]] = {}
        for entry in entries:
            for pos in self.ws.positions_of(entry.entry_id):
                if only_pos is None or pos == only_pos:
                    batches.setdefault(pos, []).append(entry)
        owner, ledger, key = self.owner, self.owner.ledger_id, self.owner.master_key
        for pos, batch in batches.items():
            bookie = self.ws.ensemble[pos]
            ids = tuple(e.entry_id for e in batch)
            datas = tuple(e.data for e in batch)
            owner.request("add", now_ms, lambda rid, b=bookie, i=ids, d=datas: ev.SendAdd(
                rid, b, ledger, i, d, True, key), pos, bookie, set(ids))

    def on_add(self, found: tuple, event: ev.AddResponse) -> None:
        pos, bookie = found[2], found[3]
        entry = self.entries.get(event.entry_id)
        if (entry is None or entry.state not in (WRITING, WRITTEN)
                or self.ws.ensemble[pos] != bookie
                or not in_write_set(pos, event.entry_id, self.size, self.qw)):
            self.owner.stale()
            return
        if event.code == OK:
            self.resends.pop(pos, None)  # it answers: the next timeout starts afresh
            bit = 1 << pos
            if not entry.acks & bit:
                entry.acks |= bit
                entry.count += 1
            if entry.state == WRITING and entry.count >= self.qa:
                entry.state = WRITTEN
                self._fold_written(event.now_ms)
        elif event.code == UnauthorizedError.code:
            self.owner.finish(UnauthorizedError.code)
        elif self._spares():
            self._replace(pos, event.now_ms)
        elif pos not in self.add_retries:  # no spare: ask again after the back-off
            self.add_retries.add(pos)
            self.owner.backoff(("add", pos, bookie))

    def _fold_written(self, now_ms: int) -> None:
        while True:
            entry = self.entries.get(self.written_upto + 1)
            if entry is None or entry.state != WRITTEN:
                break
            self._check_written(entry)
            del self.entries[entry.entry_id]
            self.written_upto = entry.entry_id
            self.length_written = entry.length
        self.pump(now_ms)

    def _check_written(self, entry: _Entry) -> None:
        """An entry counts as written back only with Qa acks of its write set."""
        mask = sum(1 << p for p in self.ws.positions_of(entry.entry_id))
        invariant(entry.count >= self.qa and entry.acks.bit_count() == entry.count
                  and not entry.acks & ~mask, "ledger %d: entry %d written back with acks "
                  "%s (count %d, Qa %d)", self.owner.ledger_id, entry.entry_id,
                  bin(entry.acks), entry.count, self.qa)

    def _replace(self, pos: int, now_ms: int) -> None:
        """Local ensemble change: a new fragment from the lowest entry not yet
        written back, with the bookie at ``pos`` replaced (host-aware)."""
        first = self.written_upto + 1
        invariant(first >= self.md.last_fragment[0],
                  f"ledger {self.owner.ledger_id}: recovery would add a fragment at {first} "
                  f"before the last fragment at {self.md.last_fragment[0]} "
                  f"(invalid ensemble, BookKeeper issue 2615)")
        self.failed_bookies.add(self.ws.ensemble[pos])
        spares = [b for b in self.owner.available_bookies if b not in self.failed_bookies]
        ensemble = self.owner.replace_bookies(self.ws.ensemble, self.qw, [pos], spares)
        if ensemble is None:
            self.owner.finish(NotEnoughBookiesError.code)
            return
        if self.fragments and self.fragments[-1][0] == first:
            self.fragments[-1] = (first, tuple(ensemble))
        else:
            self.fragments.append((first, tuple(ensemble)))
        self.ws = WriteSets(tuple(ensemble), self.qw)
        bit, resend = 1 << pos, []
        for entry in self.entries.values():
            if entry.entry_id < first or entry.state not in (WRITING, WRITTEN):
                continue
            if entry.acks & bit:
                entry.acks &= ~bit
                entry.count -= 1
            if entry.count < self.qa:
                entry.state = WRITING
            if in_write_set(pos, entry.entry_id, self.size, self.qw):
                resend.append(entry)
        if resend:
            self._send_adds(resend, pos, now_ms)

    # -- the end: length probe and close ----------------------------------------------------
    def _maybe_close(self, now_ms: int) -> None:
        if self.closing or self.end is None or self.written_upto < self.end - 1:
            return
        last = self.end - 1
        if last >= self.start or last < 0:
            self.closing = True
            length = self.length_written if last >= self.start else 0
            self.owner.close_at(last, length, self.fragments, now_ms)
        elif self.probe_round == 0:
            self._send_probe(1, now_ms)

    def _send_probe(self, round_no: int, now_ms: int) -> None:
        """Nothing was recovered: one plain read of the last entry gives the
        ledger's running length for the closed metadata."""
        self.probe_round = round_no
        self.probe_answered = set()
        last, owner = self.end - 1, self.owner
        for bookie in self.md.write_set(last):
            owner.request("probe", now_ms, lambda rid, b=bookie: ev.SendRead(
                rid, b, owner.ledger_id, last, False, owner.master_key), round_no, bookie)

    def _on_probe(self, found: tuple, code: int, data, now_ms: int) -> None:
        round_no, bookie = found[2], found[3]
        if self.closing or round_no != self.probe_round or bookie in self.probe_answered:
            return
        self.probe_answered.add(bookie)
        last = self.end - 1
        if code == OK:
            try:
                _, length, _ = verify_entry(data, self.owner.digest, self.owner.ledger_id, last)
            except DigestMismatchError:
                pass
            else:
                self.closing = True
                self.owner.close_at(last, length, self.fragments, now_ms)
                return
        if len(self.probe_answered) == self.qw:
            if round_no >= self.owner.config.rounds_max:
                self.owner.finish(DataUnknownError.code)
            else:
                self.owner.backoff(("probe", round_no + 1))
