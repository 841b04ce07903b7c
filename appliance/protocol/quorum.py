"""Quorum arithmetic and the safety switches, in one place.

* write set of entry ``e``: ``Qw`` consecutive ensemble positions from ``e % E``;
* ``QC = Qw - Qa + 1`` (ack-quorum coverage over one entry's write set);
* ``EC = E - Qa + 1`` (ensemble coverage over the last fragment);
* a recovery read is positive at ``positive_min`` OK replies (``Qa`` by
  default, as BP-46 says), negative at ``QC`` explicit negatives, and unknown
  when every replica has answered and neither holds: recovery then retries,
  it never guesses.

``Protections`` lists the four rules whose absence BookKeeper's TLA+ model
turned into counterexamples, the durable-reply rule (a bookie answers
only once its journal made the change durable) and the repair rule (limbo
is cleared only once the bookie holds its whole share,
``appliance.protocol.repair``) and the writer's two replacement rules (a
bookie that refuses an add is replaced even when the ack quorum confirmed
the entry already; no entry is acknowledged while an ensemble change is in
flight, so every pending one reaches the replacement) and the reader's
negative rule (an explicit negative only when every replica said no, also
under speculative reads, ``appliance.protocol.reader``), and the healing rule (entries acknowledged
while a bookie lagged are re-sent to it, ``heal-short``; a bookie's scrub
finds a closed ledger short of its share and repairs it, ``scrub-short``,
``appliance.protocol.scrub``).  Production code uses ``Protections()``
(all on); switching one off exists only so the simulation can show the
checker finds the matching counterexample.  ``placement`` is not a safety
rule but the host-aware choice of bookies: off, the simulation's cores
choose as if placement were ``"none"`` and its ``placement`` invariant must
notice.
"""

from __future__ import annotations

from dataclasses import dataclass

from appliance.protocol.errors import OK, is_explicit_negative

PROTECTION_NAMES = ("recovery-read-fence", "fragment-start", "fence-on-boot", "limbo",
                    "durable-reply", "repair-share", "placement", "change-holds-acks",
                    "late-refusal", "read-negative-all",
                    "heal-short", "scrub-short")


@dataclass(frozen=True, slots=True)
class Protections:
    recovery_read_fence: bool = True  # recovery reads carry the fence flag (BookKeeper 2614)
    fragment_start: bool = True  # recovery starts no earlier than the last fragment (2615)
    fence_on_boot: bool = True  # BP-46: fence every ledger after possible data loss
    limbo: bool = True  # BP-46: limbo ledgers answer "unknown", never an explicit negative
    durable_reply: bool = True  # replies wait for their journal ticket (durable_replies)
    repair_share: bool = True  # BP-46 repair clears limbo only once the whole share is held
    placement: bool = True  # host-aware choices (appliance.protocol.placement); off: the
    #                         simulation runs its cores with placement "none"
    change_holds_acks: bool = True  # the writer acknowledges nothing during an ensemble change
    late_refusal: bool = True  # a refusal after the ack quorum still replaces the bookie
    # a read is an explicit negative only once every replica of the entry's
    # write set said so (BP-46), never from the first answer of a race
    # between a read and its speculative copy
    read_negative_all: bool = True
    heal_short: bool = True  # the writer re-sends entries left short on a lagging bookie
    scrub_short: bool = True  # a bookie's scrub repairs a closed ledger short of its share

    @classmethod
    def without(cls, *names: str) -> Protections:
        """All protections except ``names`` (from ``PROTECTION_NAMES``)."""
        unknown = set(names) - set(PROTECTION_NAMES)
        if unknown:
            raise ValueError(f"unknown protection(s) {sorted(unknown)}; "
                             f"choose from {PROTECTION_NAMES}")
        return cls(**{n.replace("-", "_"): False for n in names})


ALL_PROTECTIONS = Protections()


def ack_coverage(write_quorum: int, ack_quorum: int) -> int:
    """QC: replies from this many of a write set cover every ack quorum."""
    return write_quorum - ack_quorum + 1


def ensemble_coverage(ensemble_size: int, ack_quorum: int) -> int:
    """EC: replies from this many of an ensemble cover every ack quorum."""
    return ensemble_size - ack_quorum + 1


def write_set_positions(entry_id: int, ensemble_size: int, write_quorum: int) -> tuple[int, ...]:
    start = entry_id % ensemble_size
    return tuple((start + i) % ensemble_size for i in range(write_quorum))


def in_write_set(position: int, entry_id: int, ensemble_size: int, write_quorum: int) -> bool:
    """Whether ensemble ``position`` stores ``entry_id``: O(1), no allocation."""
    return (position - entry_id) % ensemble_size < write_quorum


class WriteSets:
    """The ``E`` distinct write sets of one ensemble, precomputed once per
    fragment so the hot path never allocates per entry."""

    __slots__ = ("ensemble", "ensemble_size", "write_quorum", "positions", "bookies", "index")

    def __init__(self, ensemble: tuple[str, ...], write_quorum: int):
        self.ensemble = tuple(ensemble)
        self.ensemble_size = len(self.ensemble)
        self.write_quorum = write_quorum
        size = self.ensemble_size
        self.positions = tuple(write_set_positions(s, size, write_quorum) for s in range(size))
        self.bookies = tuple(tuple(self.ensemble[p] for p in ps) for ps in self.positions)
        self.index = {b: i for i, b in enumerate(self.ensemble)}

    def of(self, entry_id: int) -> tuple[str, ...]:
        return self.bookies[entry_id % self.ensemble_size]

    def positions_of(self, entry_id: int) -> tuple[int, ...]:
        return self.positions[entry_id % self.ensemble_size]


# -- recovery read classification -------------------------------------------
POSITIVE = "positive"
NEGATIVE = "negative"
UNKNOWN = "unknown"
PENDING = "pending"


def classify_recovery_read(positives: int, negatives: int, unknowns: int, write_quorum: int,
                           ack_quorum: int, positive_min: int) -> str:
    """Decide one entry's recovery read from its reply counts so far."""
    if positives >= positive_min:
        return POSITIVE
    if negatives >= ack_coverage(write_quorum, ack_quorum):
        return NEGATIVE
    if positives + negatives + unknowns >= write_quorum:
        return UNKNOWN
    return PENDING


def response_class(code: int) -> str:
    """BP-46 response class of a reply code."""
    if code == OK:
        return POSITIVE
    return NEGATIVE if is_explicit_negative(code) else UNKNOWN
