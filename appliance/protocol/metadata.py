"""Ledger metadata: the immutable record every safety argument ends in a
compare-and-swap on, its pure transforms, and its versioned serialisation.

Pure and stdlib-only: the metadata store (``storage.metadata``) persists these
bytes with CAS; the protocol core and the simulation apply the transforms.
A transform never mutates: it returns a new ``LedgerMetadata`` or raises the
protocol error that says why the change is not allowed.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field, replace

from appliance.protocol.errors import (
    CorruptMetadataError,
    LedgerClosedError,
    LedgerFencedError,
)

OPEN = "OPEN"
IN_RECOVERY = "IN_RECOVERY"
CLOSED = "CLOSED"
STATES = (OPEN, IN_RECOVERY, CLOSED)

DIGEST_TYPES = ("crc32c", "hmac-sha256")

FORMAT_VERSION = 1

Fragment = tuple[int, tuple[str, ...]]  # (first entry id, bookie ids)


def check_quorums(ensemble_size: int, write_quorum: int, ack_quorum: int) -> None:
    """E >= Qw >= Qa >= 1, as ``ValueError`` naming the argument."""
    for name, value in (("ensemble", ensemble_size), ("write_quorum", write_quorum),
                        ("ack_quorum", ack_quorum)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if write_quorum > ensemble_size:
        raise ValueError(f"write_quorum ({write_quorum}) must be <= ensemble ({ensemble_size})")
    if ack_quorum > write_quorum:
        raise ValueError(f"ack_quorum ({ack_quorum}) must be <= write_quorum ({write_quorum})")


@dataclass(frozen=True)
class LedgerMetadata:
    ledger_id: int
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    ensembles: tuple[Fragment, ...]
    state: str = OPEN
    last_entry_id: int = -1  # meaningful once CLOSED; -1 = empty
    length: int = 0  # payload bytes up to last_entry_id, once CLOSED
    digest_type: str = "crc32c"
    password_hash: bytes | None = None  # hash of the master key; None = no password
    # The master key sealed to the appliance's cluster key (appliance.meta.custody):
    # only holders of the cluster private key (bookies, repair) can open it.
    sealed_key: bytes | None = None
    ctime_ms: int = 0
    custom: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        check_quorums(self.ensemble_size, self.write_quorum, self.ack_quorum)
        if self.state not in STATES:
            raise ValueError(f"state must be one of {STATES}, got {self.state!r}")
        if self.digest_type not in DIGEST_TYPES:
            raise ValueError(f"digest must be one of {DIGEST_TYPES}, got {self.digest_type!r}")
        if not self.ensembles:
            raise ValueError("a ledger needs at least one fragment")
        previous = -1
        for first, bookies in self.ensembles:
            if len(bookies) != self.ensemble_size or len(set(bookies)) != len(bookies):
                raise ValueError(f"fragment at {first} must name {self.ensemble_size} "
                                 f"distinct bookies, got {list(bookies)}")
            if first <= previous and not (first == 0 and previous == -1):
                raise ValueError("fragments must start at increasing entry ids")
            previous = first
        if self.ensembles[0][0] != 0:
            raise ValueError("the first fragment must start at entry 0")

    # -- queries --------------------------------------------------------------
    @property
    def is_closed(self) -> bool:
        return self.state == CLOSED

    @property
    def last_fragment(self) -> Fragment:
        return self.ensembles[-1]

    def fragment_for(self, entry_id: int) -> Fragment:
        """The fragment (first entry, bookies) that holds ``entry_id``."""
        chosen = self.ensembles[0]
        for fragment in self.ensembles:
            if fragment[0] > entry_id:
                break
            chosen = fragment
        return chosen

    def write_set(self, entry_id: int) -> tuple[str, ...]:
        """The Qw bookies that store ``entry_id``: starting at index e % E."""
        bookies = self.fragment_for(entry_id)[1]
        start = entry_id % self.ensemble_size
        return tuple(bookies[(start + i) % self.ensemble_size] for i in range(self.write_quorum))

    def sealed_bookies_replaced(self, other: LedgerMetadata) -> bool:
        """``other`` is this OPEN ledger with only bookies of *sealed*
        fragments (every fragment but the last) replaced: what re-replication
        does to an open ledger without disturbing its writer.  Same fragment
        starts and sizes, the same last fragment, the same state."""
        return (self.state == other.state and len(self.ensembles) == len(other.ensembles)
                and self.ensembles[-1] == other.ensembles[-1]
                and all(a[0] == b[0] and len(a[1]) == len(b[1])
                        for a, b in zip(self.ensembles, other.ensembles, strict=True)))

    def bookies(self) -> set[str]:
        return {b for _, ens in self.ensembles for b in ens}

    # -- pure transforms ------------------------------------------------------
    def with_fragment(self, first_entry_id: int, bookies: tuple[str, ...] | list[str]):
        """Ensemble change: a new fragment from ``first_entry_id``.  A fragment
        that starts where the last one starts replaces it (nothing was written
        to it that was acknowledged)."""
        self._require_open()
        bookies = tuple(bookies)
        last_first = self.last_fragment[0]
        if first_entry_id < last_first:
            raise ValueError(f"new fragment at {first_entry_id} precedes the last at {last_first}")
        kept = self.ensembles[:-1] if first_entry_id == last_first else self.ensembles
        return replace(self, ensembles=kept + ((first_entry_id, bookies),))

    def with_recovery_fragment(self, first_entry_id: int, bookies: tuple[str, ...] | list[str]):
        """A fragment a recovery created while writing entries back (applied
        together with its close).  Same placement rule as ``with_fragment``,
        but only for a ledger IN_RECOVERY."""
        if self.state != IN_RECOVERY:
            raise ValueError(f"ledger {self.ledger_id} is {self.state}, not IN_RECOVERY")
        bookies = tuple(bookies)
        last_first = self.last_fragment[0]
        if first_entry_id < last_first:
            raise ValueError(f"new fragment at {first_entry_id} precedes the last at {last_first}")
        kept = self.ensembles[:-1] if first_entry_id == last_first else self.ensembles
        return replace(self, ensembles=kept + ((first_entry_id, bookies),))

    def to_in_recovery(self):
        if self.state == CLOSED:
            raise LedgerClosedError(f"ledger {self.ledger_id} is already closed")
        return replace(self, state=IN_RECOVERY)

    def to_closed(self, last_entry_id: int, length: int = 0):
        if self.state == CLOSED:
            raise LedgerClosedError(f"ledger {self.ledger_id} is already closed")
        if last_entry_id < -1:
            raise ValueError(f"last_entry_id must be >= -1, got {last_entry_id}")
        return replace(self, state=CLOSED, last_entry_id=last_entry_id, length=length)

    def _require_open(self) -> None:
        if self.state == CLOSED:
            raise LedgerClosedError(f"ledger {self.ledger_id} is closed")
        if self.state == IN_RECOVERY:
            raise LedgerFencedError(f"ledger {self.ledger_id} is in recovery")

    # -- serialisation --------------------------------------------------------
    def to_bytes(self) -> bytes:
        doc = {
            "format": FORMAT_VERSION,
            "ledger_id": self.ledger_id,
            "ensemble_size": self.ensemble_size,
            "write_quorum": self.write_quorum,
            "ack_quorum": self.ack_quorum,
            "state": self.state,
            "last_entry_id": self.last_entry_id,
            "length": self.length,
            "digest_type": self.digest_type,
            "password_hash": (base64.b64encode(self.password_hash).decode()
                              if self.password_hash is not None else None),
            "ctime_ms": self.ctime_ms,
            **({"sealed_key": base64.b64encode(self.sealed_key).decode()}
               if self.sealed_key is not None else {}),
            "ensembles": [[first, list(bookies)] for first, bookies in self.ensembles],
            "custom": dict(self.custom),
        }
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes, where: str = "ledger metadata") -> LedgerMetadata:
        try:
            doc = json.loads(data)
            if doc.get("format") != FORMAT_VERSION:
                raise ValueError(f"unsupported format {doc.get('format')!r}")
            ph = doc["password_hash"]
            return cls(
                ledger_id=int(doc["ledger_id"]),
                ensemble_size=int(doc["ensemble_size"]),
                write_quorum=int(doc["write_quorum"]),
                ack_quorum=int(doc["ack_quorum"]),
                state=doc["state"],
                last_entry_id=int(doc["last_entry_id"]),
                length=int(doc["length"]),
                digest_type=doc["digest_type"],
                password_hash=base64.b64decode(ph) if ph is not None else None,
                sealed_key=(base64.b64decode(doc["sealed_key"])
                            if doc.get("sealed_key") is not None else None),
                ctime_ms=int(doc["ctime_ms"]),
                ensembles=tuple((int(f), tuple(b)) for f, b in doc["ensembles"]),
                custom=tuple(sorted(doc.get("custom", {}).items())),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptMetadataError(f"{where}: cannot decode ({exc})") from exc
