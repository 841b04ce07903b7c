"""Host- and rack-aware placement: which bookies a ledger's write sets use.

Pure (no sockets, files, clocks or randomness: new ensembles take an
injected ``random.Random``, replacements are deterministic).  Every bookie
has a ``Location`` (``host``, ``rack``); a bookie with no known location is
its own host on the default rack, so unlabelled bookies (old registrations,
the simulation's defaults) keep the behaviour placement had before labels.

The rule (``meets_rule``): every write set -- ``Qw`` consecutive ensemble
positions, wrapping (``quorum.write_set_positions``) -- holds bookies on
``Qw`` distinct hosts.  That is stronger than "the ensemble spans hosts":
with E=4, Qw=2 and two hosts the ensemble must alternate them.  Since an ack
quorum is ``Qa`` distinct members of one write set, an entry acknowledged
under the rule is on ``Qa`` hosts: seed 003's ``minRegionsForDurability``
with hosts as regions and ``Qa`` as the minimum, by construction.

Guarantees:

* ``choose_ensemble`` returns ``E`` distinct writable bookies meeting the
  rule whenever any choice of live writable bookies can
  (``ensemble_possible``); in ``rack`` mode it first tries distinct racks
  per write set, then distinct hosts.  When neither is possible it still
  returns an ensemble (durability by count beats placement), spreading
  hosts as evenly as it can, and the caller reports it as degraded.
* ``choose_for_position`` picks a replacement for one position so that every
  write set containing it stays on distinct hosts when such a bookie exists
  (``replacement_possible``); order of preference (both modes): a bookie
  whose host is in none of the affected write sets, among those the fewest
  rack clashes with them, then the fewest host clashes, then the caller's
  order; any writable bookie outside the ensemble when nothing better is
  live.  It returns None only when no candidate is outside the ensemble.
* Mode ``none`` is the old rule: a uniform random ensemble, the first
  acceptable replacement.

How a valid ensemble is built: with ``q = E // Qw``, a host may hold at most
``q`` positions (two of its positions closer than ``Qw`` would share a write
set), so a valid ensemble exists iff the hosts' capped bookie counts
``min(count, q)`` add up to ``E``.  The ring is cut into ``q`` blocks of
``E // q`` or ``E // q + 1`` positions (bigger first) and the chosen
bookies, grouped by host (largest group first), fill the blocks
column-major: column 0 of every block, then column 1, ...  Two positions of
one host are then a whole block (at least ``Qw``) apart; the unit tests
check every shape up to E=9 exhaustively.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from appliance.protocol.quorum import write_set_positions

if TYPE_CHECKING:  # the caller injects its random source: the core has none of its own
    import random

DEFAULT_RACK = "default-rack"
HOST, RACK, NONE = "host", "rack", "none"
PLACEMENT_MODES = (HOST, RACK, NONE)


@dataclass(frozen=True, slots=True)
class Location:
    host: str
    rack: str = DEFAULT_RACK


def location_of(bookie: str, locations: Mapping[str, Location] | None) -> Location:
    """``bookie``'s location; unknown bookies are their own host."""
    found = locations.get(bookie) if locations else None
    return found if found is not None else Location(f"bookie:{bookie}")


def check_mode(mode: str) -> str:
    if mode not in PLACEMENT_MODES:
        raise ValueError(f"placement must be one of {PLACEMENT_MODES}, got {mode!r}")
    return mode


# -- the rule -----------------------------------------------------------------------
def write_set_hosts(ensemble: Sequence[str], write_quorum: int,
                    locations: Mapping[str, Location] | None) -> list[int]:
    """How many distinct hosts each write set (by first position) spans."""
    hosts = [location_of(b, locations).host for b in ensemble]
    size = len(ensemble)
    return [len({hosts[p] for p in write_set_positions(first, size, write_quorum)})
            for first in range(size)]


def meets_rule(ensemble: Sequence[str], write_quorum: int,
               locations: Mapping[str, Location] | None) -> bool:
    """Whether every write set of ``ensemble`` is on ``write_quorum`` distinct hosts."""
    return all(n == write_quorum for n in write_set_hosts(ensemble, write_quorum, locations))


def host_count(bookies: Sequence[str], locations: Mapping[str, Location] | None) -> int:
    """How many distinct hosts ``bookies`` are on (1: a one-machine appliance,
    where a shared host is the deployment, not a degraded choice)."""
    return len({location_of(b, locations).host for b in bookies})


def _groups(bookies: Sequence[str], locations, key: str) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for b in bookies:
        groups.setdefault(getattr(location_of(b, locations), key), []).append(b)
    return groups


def _possible(groups: Mapping[str, list], size: int, write_quorum: int) -> bool:
    cap = size // write_quorum
    return sum(min(len(g), cap) for g in groups.values()) >= size


def ensemble_possible(writable: Sequence[str], locations: Mapping[str, Location] | None,
                      size: int, write_quorum: int) -> bool:
    """Whether some ``size`` of ``writable`` meet the rule (see module doc)."""
    _check_shape(size, write_quorum)
    return _possible(_groups(writable, locations, "host"), size, write_quorum)


def _check_shape(size: int, write_quorum: int) -> None:
    if not 1 <= write_quorum <= size:
        raise ValueError(f"write quorum {write_quorum} does not fit an ensemble of {size}")


# -- new ensembles ------------------------------------------------------------------
def choose_ensemble(writable: Sequence[str], locations: Mapping[str, Location] | None,
                    size: int, write_quorum: int, rng: random.Random,
                    mode: str = HOST) -> tuple[str, ...] | None:
    """``size`` distinct bookies of ``writable`` for a new ledger (see the
    module doc); None when fewer than ``size`` are writable."""
    _check_shape(size, write_quorum)
    check_mode(mode)
    pool = sorted(set(writable))
    if len(pool) < size:
        return None
    if mode == NONE:
        return tuple(rng.sample(pool, size))
    for key in ((RACK, HOST) if mode == RACK else (HOST,)):
        groups = _groups(pool, locations, key)
        if _possible(groups, size, write_quorum):
            return _lay_out(groups, size, write_quorum, rng, size // write_quorum)
    return _lay_out(_groups(pool, locations, HOST), size, write_quorum, rng, size)


def _lay_out(groups: Mapping[str, list[str]], size: int, write_quorum: int,
             rng: random.Random, cap: int) -> tuple[str, ...]:
    """Take up to ``cap`` bookies per group, spread evenly over the groups,
    and fill the ring column-major (module doc)."""
    names = sorted(groups)
    rng.shuffle(names)
    members = {n: rng.sample(groups[n], len(groups[n])) for n in names}
    counts = dict.fromkeys(names, 0)
    taken = 0
    while taken < size:  # water-filling: one more per group per round
        for n in names:
            if taken < size and counts[n] < min(cap, len(members[n])):
                counts[n] += 1
                taken += 1
    order = sorted((n for n in names if counts[n]), key=lambda n: -counts[n])
    chosen = [b for n in order for b in members[n][:counts[n]]]
    ring: list[str | None] = [None] * size
    for slot, bookie in zip(_column_major(size, write_quorum), chosen, strict=True):
        ring[slot] = bookie
    return tuple(ring)


def _column_major(size: int, write_quorum: int) -> list[int]:
    """Ring positions, column by column over ``size // write_quorum`` blocks."""
    blocks = size // write_quorum
    small, big = divmod(size, blocks)
    starts, sizes, at = [], [], 0
    for b in range(blocks):
        starts.append(at)
        sizes.append(small + (1 if b < big else 0))
        at += sizes[-1]
    return [starts[b] + col for col in range(small + 1) for b in range(blocks)
            if col < sizes[b]]


# -- replacements ---------------------------------------------------------------------
def neighbours(size: int, write_quorum: int, position: int) -> list[int]:
    """The other positions sharing a write set with ``position``."""
    return [p for p in range(size)
            if p != position and min((p - position) % size, (position - p) % size)
            < write_quorum]


def shares_host(ensemble: Sequence[str], write_quorum: int, position: int, bookie: str,
                locations: Mapping[str, Location] | None) -> bool:
    """Whether ``bookie`` at ``position`` shares a host with the other members
    of the write sets holding that position."""
    hosts = {location_of(ensemble[p], locations).host
             for p in neighbours(len(ensemble), write_quorum, position)}
    return location_of(bookie, locations).host in hosts


def replacement_possible(ensemble: Sequence[str], write_quorum: int, position: int,
                         writable: Sequence[str],
                         locations: Mapping[str, Location] | None) -> bool:
    """Whether some writable bookie outside ``ensemble`` keeps every write set
    holding ``position`` on distinct hosts."""
    return any(not shares_host(ensemble, write_quorum, position, b, locations)
               for b in writable if b not in ensemble)


def choose_for_position(ensemble: Sequence[str], write_quorum: int, position: int,
                        candidates: Sequence[str],
                        locations: Mapping[str, Location] | None,
                        mode: str = HOST) -> str | None:
    """The best of ``candidates`` (in the caller's order of preference; those
    in ``ensemble`` are skipped) for ``position``, by the module doc's
    fallback order; None when no candidate is left."""
    check_mode(mode)
    pool = [b for b in candidates if b not in ensemble]
    if not pool:
        return None
    if mode == NONE:
        return pool[0]
    near = [location_of(ensemble[p], locations)
            for p in neighbours(len(ensemble), write_quorum, position)]
    hosts = [loc.host for loc in near]
    racks = [loc.rack for loc in near]

    def clashes(bookie: str) -> tuple[bool, int, int]:
        loc = location_of(bookie, locations)
        same_host = hosts.count(loc.host)
        return same_host > 0, racks.count(loc.rack), same_host

    return min(pool, key=clashes)  # min keeps the first of equals: the caller's order


@dataclass(frozen=True, slots=True)
class Choice:
    """One replacement, as its chooser saw it: ``ensemble`` after it, the
    ``position`` filled, the ``candidates`` it could have taken."""

    ensemble: tuple[str, ...]
    write_quorum: int
    position: int
    candidates: tuple[str, ...]
    locations: Mapping[str, Location] | None

    def shared_hosts(self, bookie: str) -> bool:
        return shares_host(self.ensemble, self.write_quorum, self.position, bookie,
                           self.locations)

    @property
    def degraded(self) -> bool:
        """The write sets holding the position share a host with the new bookie."""
        return self.shared_hosts(self.ensemble[self.position])

    def problem(self) -> str | None:
        """Why this choice breaks the rule although a candidate kept it (None: fine)."""
        chosen = self.ensemble[self.position]
        if not self.degraded:
            return None
        better = [b for b in self.candidates if not self.shared_hosts(b)]
        if not better:
            return None
        host = location_of(chosen, self.locations).host
        return (f"position {self.position} of {list(self.ensemble)} took {chosen} (host "
                f"{host}, already in its write sets) while {better[0]} (host "
                f"{location_of(better[0], self.locations).host}) was free")


def replace_positions(ensemble: Sequence[str], write_quorum: int, positions: Sequence[int],
                      candidates: Sequence[str], locations: Mapping[str, Location] | None,
                      mode: str = HOST, observe=None) -> tuple[str, ...] | None:
    """``ensemble`` with each of ``positions`` replaced in turn (each choice
    sees the ones before it); None when candidates run out.  ``observe``
    (optional) is called with each ``Choice``."""
    out = list(ensemble)
    for pos in positions:
        bookie = choose_for_position(out, write_quorum, pos, candidates, locations, mode)
        if bookie is None:
            return None
        pool = tuple(b for b in candidates if b not in out)
        out[pos] = bookie
        if observe is not None:
            observe(Choice(tuple(out), write_quorum, pos, pool, locations))
    return tuple(out)
