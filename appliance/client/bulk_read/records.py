"""The pure half of bulk reads: decoding READ_PACKED / READ_BATCH replies and
verifying the entry records they carry.  No sockets, no clocks.

Guarantees: ``parse_reply`` raises only ``BadRequestError`` (or its subclass
``ProtocolVersionError``) for malformed input of any kind; ``verify_packed``
returns only a prefix of records that passed every check (digest over header
and payload, ledger and entry ids, LAC below the entry id, running length
consistent with the record before), so no byte of a bad record is ever handed
out.  Both are vectorised with numpy over a whole reply; the record checks
are ``appliance.checks.record_check``'s, shared with the client's catch-up reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from appliance.checks.record_check import check_records
from appliance.errors import OK, BadRequestError, ProtocolVersionError
from appliance.protocol.entry import HEADER_BYTES
from ipc.frames import REPLY_HEAD, U32, VERSION, Op
from ipc.packed import READ_PACKED_ROW

_ROW_DTYPE = np.dtype([("entry", ">i8"), ("status", ">i4")])


@dataclass(frozen=True, slots=True)
class VerifiedChunk:
    """Consecutive verified entries of one ledger.  Payload ``i`` (entry
    ``first_entry_id + i``) is ``payloads[offsets[i]:offsets[i + 1]]``."""

    ledger_id: int
    first_entry_id: int
    payloads: bytes
    offsets: np.ndarray  # int64, count + 1 values, offsets[0] == 0

    @property
    def count(self) -> int:
        return len(self.offsets) - 1

    @property
    def last_entry_id(self) -> int:
        return self.first_entry_id + self.count - 1


# -- verification (pure) ---------------------------------------------------------------
def verify_records(records: list, ledger_id: int, first_entry_id: int,
                   digest) -> tuple[VerifiedChunk | None, str | None]:
    """``verify_packed`` of separate records (one per READ_BATCH frame)."""
    lengths = np.fromiter(map(len, records), np.int64, len(records))
    return verify_packed(b"".join(records), lengths, ledger_id, first_entry_id, digest)


def verify_packed(data, lengths: np.ndarray, ledger_id: int, first_entry_id: int,
                  digest) -> tuple[VerifiedChunk | None, str | None]:
    """Check stored entry records (header, digest, payload) lying back to
    back in ``data``, ``lengths[i]`` bytes each, that should be entries
    ``first_entry_id..`` of ``ledger_id`` (``appliance.checks.record_check``, strict:
    also LAC below the entry and a consistent running length).

    Returns the longest verified prefix (None if empty) and, if a record
    failed, why.  The payloads are joined once; offsets come from numpy."""
    check = check_records(data, lengths, ledger_id, first_entry_id, digest, strict=True)
    if check.good == 0:
        return None, check.why
    sizes = np.asarray(lengths[:check.good], np.int64) - (HEADER_BYTES + digest.size)
    offsets = np.zeros(check.good + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])
    payloads = check.payload_bytes()
    return VerifiedChunk(ledger_id, first_entry_id, payloads, offsets), check.why


def _prefix_len(ok: np.ndarray) -> int:
    """Length of the all-True prefix of a boolean array."""
    return len(ok) if ok.all() else int(np.argmin(ok))


# -- reply decoding (pure) -----------------------------------------------------------------
@dataclass(slots=True)
class ParsedReply:
    request_id: int
    status: int  # OK, or the error of the whole reply
    first_entry_id: int = -1
    data: bytes = b""  # the OK rows' entry bytes, back to back
    lengths: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    stop_status: int = OK  # the status of the row that ended the batch early


def parse_reply(frames: list, entry_bytes_max: int) -> ParsedReply:
    """Decode a READ_PACKED or READ_BATCH reply (a DEALER's frames), or an
    error reply.  Raises ``BadRequestError`` for anything malformed,
    ``ProtocolVersionError`` for another wire version."""
    head = frames[0] if frames else b""
    if len(head) < REPLY_HEAD.size:
        raise BadRequestError(f"reply header of {len(head)} bytes")
    version, op, _, rid, _, first, status = REPLY_HEAD.unpack_from(head)
    if version != VERSION:
        raise ProtocolVersionError(f"reply of wire version {version}, expected {VERSION}")
    if status != OK:
        if len(frames) > 2:
            raise BadRequestError(f"error reply of {len(frames)} frames")
        return ParsedReply(rid, status)
    if op not in (Op.READ_PACKED, Op.READ_BATCH) or len(head) != REPLY_HEAD.size + U32.size:
        raise BadRequestError(f"expected a READ_PACKED or READ_BATCH reply, got op {op}")
    (count,) = U32.unpack_from(head, REPLY_HEAD.size)
    packed = op == Op.READ_PACKED
    dtype = READ_PACKED_ROW if packed else _ROW_DTYPE
    if count < 1 or len(frames) != (3 if packed else count + 2) or \
            len(frames[1]) != count * dtype.itemsize:
        raise BadRequestError(f"reply of {count} rows in {len(frames)} frames")
    rows = np.frombuffer(frames[1], dtype)
    n_ok = _prefix_len(rows["status"] == OK)
    if n_ok < count - 1 or rows["entry"][0] != first or \
            not np.array_equal(np.diff(rows["entry"]), np.ones(count - 1, np.int64)):
        raise BadRequestError("reply rows are not consecutive OK rows ending in one error")
    if packed:
        data, lengths = frames[2], rows["length"].astype(np.int64)
    else:
        data = b"".join(frames[2:2 + n_ok])
        lengths = np.fromiter(map(len, frames[2:]), np.int64, count)
    if lengths[n_ok:].any() or int(lengths.sum()) != len(data) or \
            (n_ok and int(lengths.max()) > entry_bytes_max):
        raise BadRequestError("reply data disagrees with its table, an error row has data, or "
                              "an entry is over entry_bytes_max")
    stop = int(rows["status"][n_ok]) if n_ok < count else OK
    return ParsedReply(rid, OK, first, data, lengths[:n_ok], stop)
