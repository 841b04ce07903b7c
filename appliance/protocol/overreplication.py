"""Over-replicated ledgers: when a bookie's copy is no longer needed.

Pure decisions for ``appliance.bookie.ledger_gc`` (the driver reads the
metadata, the copy markers and the local storage, and deletes): no I/O, no
clock (``now_ms`` is passed in), so unit tests drive every case.

A bookie's copy of a ledger is *needed* (``keep_reason`` returns why) when:

* the ledger is IN_RECOVERY: a recovery writes its write-back to the
  bookies it will name only when it closes the ledger (its local ensemble
  change), so a bookie no fragment names may hold copies about to be named;
* it is OPEN and any fragment names the bookie (the last fragment's
  entries are unknown yet);
* it is CLOSED and a fragment that holds entries names the bookie: a
  fragment starting after ``last_entry_id`` (an empty trailing fragment:
  an ensemble change at LAC + 1 right before the close or a recovery) holds
  no entry of the ledger, so naming the bookie there needs no copy.

Otherwise the copy is *over-replicated*.  It is deleted only once it was
seen over-replicated in ``passes_min`` consecutive passes spanning at least
``grace_ms`` (``observe``), no copy marker names this bookie for it, and a
last re-read of its metadata by id agrees (``final_verdict``).  Anything
unexpected (metadata unreadable, gone, a marker, limbo) keeps the copy and
restarts the wait.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from appliance.protocol.metadata import CLOSED, IN_RECOVERY, LedgerMetadata

PASSES_MIN = 3  # consecutive passes a ledger must be seen over-replicated


def needed_fragments(md: LedgerMetadata) -> list[tuple[int, tuple[str, ...]]]:
    """The fragments whose bookies need their copy: all of them unless the
    ledger is CLOSED, then only those holding entries (first <= last)."""
    if md.state != CLOSED:
        return list(md.ensembles)
    return [f for f in md.ensembles if f[0] <= md.last_entry_id]


def keep_reason(md: LedgerMetadata | None, bookie_id: str) -> str | None:
    """Why ``bookie_id`` must keep its copy of the ledger (None: it need not)."""
    if md is None:
        return "no metadata (the deleted-ledger collector decides)"
    if md.state == IN_RECOVERY:
        return "in recovery: its close may name this bookie"
    for first, bookies in needed_fragments(md):
        if bookie_id in bookies:
            return f"fragment at entry {first} names this bookie"
    return None


@dataclass(frozen=True)
class Sighting:
    """A ledger seen over-replicated in consecutive passes since ``first_ms``;
    ``mark`` is the storage activity mark taken at the first sighting
    (``LedgerStorage.activity_mark``): the delete is refused if the ledger
    got any add or state change after it."""

    first_ms: int
    mark: int
    passes: int = 1


def observe(sightings: Mapping[int, Sighting], bookie_id: str,
            views: Mapping[int, LedgerMetadata | None], marked: Iterable[int],
            limbo: Iterable[int], now_ms: int, mark: int, grace_ms: int,
            passes_min: int = PASSES_MIN) -> tuple[dict[int, Sighting], list[int]]:
    """One pass.  ``views``: the metadata read this pass for each local
    ledger holding entries (None: unreadable or gone); ``marked``: ledgers a
    copy marker names this bookie for; ``limbo``: local ledgers in BP-46
    limbo.  Returns the sightings to keep and the ledgers due for the final
    check (seen over-replicated ``passes_min`` passes and ``grace_ms``).
    A ledger not over-replicated in this pass loses its sighting: the wait
    starts again from zero.  ``grace_ms <= 0`` turns the collector off."""
    if grace_ms <= 0:
        return {}, []
    held = set(marked) | set(limbo)
    out: dict[int, Sighting] = {}
    due = []
    for ledger_id, md in views.items():
        if ledger_id in held or keep_reason(md, bookie_id) is not None:
            continue
        seen = sightings.get(ledger_id)
        seen = (Sighting(now_ms, mark) if seen is None
                else Sighting(seen.first_ms, seen.mark, seen.passes + 1))
        out[ledger_id] = seen
        if seen.passes >= passes_min and now_ms - seen.first_ms >= grace_ms:
            due.append(ledger_id)
    return out, sorted(due)


def final_verdict(md: LedgerMetadata | None, bookie_id: str, marked: bool) -> str | None:
    """The check right before the delete, on a fresh marker lookup and then
    a fresh read of the metadata by id (in that order: see
    ``appliance.bookie.ledger_gc``).  None: delete; else why not."""
    if marked:
        return "a re-replication is copying it to this bookie"
    return keep_reason(md, bookie_id)
