"""Logs on ledgers (seed 003, DistributedLog): the pure rules.

A *log* is a named, append-only stream of records that outlives any one
writer.  It is a sequence of *segments*, each one ledger; at most one is
IN_PROGRESS (being written), the ones before it are COMPLETED (their ledger
closed, their last record known) or TRUNCATED (dropped from the front, their
ledgers being deleted).  This module holds what is protocol, as pure code the
simulation drives: positions (``DLSN``), the log's metadata record and every
transition of it, and the rollover rule.  The entry format (records packed
into one ledger entry) is ``appliance.protocol.log_entry``.

Ownership and fencing (one writer per log):

* The metadata carries an ``epoch``.  Opening a writer bumps it with a CAS
  (``take_ownership``); every later change the writer makes
  (``start_segment``, ``complete_segment``) names the epoch it owns and is
  refused with ``LogFencedError`` once a newer writer took over.
* The new writer then recovers the previous IN_PROGRESS segment (opens its
  ledger with recovery: the ledger is fenced, so the superseded writer's next
  add fails, and closed at the last acknowledged entry) and completes it
  before starting its own segment.  So a superseded writer can neither add to
  its ledger nor start a new segment: its next write fails.
* Whatever the superseded writer had acknowledged before the fence is in the
  recovered ledger (ledger recovery never loses an acknowledged entry), so
  every write that returned a position is read back.

Positions: ``DLSN(seq, entry_id, slot)``, ordered; a record's DLSN is its
segment's sequence number, the ledger entry holding it and its index among
that entry's records.  Transaction ids (txids) are the application's own
increasing numbers, checked to strictly increase per log.
"""

from __future__ import annotations

import base64
import json
import re
from collections import namedtuple
from dataclasses import dataclass, field, replace

from appliance.protocol.errors import (
    CorruptMetadataError,
    LogFencedError,
    LogTruncatedError,
)

IN_PROGRESS = "IN_PROGRESS"
COMPLETED = "COMPLETED"
TRUNCATED = "TRUNCATED"
SEGMENT_STATES = (IN_PROGRESS, COMPLETED, TRUNCATED)
HOT = "hot"  # the segment's records are in its ledger, on the bookies
COLD = "cold"  # ... in one verified file in cold storage (``Segment.cold``)
TIERS = (HOT, COLD)

LOG_FORMAT_VERSION = 1
NAME_MAX = 200
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
TXID_MIN = -(2**63)
TXID_MAX = 2**63 - 1
NO_TXID = TXID_MIN  # "no record yet": every txid is above it


def check_log_name(name: object) -> str:
    """A log name: 1..200 of ``A-Z a-z 0-9 . _ -``, not starting with ``.``
    or ``-`` (it becomes one node name of the metadata store)."""
    if not isinstance(name, str):
        raise TypeError(f"log name must be a str, got {type(name).__name__}")
    if not 0 < len(name) <= NAME_MAX or not _NAME.fullmatch(name):
        raise ValueError(f"bad log name {name!r}: 1..{NAME_MAX} characters of A-Z a-z 0-9 "
                         ". _ -, not starting with . or -")
    return name


def check_txid(txid: object) -> int:
    if not isinstance(txid, int) or isinstance(txid, bool):
        raise TypeError(f"txid must be an int, got {type(txid).__name__}")
    if not TXID_MIN < txid <= TXID_MAX:
        raise ValueError(f"txid must be in -2**63+1 .. 2**63-1, got {txid}")
    return txid


class DLSN(namedtuple("_DLSNFields", "seq entry_id slot")):
    """A record's position: (segment sequence number, entry id, slot).
    Ordered and hashable (a tuple); ``str`` is ``"seq/entry/slot"``, read
    back by ``DLSN.parse``; ``DLSN.FIRST`` is before every record.  The
    constructor checks its arguments; ``dlsn_of`` (internal) does not."""

    __slots__ = ()
    FIRST: DLSN

    def __new__(cls, seq: int, entry_id: int, slot: int):
        for name, value in (("seq", seq), ("entry_id", entry_id), ("slot", slot)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"DLSN {name} must be an int, got {type(value).__name__}")
            if value < 0:
                raise ValueError(f"DLSN {name} must be >= 0, got {value}")
        return tuple.__new__(cls, (seq, entry_id, slot))

    def __str__(self) -> str:
        return f"{self[0]}/{self[1]}/{self[2]}"

    def __repr__(self) -> str:
        return f"DLSN({self[0]}, {self[1]}, {self[2]})"

    @classmethod
    def parse(cls, text: object) -> DLSN:
        """``"seq/entry/slot"`` (three integers >= 0) -> DLSN; ``ValueError``
        for anything else."""
        if isinstance(text, DLSN):
            return text
        if not isinstance(text, str):
            raise ValueError(f"a DLSN is 'seq/entry/slot', got {text!r}")
        parts = text.strip().split("/")
        if len(parts) != 3 or not all(p.isdigit() and p.isascii() for p in parts):
            raise ValueError(f"bad DLSN {text!r}: expected 'seq/entry/slot', three integers "
                             ">= 0 (e.g. 3/17/0)")
        return cls(*(int(p) for p in parts))

    def next(self) -> DLSN:
        """The position just after this one: a reader started there sees
        every record after this one and not this one."""
        return tuple.__new__(DLSN, (self[0], self[1], self[2] + 1))

    def to_list(self) -> list[int]:
        return list(self)


def dlsn_of(seq: int, entry_id: int, slot: int) -> DLSN:
    """A DLSN from values known to be valid (no checks: the hot path)."""
    return tuple.__new__(DLSN, (seq, entry_id, slot))


DLSN.FIRST = DLSN(0, 0, 0)


@dataclass(frozen=True)
class ColdCopy:
    """A cold segment's file: its URI, size, the content checksum (crc32c
    over its records, ``appliance.cold.segment_file``), the whole file's
    crc32c, when it moved, and its ledger's password record (readers of the
    file prove the log's password as they did to the ledger)."""

    uri: str
    bytes: int
    crc32c: int
    file_crc32c: int
    moved_ms: int
    password_hash: bytes | None = None  # the ledger's; None = no password

    def to_json(self) -> dict:
        ph = self.password_hash
        return {"uri": self.uri, "bytes": self.bytes, "crc32c": self.crc32c,
                "file_crc32c": self.file_crc32c, "moved_ms": self.moved_ms,
                "password_hash": None if ph is None else base64.b64encode(ph).decode()}

    @classmethod
    def from_json(cls, doc: dict) -> ColdCopy:
        ph = doc.get("password_hash")
        return cls(uri=str(doc["uri"]), bytes=int(doc["bytes"]), crc32c=int(doc["crc32c"]),
                   file_crc32c=int(doc["file_crc32c"]), moved_ms=int(doc["moved_ms"]),
                   password_hash=None if ph is None else base64.b64decode(ph))


@dataclass(frozen=True)
class Segment:
    """One ledger of a log.  ``records``, ``last_txid``, ``last_dlsn`` and
    ``first_txid`` are known once COMPLETED (an IN_PROGRESS segment's end is
    its ledger's LAC)."""

    seq: int
    ledger_id: int
    state: str = IN_PROGRESS
    epoch: int = 0  # the writer epoch that started it
    ctime_ms: int = 0
    records: int = 0
    first_txid: int = NO_TXID
    last_txid: int = NO_TXID
    last_dlsn: DLSN | None = None  # the last data record, if any
    last_entry_id: int = -1  # the ledger's last entry (control entries included)
    tier: str = HOT
    cold: ColdCopy | None = None  # where a cold segment's file is (tier COLD only)
    ledger_deleted: bool = False  # a cold segment's ledger is gone from the bookies

    def __post_init__(self) -> None:
        if self.tier not in TIERS or (self.tier == COLD) != (self.cold is not None):
            raise ValueError(f"segment {self.seq}: tier {self.tier!r} with cold copy "
                             f"{self.cold!r}")
        if self.ledger_deleted and self.tier != COLD:
            raise ValueError(f"segment {self.seq}: only a cold segment's ledger may be gone")
        if self.state not in SEGMENT_STATES:
            raise ValueError(f"segment state must be one of {SEGMENT_STATES}, "
                             f"got {self.state!r}")
        if self.seq < 1:
            raise ValueError(f"segment sequence numbers start at 1, got {self.seq}")

    def to_json(self) -> dict:
        return {"seq": self.seq, "ledger_id": self.ledger_id, "state": self.state,
                "epoch": self.epoch, "ctime_ms": self.ctime_ms, "records": self.records,
                "first_txid": None if self.first_txid == NO_TXID else self.first_txid,
                "last_txid": None if self.last_txid == NO_TXID else self.last_txid,
                "last_dlsn": None if self.last_dlsn is None else str(self.last_dlsn),
                "last_entry_id": self.last_entry_id, "tier": self.tier,
                "cold": None if self.cold is None else self.cold.to_json(),
                "ledger_deleted": self.ledger_deleted}

    @classmethod
    def from_json(cls, doc: dict) -> Segment:
        def txid(value):
            return NO_TXID if value is None else int(value)
        cold = doc.get("cold")  # records written before cold storage have no tier
        return cls(seq=int(doc["seq"]), ledger_id=int(doc["ledger_id"]), state=doc["state"],
                   tier=str(doc.get("tier", HOT)),
                   cold=None if cold is None else ColdCopy.from_json(cold),
                   ledger_deleted=bool(doc.get("ledger_deleted", False)),
                   epoch=int(doc["epoch"]), ctime_ms=int(doc["ctime_ms"]),
                   records=int(doc["records"]), first_txid=txid(doc["first_txid"]),
                   last_txid=txid(doc["last_txid"]),
                   last_dlsn=None if doc["last_dlsn"] is None else DLSN.parse(doc["last_dlsn"]),
                   last_entry_id=int(doc["last_entry_id"]))


@dataclass(frozen=True)
class LogMetadata:
    """A log's record in the metadata store (one node, changed by CAS)."""

    name: str
    epoch: int = 0  # bumped by every writer that takes the log over
    owner: str = ""  # who holds ``epoch`` (informational: host/pid/writer id)
    segments: tuple[Segment, ...] = field(default_factory=tuple)
    next_seq: int = 1
    truncated_before: DLSN = DLSN.FIRST  # records before it are gone
    last_txid: int = NO_TXID  # the highest txid of the completed segments
    ctime_ms: int = 0

    def __post_init__(self) -> None:
        check_log_name(self.name)
        seqs = [s.seq for s in self.segments]
        if seqs != sorted(set(seqs)) or any(s >= self.next_seq for s in seqs):
            raise ValueError(f"log {self.name}: segment numbers {seqs} out of order "
                             f"(next {self.next_seq})")
        states = [s.state for s in self.segments]
        dropped = next((i for i, state in enumerate(states) if state != TRUNCATED),
                       len(states))
        if TRUNCATED in states[dropped:]:
            raise ValueError(f"log {self.name}: truncated segments must come first")
        if IN_PROGRESS in states[:-1]:
            raise ValueError(f"log {self.name}: only the last segment may be in progress")

    # -- queries ---------------------------------------------------------------
    @property
    def live_segments(self) -> tuple[Segment, ...]:
        return tuple(s for s in self.segments if s.state != TRUNCATED)

    @property
    def in_progress(self) -> Segment | None:
        live = self.live_segments
        return live[-1] if live and live[-1].state == IN_PROGRESS else None

    def segment(self, seq: int) -> Segment | None:
        return next((s for s in self.segments if s.seq == seq), None)

    @property
    def records(self) -> int:
        """Records of the completed live segments."""
        return sum(s.records for s in self.live_segments if s.state == COMPLETED)

    @property
    def last_dlsn(self) -> DLSN | None:
        """The last record of the completed segments, if any."""
        done = [s.last_dlsn for s in self.live_segments
                if s.state == COMPLETED and s.last_dlsn is not None]
        return done[-1] if done else None

    def check_readable(self, position: DLSN) -> None:
        """``LogTruncatedError`` if ``position`` is inside the truncated range:
        in a dropped segment, before the truncation point.  Segments are
        numbered from 1, so a position in segment 0 (``DLSN.FIRST``) is before
        every record, never inside the range: a reader from it starts at the
        first record still there."""
        if position.seq > 0 and position < self.truncated_before:
            raise LogTruncatedError(f"log {self.name}: position {position} was truncated "
                                    f"(records before {self.truncated_before} are gone)")

    def segments_from(self, position: DLSN) -> list[Segment]:
        """The live segments a reader at ``position`` still has to read, in order."""
        return [s for s in self.live_segments if s.seq >= position.seq]

    # -- serialisation -----------------------------------------------------------
    def to_bytes(self) -> bytes:
        doc = {"format": LOG_FORMAT_VERSION, "name": self.name, "epoch": self.epoch,
               "owner": self.owner, "next_seq": self.next_seq,
               "truncated_before": str(self.truncated_before),
               "last_txid": None if self.last_txid == NO_TXID else self.last_txid,
               "ctime_ms": self.ctime_ms, "segments": [s.to_json() for s in self.segments]}
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes, where: str = "log") -> LogMetadata:
        try:
            doc = json.loads(data)
            if doc.get("format") != LOG_FORMAT_VERSION:
                raise ValueError(f"unsupported log format {doc.get('format')!r}")
            return cls(name=doc["name"], epoch=int(doc["epoch"]), owner=str(doc["owner"]),
                       segments=tuple(Segment.from_json(s) for s in doc["segments"]),
                       next_seq=int(doc["next_seq"]),
                       truncated_before=DLSN.parse(doc["truncated_before"]),
                       last_txid=NO_TXID if doc["last_txid"] is None else int(doc["last_txid"]),
                       ctime_ms=int(doc["ctime_ms"]))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptMetadataError(f"{where}: bad log record: {exc}") from exc

    def describe(self) -> dict:
        return {"name": self.name, "epoch": self.epoch, "owner": self.owner,
                "truncated_before": str(self.truncated_before),
                "last_txid": None if self.last_txid == NO_TXID else self.last_txid,
                "segments": [s.to_json() for s in self.segments]}


# -- transitions (pure: a new LogMetadata, or the error that says why not) --------
def new_log(name: str, ctime_ms: int) -> LogMetadata:
    return LogMetadata(name=check_log_name(name), ctime_ms=ctime_ms)


def _check_epoch(md: LogMetadata, epoch: int) -> None:
    if md.epoch != epoch:
        raise LogFencedError(f"log {md.name}: writer epoch {epoch} was superseded by epoch "
                             f"{md.epoch} ({md.owner or 'another writer'})")


def take_ownership(md: LogMetadata, owner: str) -> LogMetadata:
    """A new writer: the next epoch; every older writer is fenced from here."""
    return replace(md, epoch=md.epoch + 1, owner=owner)


def start_segment(md: LogMetadata, epoch: int, ledger_id: int, ctime_ms: int) -> LogMetadata:
    """The owner starts a new IN_PROGRESS segment on ``ledger_id``; the
    previous one must be completed first."""
    _check_epoch(md, epoch)
    if md.in_progress is not None:
        raise ValueError(f"log {md.name}: segment {md.in_progress.seq} is still in progress")
    if any(s.ledger_id == ledger_id for s in md.segments):
        raise ValueError(f"log {md.name}: ledger {ledger_id} already holds a segment")
    segment = Segment(seq=md.next_seq, ledger_id=ledger_id, epoch=epoch, ctime_ms=ctime_ms)
    return replace(md, segments=md.segments + (segment,), next_seq=md.next_seq + 1)


@dataclass(frozen=True)
class SegmentEnd:
    """What a closed segment holds, read from its last entry's header."""

    records: int = 0
    first_txid: int = NO_TXID
    last_txid: int = NO_TXID
    last_dlsn: DLSN | None = None
    last_entry_id: int = -1


def complete_segment(md: LogMetadata, epoch: int, seq: int, end: SegmentEnd) -> LogMetadata:
    """The owner marks segment ``seq`` (its ledger now closed) COMPLETED with
    what it holds; txids must keep increasing across segments."""
    _check_epoch(md, epoch)
    segment = md.segment(seq)
    if segment is None or segment.state != IN_PROGRESS:
        raise ValueError(f"log {md.name}: segment {seq} is not in progress")
    if end.records and end.first_txid <= md.last_txid:
        raise ValueError(f"log {md.name}: segment {seq} starts at txid {end.first_txid}, not "
                         f"after {md.last_txid}")
    done = replace(segment, state=COMPLETED, records=end.records, first_txid=end.first_txid,
                   last_txid=end.last_txid, last_dlsn=end.last_dlsn,
                   last_entry_id=end.last_entry_id)
    segments = tuple(done if s.seq == seq else s for s in md.segments)
    last_txid = max(md.last_txid, end.last_txid) if end.records else md.last_txid
    return replace(md, segments=segments, last_txid=last_txid)


def truncate(md: LogMetadata, before: DLSN) -> LogMetadata:
    """Drop every whole COMPLETED segment entirely before ``before``; the
    segment holding ``before`` (and the in-progress one) stays.  Moving the
    truncation point backwards is a no-op."""
    doomed = {s.seq for s in md.live_segments
              if s.state == COMPLETED and s.seq < before.seq}
    if not doomed:
        return md
    segments = tuple(replace(s, state=TRUNCATED) if s.seq in doomed else s for s in md.segments)
    kept = [s.seq for s in segments if s.state != TRUNCATED]
    point = DLSN(kept[0] if kept else md.next_seq, 0, 0)
    return replace(md, segments=segments, truncated_before=max(point, md.truncated_before))


def drop_truncated(md: LogMetadata, seqs: set[int]) -> LogMetadata:
    """Forget TRUNCATED segments whose ledgers are deleted."""
    return replace(md, segments=tuple(s for s in md.segments
                                      if not (s.state == TRUNCATED and s.seq in seqs)))


def move_to_cold(md: LogMetadata, seq: int, ledger_id: int, copy: ColdCopy) -> LogMetadata:
    """Segment ``seq`` (COMPLETED, hot, still on ``ledger_id``) is now read
    from ``copy``.  ``ValueError`` if it is not that any more (truncated,
    deleted, moved by another mover): the caller's file is then an orphan."""
    seg = md.segment(seq)
    if seg is None or seg.ledger_id != ledger_id or seg.state != COMPLETED or seg.tier != HOT:
        raise ValueError(f"log {md.name}: segment {seq} (ledger {ledger_id}) is not a sealed "
                         f"hot segment any more")
    moved = replace(seg, tier=COLD, cold=copy)
    return replace(md, segments=tuple(moved if s.seq == seq else s for s in md.segments))


def forget_ledger(md: LogMetadata, seq: int) -> LogMetadata:
    """A cold segment's ledger was deleted (its grace after the move passed)."""
    seg = md.segment(seq)
    if seg is None or seg.tier != COLD or seg.ledger_deleted:
        return md
    gone = replace(seg, ledger_deleted=True)
    return replace(md, segments=tuple(gone if s.seq == seq else s for s in md.segments))


# -- rollover ------------------------------------------------------------------------
@dataclass(frozen=True)
class RolloverPolicy:
    """A segment is completed and a new one started once it holds
    ``bytes_max`` payload bytes or ``records_max`` records, or is
    ``age_ms`` old (0 = no limit of that kind)."""

    bytes_max: int = 256 << 20
    records_max: int = 0
    age_ms: int = 0

    def due(self, payload_bytes: int, records: int, age_ms: int) -> bool:
        return bool((self.bytes_max and payload_bytes >= self.bytes_max)
                    or (self.records_max and records >= self.records_max)
                    or (self.age_ms and records and age_ms >= self.age_ms))
