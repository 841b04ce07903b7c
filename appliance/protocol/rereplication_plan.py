"""Re-replication planning: which entries of which fragment a lost bookie
held, who takes its place, and the metadata change that records it.

Pure and stdlib-only (no sockets, files, clocks or randomness): the driver
(``appliance.rereplication``) reads metadata, copies entries and CASes the
result; everything it decides comes from here, so the unit tests cover the
decisions without a cluster.

Guarantees:

* ``plan_ledger`` lists every fragment of a ledger that names the lost
  bookie, with the entry range it covers: up to the next fragment's first
  entry, and never past a CLOSED ledger's last entry (an empty range still
  needs its metadata fixed, but has nothing to copy).
* ``runs_to_copy`` yields exactly the entries whose write set contains the
  lost bookie's ensemble position, as runs of consecutive ids (one run when
  ``E == Qw``), so the copier reads ranges, not single entries.
* ``choose_replacement`` never picks a bookie already in the fragment's
  ensemble, the lost bookie itself, or a read-only one; among the rest it
  keeps the write sets on distinct hosts when it can (``placement``), then
  spreads the load (fewest fragments taken so far in this run).
* ``plan_sealed`` lists the sealed fragments (all but the last) of an OPEN
  ledger naming the lost bookie: they can be re-replicated while the writer
  goes on.
* ``replace_bookie`` (the CAS transform) changes only the one fragment, only
  while it still has exactly the ensemble that was planned, and never the
  last fragment of a ledger that is not CLOSED; it returns
  ``None`` when the fragment no longer names the lost bookie (another run
  finished it) and raises ``StalePlanError`` for any other change, so a
  fragment is never re-pointed at a bookie that did not receive its copies.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

from appliance.protocol.keys import check_password
from appliance.protocol.metadata import CLOSED, LedgerMetadata
from appliance.protocol.placement import Location, choose_for_position
from appliance.protocol.quorum import write_set_positions

# What the driver does with a ledger naming the lost bookie.
RECOVER = "recover"  # CLOSED: copy and re-point its fragments
RECOVER_OPEN = "recover-open"  # OPEN / IN_RECOVERY and allowed: fence + close first
SKIP_OPEN = "skip-open"  # OPEN / IN_RECOVERY, not allowed: its writer may change it


class StalePlanError(Exception):
    """The fragment changed since it was planned: plan the ledger again."""


@dataclass(frozen=True, slots=True)
class FragmentPlan:
    """One fragment naming the lost bookie.  ``last_entry_id < first_entry_id``
    means it holds no entries (only its metadata needs the replacement)."""

    ledger_id: int
    first_entry_id: int
    last_entry_id: int
    ensemble: tuple[str, ...]
    write_quorum: int
    lost: str

    @property
    def position(self) -> int:
        return self.ensemble.index(self.lost)

    def runs(self) -> Iterator[tuple[int, int]]:
        return runs_to_copy(self.first_entry_id, self.last_entry_id, len(self.ensemble),
                            self.write_quorum, self.position)

    def entry_count(self) -> int:
        return sum(last - first + 1 for first, last in self.runs())

    def sources(self, entry_id: int) -> tuple[str, ...]:
        """The surviving replicas of ``entry_id``: its write set without the
        lost bookie, in write-set order."""
        positions = write_set_positions(entry_id, len(self.ensemble), self.write_quorum)
        return tuple(self.ensemble[p] for p in positions if self.ensemble[p] != self.lost)


def ledger_action(md: LedgerMetadata, recover_open: bool) -> str:
    if md.state == CLOSED:
        return RECOVER
    return RECOVER_OPEN if recover_open else SKIP_OPEN


def plan_ledger(md: LedgerMetadata, lost: str) -> list[FragmentPlan]:
    """The fragments of ``md`` naming ``lost``, with their entry ranges.
    Only meaningful for a CLOSED ledger (an open one has no last entry yet)."""
    plans = []
    for index, (first, ensemble) in enumerate(md.ensembles):
        if lost not in ensemble:
            continue
        if index + 1 < len(md.ensembles):
            last = min(md.ensembles[index + 1][0] - 1, md.last_entry_id)
        else:
            last = md.last_entry_id
        plans.append(FragmentPlan(md.ledger_id, first, last, tuple(ensemble), md.write_quorum,
                                  lost))
    return plans


def plan_sealed(md: LedgerMetadata, lost: str) -> list[FragmentPlan]:
    """The *sealed* fragments of an OPEN ledger naming ``lost`` (every
    fragment but the last: the writer moved on from ``LAC + 1``, so their
    entries are all acknowledged), with their entry ranges.  Re-pointing
    them does not disturb the writer (``LedgerMetadata.sealed_bookies_replaced``)."""
    plans = []
    for index, (first, ensemble) in enumerate(md.ensembles[:-1]):
        if lost in ensemble:
            plans.append(FragmentPlan(md.ledger_id, first, md.ensembles[index + 1][0] - 1,
                                      tuple(ensemble), md.write_quorum, lost))
    return plans


def plan_settle(before: LedgerMetadata, after: LedgerMetadata,
                lost: str) -> list[FragmentPlan]:
    """After a recovery closed an OPEN ledger (``before`` -> ``after``): the
    shares its write-back gave to the bookies that took ``lost``'s place.

    Recovery re-writes the unconfirmed tail and, when ``lost`` fails those
    writes, changes the ensemble: a replacement R enters a fragment of
    ``after`` at ``lost``'s position.  Those writes were acknowledged at the
    ack quorum, like any add, so R may not hold all of its share durably yet.
    Each plan names R as ``lost`` (its sources are the other replicas) and
    covers the fragment's entries whose write set holds R; copying them to R
    durably keeps the rule that a lost bookie leaves a fragment only once
    its replacement is durable."""
    plans = []
    for index, (first, ensemble) in enumerate(after.ensembles):
        previous = next((ens for start, ens in reversed(before.ensembles) if start <= first),
                        None)
        if previous is None or len(previous) != len(ensemble):
            continue
        last = (min(after.ensembles[index + 1][0] - 1, after.last_entry_id)
                if index + 1 < len(after.ensembles) else after.last_entry_id)
        for position, bookie in enumerate(ensemble):
            if previous[position] == lost and bookie != lost:
                plans.append(FragmentPlan(after.ledger_id, first, last, tuple(ensemble),
                                          after.write_quorum, bookie))
    return plans


def runs_to_copy(first_entry_id: int, last_entry_id: int, ensemble_size: int,
                 write_quorum: int, position: int) -> Iterator[tuple[int, int]]:
    """Runs ``(first, last)`` (inclusive) of the entries in
    ``first_entry_id..last_entry_id`` whose write set contains ensemble
    ``position``.  Entry ``e`` is stored at positions ``e % E .. e % E + Qw - 1``
    (mod E), so the position stores the ``Qw`` consecutive entries ending at
    ``position`` in every period of ``E``: ``[position - Qw + 1 + kE,
    position + kE]``.  Adjacent runs (``Qw == E``) are merged."""
    if not 0 <= position < ensemble_size or not 1 <= write_quorum <= ensemble_size:
        raise ValueError(f"position {position} / write quorum {write_quorum} do not fit "
                         f"an ensemble of {ensemble_size}")
    if last_entry_id < first_entry_id:
        return
    k = (first_entry_id - position) // ensemble_size  # the period that may reach first
    pending: tuple[int, int] | None = None
    while True:
        start = position - write_quorum + 1 + k * ensemble_size
        end = position + k * ensemble_size
        k += 1
        if start > last_entry_id:
            break
        start, end = max(start, first_entry_id), min(end, last_entry_id)
        if end < start:
            continue
        if pending is not None and pending[1] + 1 == start:
            pending = (pending[0], end)
            continue
        if pending is not None:
            yield pending
        pending = (start, end)
    if pending is not None:
        yield pending


def choose_replacement(ensemble: Sequence[str], lost: str, bookies: Mapping[str, bool],
                       load: Mapping[str, int], salt: int = 0, *,
                       write_quorum: int | None = None,
                       locations: Mapping[str, Location] | None = None) -> str | None:
    """A live writable bookie for ``lost``'s place in ``ensemble``, or None.

    ``bookies``: live bookie id -> read-only flag.  ``load``: fragments each
    bookie has taken so far in this run.  Host placement comes first
    (``placement.choose_for_position``: a host outside the write sets holding
    the position, when one is free; ``write_quorum`` None = every position),
    then the load (fewest wins); ``salt`` (e.g. the ledger id) rotates the
    order among equals, so one run does not pile every tie onto one bookie."""
    eligible = sorted(b for b, read_only in bookies.items()
                      if not read_only and b != lost and b not in ensemble)
    if not eligible:
        return None
    offset = salt % len(eligible)
    rotated = eligible[offset:] + eligible[:offset]
    ranked = sorted(rotated, key=lambda b: load.get(b, 0))  # stable: rotation among equals
    position = list(ensemble).index(lost)
    return choose_for_position(ensemble, write_quorum or len(ensemble), position, ranked,
                               locations)


def replace_bookie(md: LedgerMetadata, plan: FragmentPlan,
                   replacement: str) -> LedgerMetadata | None:
    """The CAS transform: ``plan``'s fragment names ``replacement`` where it
    named the lost bookie.  ``None``: nothing to change (already re-pointed).
    ``StalePlanError``: the ledger is no longer as planned."""
    for index, (first, ensemble) in enumerate(md.ensembles):
        if first != plan.first_entry_id:
            continue
        if plan.lost not in ensemble:
            return None
        if md.state != CLOSED and index == len(md.ensembles) - 1:
            raise StalePlanError(f"ledger {md.ledger_id} is {md.state} and its fragment at "
                                 f"{first} is the last: its writer may still add to it")
        if tuple(ensemble) != plan.ensemble:
            raise StalePlanError(f"ledger {md.ledger_id} fragment at {first} changed to "
                                 f"{list(ensemble)}")
        bookies = tuple(replacement if b == plan.lost else b for b in ensemble)
        fragments = md.ensembles[:index] + ((first, bookies),) + md.ensembles[index + 1:]
        return replace(md, ensembles=fragments)
    raise StalePlanError(f"ledger {md.ledger_id} has no fragment at {plan.first_entry_id} any "
                         f"more")


def matching_key(md: LedgerMetadata, keys: Sequence[bytes]) -> bytes | None:
    """The master key among ``keys`` that ``md``'s password hash accepts (the
    first one when the ledger has no hash), or None."""
    if md.password_hash is None:
        return keys[0] if keys else None
    for key in keys:
        if check_password(md.password_hash, key):
            return key
    return None
