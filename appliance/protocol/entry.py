"""The stored entry format: what a writer sends, a bookie stores and a reader
verifies.  Pure: the digest is an injected object (``appliance.checks.digest``).

Layout (big-endian)::

    ledger_id  u64   the ledger
    entry_id   i64   the entry's position (>= 0)
    lac        i64   the writer's last-add-confirmed when it made this entry
    length     u64   running ledger length: payload bytes of entries 0..entry_id
    digest     4 bytes (crc32c) or 32 bytes (hmac-sha256), over header + payload
    payload    the user's bytes

Guarantees: ``verify_and_payload`` returns the payload only when the digest
over header and payload matches, so a flipped bit anywhere (header included),
a truncated entry or an entry of another ledger/password is refused with
``DigestMismatchError`` and never handed to a user.  Nothing here copies the
payload except ``pack_entry`` (once, to build the record).

A digest object has ``name`` (str), ``size`` (bytes) and
``compute(header, payload) -> bytes``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence

from appliance.protocol.errors import BadRequestError, DigestMismatchError

HEADER = struct.Struct(">QqqQ")
HEADER_BYTES = HEADER.size  # 32
DIGEST_BYTES_MAX = 32  # hmac-sha256; crc32c is 4
# A record (what a bookie stores and the wire carries) is the payload plus at
# most this: limits on records are the payload limit
# (limits.STORAGE_ENTRY_BYTES_MAX) plus this, so a payload of exactly the
# limit always fits (CONTRACT: 5 MiB payloads succeed).
ENTRY_OVERHEAD_MAX = HEADER_BYTES + DIGEST_BYTES_MAX
_U64_MAX = (1 << 64) - 1


def pack_entry(ledger_id: int, entry_id: int, lac: int, length: int,
               payload: bytes, digest) -> bytes:
    """One stored entry: header, digest over header + payload, payload."""
    if entry_id < 0:
        raise ValueError(f"entry_id must be >= 0, got {entry_id}")
    if lac < -1 or lac >= entry_id:
        raise ValueError(f"lac must be in [-1, entry_id), got {lac} for entry {entry_id}")
    if not 0 <= ledger_id <= _U64_MAX or not 0 <= length <= _U64_MAX:
        raise ValueError("ledger_id and length must fit in 64 bits")
    header = HEADER.pack(ledger_id, entry_id, lac, length)
    return b"".join((header, digest.compute(header, payload), payload))


def pack_entries(ledger_id: int, first_entry_id: int, lac: int, length_before: int,
                 payloads: Sequence[bytes], digest) -> tuple[list[bytes], int]:
    """Pack consecutive entries from ``first_entry_id`` (the batch path of a
    writer).  Returns the records and the running length after the last."""
    records = []
    length = length_before
    pack = HEADER.pack
    compute = digest.compute
    for offset, payload in enumerate(payloads):
        length += len(payload)
        header = pack(ledger_id, first_entry_id + offset, lac, length)
        records.append(b"".join((header, compute(header, payload), payload)))
    return records, length


def unpack_header(data) -> tuple[int, int, int, int]:
    """``(ledger_id, entry_id, lac, length)``; ``BadRequestError`` if short."""
    if len(data) < HEADER_BYTES:
        raise BadRequestError(f"entry of {len(data)} bytes is shorter than its "
                              f"{HEADER_BYTES}-byte header")
    return HEADER.unpack_from(data, 0)


def verify_and_payload(data, digest) -> memoryview:
    """The payload of a stored entry, after checking its digest."""
    view = memoryview(data)
    start = HEADER_BYTES + digest.size
    if len(view) < start:
        raise DigestMismatchError(f"entry of {len(view)} bytes is shorter than header "
                                  f"and {digest.name} digest ({start} bytes)")
    header = view[:HEADER_BYTES]
    payload = view[start:]
    if digest.compute(header, payload) != view[HEADER_BYTES:start]:
        ledger_id, entry_id, _, _ = HEADER.unpack_from(view, 0)
        raise DigestMismatchError(f"digest mismatch for ledger {ledger_id} entry {entry_id} "
                                  f"({digest.name})")
    return payload


def verify_entry(data, digest, ledger_id: int, entry_id: int) -> tuple[int, int, memoryview]:
    """Check digest *and* that the record is the one asked for.

    Returns ``(lac, length, payload)``.  A record of another ledger or entry
    (a misdirected or misfiled reply) is a ``DigestMismatchError`` too: the
    reader must fail over rather than serve it."""
    payload = verify_and_payload(data, digest)
    got_ledger, got_entry, lac, length = HEADER.unpack_from(data, 0)
    if got_ledger != ledger_id or got_entry != entry_id:
        raise DigestMismatchError(f"asked for ledger {ledger_id} entry {entry_id}, "
                                  f"got ledger {got_ledger} entry {got_entry}")
    return lac, length, payload


def verify_run(records: Sequence, digest, ledger_id: int,
               first_entry_id: int) -> tuple[list[memoryview], int]:
    """The batch form of ``verify_entry`` for records of consecutive entries
    ``first_entry_id..``: the payloads of the longest prefix that verifies
    (digest, ledger and entry id each checked exactly as ``verify_entry``
    does) and the highest LAC field among them (-1 if none)."""
    start = HEADER_BYTES + digest.size
    compute, unpack = digest.compute, HEADER.unpack_from
    payloads: list[memoryview] = []
    top_lac, entry_id = -1, first_entry_id
    for record in records:
        view = memoryview(record)
        if len(view) < start:
            break
        payload = view[start:]
        if compute(view[:HEADER_BYTES], payload) != view[HEADER_BYTES:start]:
            break
        got_ledger, got_entry, lac, _ = unpack(view, 0)
        if got_ledger != ledger_id or got_entry != entry_id:
            break
        payloads.append(payload)
        if lac > top_lac:
            top_lac = lac
        entry_id += 1
    return payloads, top_lac


def verify_entries(records: Iterable, digest) -> list[memoryview]:
    """Batch form of ``verify_and_payload`` (raises on the first bad record)."""
    return [verify_and_payload(r, digest) for r in records]
