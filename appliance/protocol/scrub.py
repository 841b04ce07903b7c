"""The bookie's scrub of closed ledgers, the decisions: which ledgers to look
at in a pass, and what a look finds.

Why it exists.  With the delayed ensemble change a writer acknowledges an
entry at the ack quorum while a failed bookie of its write set stays in the
ensemble; the live writer re-sends those *short* entries when the bookie
answers again (``writer_heal``).  A writer that crashes, is fenced, fails,
or whose close gives up waiting leaves them short for good: autorecovery
acts only on a bookie declared lost.  The scrub closes that gap from the
bookie's side: once a ledger is CLOSED, a bookie its ensembles name checks
that it holds its whole *share* (``repair.share_runs``: in every fragment
naming it, the entries whose write set contains it, up to the last entry);
a ledger with any missing is put in BP-46 limbo and the repair loop copies
the missing entries from their other replicas (``repair``), then clears
limbo.  Limbo is what BP-46 asks of a bookie that lacks entries it should
hold: it answers "unknown", never an explicit "no such entry", for them.

Pure and stdlib-only (no clock, no I/O): the bookie's thread
(``appliance.bookie.scrub``) and the simulation run the same rules; the
simulation's ``short-scrubbed`` invariant checks that once the faults heal
every bookie of a closed ledger holds its whole share, and the switch
``scrub-short`` shows that without the scrub it does not.

Verdicts of one look (``verdict``):

* ``GONE``: the metadata is gone: forget the ledger.
* ``OPEN``: not closed yet (its share is not known): look again later.
* ``BUSY``: in limbo here (the repair loop owns it): look again later, so a
  repaired ledger is confirmed whole.
* ``WHOLE``: closed, and this bookie holds its whole share, or the ledger
  names it in no fragment: never looked at again while this process lives
  (a closed ledger's share changes only by re-replication, which copies
  before it names a bookie).
* ``SHORT``: closed and part of the share is missing: limbo and repair.

Which ledgers a pass looks at (``ScrubQueue``): at most ``budget`` per
pass, each look one metadata read.  Ledgers listed at the first pass (boot)
are the *cold* backlog, less what the boot's own read of every ledger
already tells (``boot``: closed ledgers that name this bookie nowhere are
done, open ones are hot, closed ones naming it lead the backlog).  Ledgers
that appear later, and every ledger seen open or busy, are *hot* (recent:
where short entries come from) and go first, but the cold backlog keeps at
least a quarter of the budget, so both are covered over time.  Both are
FIFOs: a ledger looked at and not done goes to the back of the hot one.  A
ledger found ``WHOLE`` costs nothing afterwards but a set lookup per
listing.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

from appliance.protocol.metadata import CLOSED, LedgerMetadata
from appliance.protocol.quorum import ALL_PROTECTIONS, Protections
from appliance.protocol.repair import share_runs

GONE = "gone"
OPEN = "open"
BUSY = "busy"
WHOLE = "whole"
SHORT = "short"


def missing_count(md: LedgerMetadata, bookie_id: str,
                  present_count: Callable[[list[tuple[int, int]]], int]) -> tuple[int, int]:
    """(share size, entries of it missing) for a CLOSED ledger;
    ``present_count(runs)`` counts the entries of ``runs`` held locally."""
    runs = share_runs(md, bookie_id)
    share = sum(last - first + 1 for first, last in runs)
    return share, (share - present_count(runs) if share else 0)


def verdict(md: LedgerMetadata | None, bookie_id: str, in_limbo: bool,
            present_count: Callable[[list[tuple[int, int]]], int], *,
            protections: Protections = ALL_PROTECTIONS) -> str:
    """What one look at a ledger finds (see the module docstring).  With
    ``scrub-short`` switched off (simulation only) no ledger is ever short,
    so the simulation can show that short entries then stay short."""
    if md is None:
        return GONE
    if md.state != CLOSED:
        return OPEN
    if in_limbo:
        return BUSY
    if bookie_id not in md.bookies():
        return WHOLE
    _, missing = missing_count(md, bookie_id, present_count)
    return SHORT if missing and protections.scrub_short else WHOLE


class ScrubQueue:
    """Which ledgers to look at, pass after pass (see the module docstring)."""

    def __init__(self) -> None:
        self.known: set[int] = set()  # every ledger id of the last listing
        self.done: set[int] = set()  # found WHOLE: never looked at again
        self.hot: deque[int] = deque()
        self.cold: deque[int] = deque()
        self._queued: set[int] = set()  # in hot or cold
        self._listed_once = False
        self._boot: dict[int, tuple[bool, bool]] = {}

    def boot(self, seen: dict[int, tuple[bool, bool]]) -> None:
        """What the bookie's boot read of every ledger found (``ledger id ->
        (names this bookie, closed)``), before the first listing: a closed
        ledger naming no fragment of this bookie is done at once (only
        re-replication could name it, and it copies first); open ones are
        hot; closed ones naming it lead the backlog."""
        self._boot = dict(seen)

    def listing(self, ids: Iterable[int]) -> None:
        """A fresh listing of every ledger id in the metadata store."""
        listed = set(ids)
        for gone in self.known - listed:
            self.done.discard(gone)
            self._queued.discard(gone)
        fresh = sorted(listed - self.known, reverse=True)  # newest first
        if self._listed_once:
            self._queue(self.hot, fresh)
        else:
            self._first_listing(fresh)
        self.known = listed
        self._listed_once = True
        self._boot = {}

    def _first_listing(self, fresh: list[int]) -> None:
        """Into the backlog, except what the boot saw (``boot``): closed and
        not naming this bookie is done, open is hot, closed naming it leads
        the backlog."""
        boot = self._boot
        self.done.update(i for i in fresh if boot.get(i) == (False, True))
        self._queue(self.hot, [i for i in fresh if boot.get(i, (True, True))[1] is False])
        self._queue(self.cold, [i for i in fresh if boot.get(i) == (True, True)])
        self._queue(self.cold, [i for i in fresh if i not in boot])

    def _queue(self, queue: deque[int], ids: list[int]) -> None:
        for ledger_id in ids:
            if ledger_id not in self._queued and ledger_id not in self.done:
                queue.append(ledger_id)
                self._queued.add(ledger_id)

    def take(self, budget: int) -> list[int]:
        """Up to ``budget`` ledgers to look at now (each leaves the queue
        until ``outcome`` puts it back)."""
        cold_share = max(budget // 4, budget - len(self.hot)) if self.cold else 0
        picked = self._pop(self.cold, min(cold_share, budget))
        picked += self._pop(self.hot, budget - len(picked))
        picked += self._pop(self.cold, budget - len(picked))
        return picked

    def _pop(self, queue: deque[int], count: int) -> list[int]:
        out = []
        while queue and len(out) < count:
            ledger_id = queue.popleft()
            if ledger_id in self._queued:  # else deleted since it was queued
                self._queued.discard(ledger_id)
                out.append(ledger_id)
        return out

    def outcome(self, ledger_id: int, found: str) -> None:
        """Record what a look found (``found`` None: the look failed, e.g.
        the metadata store did not answer: look again later)."""
        if found == GONE or ledger_id not in self.known:
            return
        if found == WHOLE:
            self.done.add(ledger_id)
            return
        if ledger_id not in self._queued:
            self.hot.append(ledger_id)
            self._queued.add(ledger_id)

    def pending(self) -> int:
        return len(self._queued)
