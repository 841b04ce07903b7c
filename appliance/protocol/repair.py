"""BP-46 phase two, the decisions: what a bookie that may have lost data must
do with one ledger before it may trust its own explicit negatives again.

Pure and stdlib-only: the bookie's repair loop (``appliance.bookie.repair``)
and the simulated bookie (``tests.sim``) both ask these functions, so the
simulation checks the same rule the product runs.

A ledger in limbo goes through:

1. ``RECOVER``: its metadata is not CLOSED, so its last entry is not known:
   run the ledger recovery protocol (fence, recovery reads, close).  This
   bookie answers "unknown" for what it lacks (limbo), so recovery never
   truncates an acknowledged entry because of this bookie's loss.
2. ``COPY``: closed, and some entry of this bookie's *share* (the entries
   whose write set names it, in every fragment that names it, up to the
   last entry) is missing locally: copy those from the other replicas of
   each entry (verified; a peer's explicit negative is never data).
3. ``CLEAR``: closed and the whole share is present: clear limbo, durably.
4. ``GONE``: the ledger was deleted: nothing to repair; clear limbo (the
   garbage collector removes its data).

``may_clear_limbo`` is the one place that says a share is complete; the
protection ``repair-share`` (``Protections.repair_share``) exists only so the
simulation can show that clearing limbo before the share is complete loses
acknowledged entries.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from appliance.protocol.metadata import CLOSED, LedgerMetadata
from appliance.protocol.quorum import ALL_PROTECTIONS, Protections
from appliance.protocol.rereplication_plan import plan_ledger

RECOVER = "recover"  # not closed: run ledger recovery first
COPY = "copy"  # closed: copy the missing part of the share from peers
CLEAR = "clear"  # closed and the share is whole: clear limbo
GONE = "gone"  # deleted: clear limbo, nothing to copy


def share_runs(md: LedgerMetadata, bookie_id: str) -> list[tuple[int, int]]:
    """Runs ``(first, last)`` (inclusive) of the entries of a CLOSED ledger
    that ``bookie_id`` must hold: in every fragment naming it, the entries
    whose write set contains its position, never past the last entry."""
    if md.state != CLOSED:
        raise ValueError(f"ledger {md.ledger_id} is {md.state}: its share is not known "
                         "until it is closed")
    runs: list[tuple[int, int]] = []
    for plan in plan_ledger(md, bookie_id):
        runs.extend(plan.runs())
    return runs


def share_size(md: LedgerMetadata, bookie_id: str) -> int:
    return sum(last - first + 1 for first, last in share_runs(md, bookie_id))


def missing_runs(runs: Iterable[tuple[int, int]],
                 has_entry: Callable[[int], bool]) -> Iterator[tuple[int, int]]:
    """The sub-runs of ``runs`` whose entries ``has_entry`` says are absent."""
    for first, last in runs:
        start = None
        for entry_id in range(first, last + 1):
            if has_entry(entry_id):
                if start is not None:
                    yield start, entry_id - 1
                    start = None
            elif start is None:
                start = entry_id
        if start is not None:
            yield start, last


def sources(md: LedgerMetadata, bookie_id: str, entry_id: int) -> tuple[str, ...]:
    """The other replicas of ``entry_id`` (its write set without this bookie),
    in write-set order: where a missing entry is copied from."""
    return tuple(b for b in md.write_set(entry_id) if b != bookie_id)


def next_step(md: LedgerMetadata | None, bookie_id: str,
              has_entry: Callable[[int], bool]) -> str:
    """What to do next with a limbo ledger (``md`` None: deleted)."""
    if md is None:
        return GONE
    if md.state != CLOSED:
        return RECOVER
    for _ in missing_runs(share_runs(md, bookie_id), has_entry):
        return COPY
    return CLEAR


def may_clear_limbo(md: LedgerMetadata | None, bookie_id: str,
                    has_entry: Callable[[int], bool], *,
                    protections: Protections = ALL_PROTECTIONS) -> bool:
    """Limbo may be cleared: the ledger is gone, or it is closed and this
    bookie holds every entry of its share.  With ``repair-share`` switched
    off (simulation only) any closed ledger is cleared."""
    if md is None:
        return True
    if md.state != CLOSED:
        return False
    if not protections.repair_share:
        return True
    return next_step(md, bookie_id, has_entry) == CLEAR
