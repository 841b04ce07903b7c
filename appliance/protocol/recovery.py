"""Ledger recovery: fence the last fragment, find the ledger's true end,
write the tail back, close by CAS.  (The "open with recovery" of a reader.)

Phases and the rule each one keeps:

1. **Mark**: a wrong password is refused before anything is sent (the key's
   hash must match the metadata's).  An OPEN ledger is CASed to IN_RECOVERY.
2. **Fence**: LAC reads with the fence flag to the last fragment's ensemble.
   Complete at ``EC = E - Qa + 1`` OK replies (no ack quorum of that ensemble
   is left unfenced); stuck once more than ``E - EC`` replies are errors, then
   retried after a back-off, at most ``rounds_max`` rounds.
3. **Read forward** from ``max(highest LAC seen, first entry of the last
   fragment - 1) + 1``.  Recovery reads go to each entry's write set in the
   metadata as it was when recovery began, *with the fence flag* (a bookie
   that answered "no such entry" can no longer accept that entry from the
   old writer).  An entry is recoverable at ``positive_min`` verified OK
   replies (``Qa`` by default), unrecoverable at ``QC = Qw - Qa + 1`` explicit
   negatives; otherwise it is unknown and read again after a back-off, never
   guessed.  The first unrecoverable entry ends the ledger.
4. **Write back** every recovered entry, in order, to its whole write set
   with recovery adds (fenced bookies accept them), done at ``Qa`` acks.  A
   bookie that fails is replaced in a *local* fragment starting at the
   lowest entry not yet written back; local fragments reach the metadata
   only with the close, so a recovery that dies changes nothing.
5. **Close** by CAS: IN_RECOVERY -> CLOSED at the last recovered entry (with
   the local fragments).  On a conflict the metadata is reread: CLOSED by
   anyone -> that end is the answer (concurrent recoveries converge);
   otherwise the whole recovery restarts (at most ``restarts_max`` times).

Before the close CAS the recovery checks (``invariant()``) that its end is
at or above every acknowledged entry it saw (the fence's LAC, the LAC field
of every record read) and that everything up to it was written back.

The result is one ``OpenDone``: OK with the closed metadata, or the error
(``UnauthorizedError``, ``NotEnoughBookiesError``, ``DataUnknownError``,
``BKTimeoutError``, ``MetadataVersionError``), with a ``detail`` naming what
stopped it (the fence's replies, or the undecided entry's); a failed recovery
leaves the ledger IN_RECOVERY for a later attempt.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from appliance.protocol import events as ev
from appliance.protocol.core import CoreBase
from appliance.protocol.errors import (
    OK,
    BKTimeoutError,
    MetadataVersionError,
    UnauthorizedError,
)
from appliance.protocol.invariant import invariant
from appliance.protocol.keys import check_password
from appliance.protocol.metadata import CLOSED, IN_RECOVERY, OPEN, LedgerMetadata
from appliance.protocol.placement import check_mode
from appliance.protocol.quorum import ALL_PROTECTIONS, Protections, ensemble_coverage
from appliance.protocol.recovery_tail import RecoveryTail

_IO_KINDS = ("fence", "read", "probe", "add")


@dataclass(frozen=True)
class RecoveryConfig:
    # A fence/read/add reply not back in this long counts as "unknown".
    request_timeout_ms: int = 2_000
    # Wait before retrying a stuck fence, an unknown entry or the length probe.
    retry_backoff_ms: int = 200
    # Rounds per fence and per entry before recovery gives up.
    rounds_max: int = 5
    # Entries being read or written back at once: speed vs. memory.
    window_entries: int = 16
    # Whole-recovery restarts after the metadata changed under us.
    restarts_max: int = 3
    # OK replies that make an entry recoverable; None = Qa (BP-46).  1 is
    # BookKeeper's older rule: also safe (a verified record is the writer's
    # own), and it can finish where a Qa-rule recovery waits for a bookie.
    positive_min: int | None = None
    # How write-back replacements are placed (WriterConfig.placement).
    placement: str = "host"


class LedgerRecovery(CoreBase):
    """One recovery of one ledger (see module docstring).  Call ``start``."""

    def __init__(self, metadata: LedgerMetadata, version: int, master_key: bytes, digest, *,
                 config: RecoveryConfig | None = None,
                 protections: Protections = ALL_PROTECTIONS,
                 available_bookies: Sequence[str] = (), ids: Iterator[int] | None = None,
                 locations: Mapping | None = None):
        super().__init__(metadata.ledger_id, ids)
        self.config = config or RecoveryConfig()
        self.placement = check_mode(self.config.placement)
        self.locations.update(locations or {})
        self.protections = protections
        self.available_bookies = tuple(available_bookies)
        self.master_key, self.digest = master_key, digest
        self._md, self._version = metadata, version
        self.phase = "new"
        self.restarts = 0
        self.fenced_lac = -1
        self.result: ev.OpenDone | None = None
        self._requests: dict[int, tuple] = {}  # id -> (kind, sent_ms, ...)
        self._timers: dict[int, tuple] = {}  # back-off timers -> what to retry
        self._tick: int | None = None
        self._tail: RecoveryTail | None = None
        self._fence_round = 0
        self._fence_ok = self._fence_errors = 0
        self._fence_answered: set[str] = set()

    @property
    def metadata(self) -> LedgerMetadata:
        return self._md

    # -- start and restart ---------------------------------------------------------------
    def start(self, now_ms: int) -> list:
        """Begin; the outcome arrives as one ``OpenDone`` action."""
        self._begin(now_ms)
        return self._take()

    def _begin(self, now_ms: int) -> None:
        md = self._md
        if not check_password(md.password_hash, self.master_key):
            self.finish(UnauthorizedError.code)
        elif md.state == CLOSED:
            self.finish(OK)
        elif md.state == OPEN:
            self.phase = "mark"
            self._write_metadata(md.to_in_recovery())
        else:
            self._start_fence(1, now_ms)

    def _restart(self, md: LedgerMetadata, version: int, now_ms: int) -> None:
        if self.restarts >= self.config.restarts_max:
            self.finish(MetadataVersionError.code)
            return
        self.restarts += 1
        self._requests.clear()
        self._timers.clear()
        self._tail = None
        self._md, self._version = md, version
        self._begin(now_ms)

    # -- phase 2: fencing ------------------------------------------------------------------
    def _start_fence(self, round_no: int, now_ms: int) -> None:
        invariant(self._md.state == IN_RECOVERY, "ledger %d: recovery fencing a ledger "
                  "in state %s (OPEN is marked IN_RECOVERY first)", self.ledger_id,
                  self._md.state)
        self.phase = "fence"
        self._fence_round = round_no
        self._fence_ok = self._fence_errors = 0
        self._fence_answered = set()
        ledger, key = self.ledger_id, self.master_key
        for bookie in self._md.last_fragment[1]:
            self.request("fence", now_ms, lambda rid, b=bookie: ev.SendReadLac(
                rid, b, ledger, True, key), bookie, round_no)

    def _on_read_lac_response(self, event: ev.ReadLacResponse) -> None:
        found = self._requests.pop(event.request_id, None)
        if found is None or found[0] != "fence":
            self.stale()
            return
        self._fence_reply(found, event.code, event.lac, event.now_ms)

    def _fence_reply(self, found: tuple, code: int, lac: int, now_ms: int) -> None:
        bookie, round_no = found[2], found[3]
        if self.phase != "fence" or round_no != self._fence_round \
                or bookie in self._fence_answered:
            self.stale()
            return
        self._fence_answered.add(bookie)
        if code == UnauthorizedError.code:
            self.finish(code)
            return
        if code == OK:
            self._fence_ok += 1
            self.fenced_lac = max(self.fenced_lac, lac)
        else:
            self._fence_errors += 1
        size = self._md.ensemble_size
        coverage = ensemble_coverage(size, self._md.ack_quorum)
        if self._fence_ok >= coverage:
            self._drop_requests("fence")
            self._start_tail(now_ms)
        elif self._fence_errors > size - coverage:
            self._drop_requests("fence")
            if round_no >= self.config.rounds_max:
                self.finish(BKTimeoutError.code, f"fencing its last fragment failed "
                            f"{round_no} rounds: the last had {self._fence_ok} OK of {size} "
                            f"bookies, it needs {coverage}")
            else:
                self.backoff(("fence", round_no + 1))

    # -- phases 3 and 4: read forward, write back (RecoveryTail) ---------------------------
    def _start_tail(self, now_ms: int) -> None:
        md = self._md
        invariant(self._fence_ok >= ensemble_coverage(md.ensemble_size, md.ack_quorum),
                  "ledger %d: reading forward after %d fence replies, below EC",
                  self.ledger_id, self._fence_ok)
        start = self.fenced_lac + 1
        if self.protections.fragment_start:
            start = max(self.fenced_lac, md.last_fragment[0] - 1) + 1
        self.phase = "tail"
        self._tail = RecoveryTail(self, md, start, self.config.positive_min or md.ack_quorum)
        self._tail.pump(now_ms)

    def _on_read_response(self, event: ev.ReadResponse) -> None:
        found = self._requests.pop(event.request_id, None)
        if found is None or self._tail is None or found[0] not in ("read", "probe"):
            self.stale()
            return
        self._tail.on_read(found, event)

    def _on_add_response(self, event: ev.AddResponse) -> None:
        found = self._requests.get(event.request_id)
        if found is None or self._tail is None or found[0] != "add":
            self.stale()
            return
        waiting = found[4]
        waiting.discard(event.entry_id)
        if not waiting:
            del self._requests[event.request_id]
        self._tail.on_add(found, event)

    # -- phase 5: close --------------------------------------------------------------------
    def close_at(self, last_entry_id: int, length: int, fragments, now_ms: int) -> None:
        """Called by the tail once every entry up to ``last_entry_id`` is back."""
        self._check_end(last_entry_id)
        md = self._md
        for first, bookies in fragments:
            if first <= last_entry_id:
                md = md.with_recovery_fragment(first, bookies)
        self.phase = "close"
        self._write_metadata(md.to_closed(last_entry_id, length))

    def _check_end(self, last_entry_id: int) -> None:
        """Before the close is written: every entry up to the end is written
        back, and the end is at or above every acknowledged entry this
        recovery has seen (the LAC of every fence reply and the LAC field of
        every record it read: a LAC names an acknowledged entry)."""
        tail = self._tail
        invariant(tail.written_upto >= last_entry_id, "ledger %d: closing at %d with entries "
                  "written back only up to %d", self.ledger_id, last_entry_id,
                  tail.written_upto)
        seen = max(self.fenced_lac, tail.lac_seen)
        invariant(last_entry_id >= seen, "ledger %d: recovery would close at %d below the "
                  "acknowledged entry %d it saw", self.ledger_id, last_entry_id, seen,
                  rule="no-divergence")

    # -- metadata ---------------------------------------------------------------------------
    def _write_metadata(self, new_md: LedgerMetadata) -> None:
        request_id = self._next_id()
        self._requests[request_id] = ("write", 0, new_md)
        self._out.append(ev.WriteMetadata(request_id, self.ledger_id, new_md, self._version))

    def _on_metadata_written(self, event: ev.MetadataWritten) -> None:
        found = self._requests.pop(event.request_id, None)
        if found is None or found[0] != "write":
            self.stale()
            return
        if event.code != OK:
            request_id = self._next_id()
            self._requests[request_id] = ("reread", 0)
            self._out.append(ev.ReadMetadata(request_id, self.ledger_id))
            return
        self._md, self._version = found[2], event.version
        if self.phase == "mark":
            self._start_fence(1, event.now_ms)
        else:
            self.finish(OK)

    def _on_metadata_read(self, event: ev.MetadataRead) -> None:
        found = self._requests.pop(event.request_id, None)
        if found is None or found[0] != "reread":
            self.stale()
            return
        if event.code != OK or event.metadata is None:
            self.finish(event.code or MetadataVersionError.code)
        elif event.metadata.state == CLOSED:  # someone closed it: converge on that end
            self._md, self._version = event.metadata, event.version
            self.finish(OK)
        else:
            self._restart(event.metadata, event.version, event.now_ms)

    # -- requests and timers (also used by the tail) ---------------------------------------
    def request(self, kind: str, now_ms: int, make_action, *extra) -> int:
        """Register a request (for replies and timeouts) and emit its action."""
        request_id = self._next_id()
        self._requests[request_id] = (kind, now_ms, *extra)
        self._out.append(make_action(request_id))
        if self._tick is None:
            self._tick = self._timer(max(1, self.config.request_timeout_ms // 2))
        return request_id

    def backoff(self, what: tuple) -> None:
        self._timers[self._timer(self.config.retry_backoff_ms)] = what

    def stale(self) -> None:
        self.stale_replies += 1

    def _on_timer(self, event: ev.TimerFired) -> None:
        if self.result is not None:
            return
        what = self._timers.pop(event.timer_id, None)
        if what is not None:
            if what[0] == "fence":
                if self.phase == "fence":
                    self._start_fence(what[1], event.now_ms)
            elif self._tail is not None and self.phase == "tail":
                self._tail.on_retry(what, event.now_ms)
        elif event.timer_id == self._tick:
            self._tick = None
            self._expire(event.now_ms)
            if self._requests and self.result is None and self._tick is None:
                self._tick = self._timer(max(1, self.config.request_timeout_ms // 2))
        else:
            self.stale()

    def _expire(self, now_ms: int) -> None:
        """Requests older than the timeout count as "unknown" replies."""
        timeout_ms = self.config.request_timeout_ms
        late = [rid for rid, found in self._requests.items()
                if found[0] in _IO_KINDS and now_ms - found[1] >= timeout_ms]
        for request_id in late:
            found = self._requests.pop(request_id, None)
            if self.result is not None or found is None:
                continue
            if found[0] == "fence":
                self._fence_reply(found, BKTimeoutError.code, -1, now_ms)
            elif self._tail is not None:
                self._tail.on_timeout(found, now_ms)

    def _drop_requests(self, kind: str) -> None:
        for request_id in [r for r, found in self._requests.items() if found[0] == kind]:
            del self._requests[request_id]

    # -- the outcome -------------------------------------------------------------------------
    def finish(self, code: int, detail: str = "") -> None:
        """Finish with ``code`` (``OK``: the metadata we hold is CLOSED);
        ``detail`` says why a failure happened, for the user's error."""
        if self.result is not None:
            return
        self.phase = "done"
        self._requests.clear()
        self._timers.clear()
        ok = code == OK
        if ok:
            md = self._md
            invariant(md.state == CLOSED and md.last_entry_id >= self.fenced_lac,
                      "ledger %d: recovery reports %s at %d; its fence saw LAC %d",
                      self.ledger_id, md.state, md.last_entry_id, self.fenced_lac,
                      rule="no-divergence")
        self.result = ev.OpenDone(self.ledger_id, code, self._md.last_entry_id if ok else -1,
                                  self._md if ok else None, self._version if ok else None,
                                  "" if ok else detail)
        self._out.append(self.result)
