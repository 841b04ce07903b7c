"""Wire constants, fixed header layouts and limits (version 1).

Everything here is a pure function of bytes: no sockets, no clocks.  The
layouts are documented frame by frame in ``ipc/PROTOCOL.md``; this module is
the one place they are defined, so a change here is a protocol change.

Guarantees:

* every header is fixed-size, network byte order, and starts with the
  protocol version byte, so a peer can refuse an unknown version before it
  reads anything else;
* ``read_head`` never raises anything but ``BadRequestError`` /
  ``ProtocolVersionError`` on short, garbage or unknown-version input;
* ``salvage_ids`` recovers what it can (op, request id) from garbage so that
  an error reply can still be matched by the sender.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

from appliance.protocol import limits
from appliance.protocol.entry import ENTRY_OVERHEAD_MAX
from appliance.protocol.errors import BadRequestError, ProtocolVersionError

VERSION = 1
MiB = 1024 * 1024


class Op(IntEnum):
    """Operation codes.  ERROR appears only in replies to unreadable requests."""

    ERROR = 0
    PING = 1
    INFO = 2
    ADD = 3
    READ = 4
    READ_LAC = 5
    WAIT_LAC = 6
    ADD_BATCH = 7
    READ_BATCH = 8
    ADD_PACKED = 9  # ADD_BATCH of one ledger, entries in one data frame (ipc/packed.py)
    READ_PACKED = 10  # READ_BATCH whose reply carries the entries in one data frame
    WRITE_LAC = 11  # the writer's LAC, for readers of an idle ledger (explicit LAC)
    WRITE_CLOSE = 12  # BP-32 advisory: the writer is done with the ledger
    COMPACT = 13  # admin: start a compaction of the bookie's entry logs (bkctl bookie compact)
    ADD_MULTI = 14  # ADD_PACKED of several ledgers: their entries in one data frame
    WRITE_LAC_MULTI = 15  # WRITE_LAC of several ledgers (idle writers of many ledgers)


OPS = frozenset(int(op) for op in Op if op is not Op.ERROR)

# Request flags (u16).  Each op accepts only the bits listed in ALLOWED_FLAGS.
FLAG_RECOVERY = 0x0001  # ADD / ADD_BATCH: a recovery add, accepted by a fenced ledger
FLAG_FENCE = 0x0002  # READ / READ_LAC / READ_BATCH: fence the ledger before reading
FLAG_MAJOR = 0x0004  # COMPACT: major compaction (its higher threshold)
# every read op: the 32-byte master key follows the op's extension (FENCE implies it too)
FLAG_KEY = 0x0008
FLAG_SUSPEND = 0x0010  # COMPACT: suspend automatic compaction instead of running one
FLAG_RESUME = 0x0020  # COMPACT: resume automatic compaction instead of running one
READ_KEY_FLAGS = FLAG_FENCE | FLAG_KEY  # either bit: a master key follows
FLAG_GC = 0x0100  # COMPACT: a garbage-collection pass instead (bkctl bookie gc)

ALLOWED_FLAGS = {
    Op.PING: 0,
    Op.INFO: 0,
    Op.ADD: FLAG_RECOVERY,
    Op.READ: FLAG_FENCE | FLAG_KEY,
    Op.READ_LAC: FLAG_FENCE | FLAG_KEY,
    Op.WAIT_LAC: FLAG_KEY,
    Op.ADD_BATCH: FLAG_RECOVERY,
    Op.READ_BATCH: FLAG_FENCE | FLAG_KEY,
    Op.ADD_PACKED: FLAG_RECOVERY,
    Op.ADD_MULTI: FLAG_RECOVERY,
    Op.READ_PACKED: FLAG_FENCE | FLAG_KEY,
    Op.WRITE_LAC: 0,
    Op.WRITE_LAC_MULTI: 0,
    Op.WRITE_CLOSE: 0,
    Op.COMPACT: FLAG_MAJOR | FLAG_GC | FLAG_SUSPEND | FLAG_RESUME,
}

MASTER_KEY_BYTES = 32
# u64 on the wire, but kept < 2**63 so signed peers agree (the value: limits)
LEDGER_ID_MAX = limits.LEDGER_ID_MAX
ENTRY_ID_MAX = limits.ENTRY_ID_MAX

# version u8, op u8, flags u16, request id u64, ledger id u64, entry id i64
REQUEST_HEAD = struct.Struct("!BBHQQq")  # 28 bytes
# ... the same, then status i32 (0 = OK, else an appliance.protocol.errors code)
REPLY_HEAD = struct.Struct("!BBHQQqi")  # 32 bytes

MASTER_KEY = struct.Struct("!32s")
U32 = struct.Struct("!I")  # WAIT_LAC timeout_ms; batch counts
I64 = struct.Struct("!q")  # LAC in READ_LAC / WAIT_LAC replies
READ_BATCH_EXT = struct.Struct("!qII")  # last entry id, max entries, max bytes

ADD_ROW = struct.Struct("!Qq32s")  # ADD_BATCH request table: ledger, entry, master key
ADD_STATUS_ROW = struct.Struct("!Qqi")  # ADD_BATCH reply table: ledger, entry, status
READ_STATUS_ROW = struct.Struct("!qi")  # READ_BATCH reply table: entry, status
LAC_ROW = struct.Struct("!Qq32s")  # WRITE_LAC_MULTI request table: ledger, LAC, master key
LAC_STATUS_ROW = struct.Struct("!Qqi")  # WRITE_LAC_MULTI reply table: ledger, LAC held, status


@dataclass(frozen=True)
class WireLimits:
    """Bounds every decoder enforces; a violation is a ``BadRequestError``.
    The defaults are ``appliance.protocol.limits`` (``SERVER_BATCH_*``).

    entry_bytes_max: largest entry (client-built bytes: payload, header and
        digest) in any op: the payload limit plus ``ENTRY_OVERHEAD_MAX``;
        bigger entries cost memory on every hop and delay everything queued
        behind.
    batch_entries_max: most entries in one ADD_BATCH / READ_BATCH /
        ADD_PACKED / READ_PACKED message (and so the most frames: this + 2);
        more amortises per-message Python cost, fewer bounds the latency of
        one message.
    batch_bytes_max: most entry bytes in one batch message (a packed data
        frame holds up to this); bounds memory per message.
    text_bytes_max: most bytes of an error message or INFO JSON frame.
    """

    entry_bytes_max: int = limits.STORAGE_ENTRY_BYTES_MAX + ENTRY_OVERHEAD_MAX
    batch_entries_max: int = limits.SERVER_BATCH_ENTRIES_MAX
    batch_bytes_max: int = limits.SERVER_BATCH_BYTES_MAX
    text_bytes_max: int = limits.WIRE_TEXT_BYTES_MAX

    def __post_init__(self) -> None:
        for name in ("entry_bytes_max", "batch_entries_max", "batch_bytes_max",
                     "text_bytes_max"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")

    @property
    def frames_max(self) -> int:
        """Most frames a well-formed message can have (READ_BATCH reply)."""
        return self.batch_entries_max + 2

    @property
    def frame_bytes_max(self) -> int:
        """Largest single frame a well-formed message can hold (for ZMQ_MAXMSGSIZE)."""
        return max(self.entry_bytes_max, self.batch_bytes_max,
                   self.batch_entries_max * ADD_ROW.size, self.text_bytes_max, 4096)


DEFAULT_LIMITS = WireLimits()


def read_head(frame, head: struct.Struct) -> tuple:
    """Unpack a fixed header from the start of ``frame`` (any buffer).

    Raises ``ProtocolVersionError`` for another version and
    ``BadRequestError`` for a short frame or an unknown op.
    """
    size = len(frame)
    if size == 0:
        raise BadRequestError("empty header frame")
    version = frame[0]
    if version != VERSION:
        raise ProtocolVersionError(f"wire version {version} not supported (this side speaks "
                                   f"{VERSION})")
    if size < head.size:
        raise BadRequestError(f"header frame is {size} bytes, needs at least {head.size}")
    fields = head.unpack_from(frame)
    if fields[1] not in OPS:
        raise BadRequestError(f"unknown op {fields[1]}")
    return fields


def check_flags(op: int, flags: int) -> None:
    extra = flags & ~ALLOWED_FLAGS[op]
    if extra:
        raise BadRequestError(f"flags {extra:#06x} are not defined for {Op(op).name}")


def check_size(frame, expected: int, what: str) -> None:
    if len(frame) != expected:
        raise BadRequestError(f"{what} is {len(frame)} bytes, expected {expected}")


def check_frame_count(frames, expected: int, op: int) -> None:
    if len(frames) != expected:
        raise BadRequestError(f"{Op(op).name} message has {len(frames)} frames, "
                              f"expected {expected}")


def check_entry_bytes(size: int, wire: WireLimits) -> None:
    if size > wire.entry_bytes_max:
        raise BadRequestError(f"entry of {size} bytes exceeds entry_bytes_max "
                              f"({wire.entry_bytes_max})")


def check_ids(ledger_id: int, entry_id: int, entry_min: int) -> None:
    if ledger_id > LEDGER_ID_MAX:
        raise BadRequestError(f"ledger id {ledger_id} exceeds {LEDGER_ID_MAX}")
    if entry_id < entry_min:
        raise BadRequestError(f"entry id {entry_id} is below {entry_min}")


def read_key_part(fence: bool, master_key) -> tuple[int, bytes]:
    """Encoder side of a read op's key: (flags, bytes after the extension).
    A fencing read needs the key (FENCE); any other read sends it when given
    (KEY).  ``ValueError`` for a key that is not 32 bytes."""
    if master_key is None:
        if fence:
            raise ValueError(f"master_key must be {MASTER_KEY_BYTES} bytes (a fencing read)")
        return 0, b""
    if not isinstance(master_key, bytes | bytearray) or len(master_key) != MASTER_KEY_BYTES:
        raise ValueError(f"master_key must be {MASTER_KEY_BYTES} bytes")
    return (FLAG_FENCE if fence else FLAG_KEY), bytes(master_key)


def read_key(head, flags: int, ext_end: int) -> bytes | None:
    """Decoder side: the key after a read op's extension (None: no key flag);
    the header must be exactly that long (``BadRequestError`` otherwise)."""
    if not flags & READ_KEY_FLAGS:
        check_size(head, ext_end, "header")
        return None
    check_size(head, ext_end + MASTER_KEY_BYTES, "header with master key")
    return MASTER_KEY.unpack_from(head, ext_end)[0]


def salvage_ids(frame) -> tuple[int, int]:
    """(op, request id) from a header that failed to decode, best effort.

    The op is echoed only when it is a known op (else ``Op.ERROR``); the
    request id only when the frame holds its 8 bytes (else 0).
    """
    try:
        mv = memoryview(frame).cast("B")
    except TypeError:
        return Op.ERROR, 0
    op = mv[1] if len(mv) > 1 and mv[1] in OPS else Op.ERROR
    request_id = struct.unpack_from("!Q", mv, 4)[0] if len(mv) >= 12 else 0
    return int(op), request_id
