"""How a log's records travel in one ledger entry (pure).

A log writer batches records into entries: an entry holds ``count`` records
(slots ``0 .. count - 1``), or none when it is a *control* entry (written by
an idle writer only to move the ledger's LAC, so readers see its last
records; never delivered).  Every entry's header also carries the segment's
running totals, so the segment's end is known from its last entry alone
(what a new writer needs after recovering a crashed writer's segment).

Layout (big-endian)::

    header  version u8 = 1 | flags u8 (bit 0: control) | count u32 |
            records u64 (data records in the segment up to and including
            this entry) | first_txid i64 (the segment's first; NO_TXID if
            none yet) | last_txid i64 (the segment's last so far) |
            last_entry i64, last_slot u32 (the segment's last data record so
            far; -1 / 0 if none)
    record  txid i64 | length u32 | payload            (count times)

The ledger entry around it is checksummed (digest) by the ledger layer; a
header or record that does not fit the entry is ``CorruptRecordError``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from appliance.protocol.errors import CorruptRecordError

ENTRY_VERSION = 1
FLAG_CONTROL = 0x01
HEADER = struct.Struct("!BBIqqqqI")
RECORD = struct.Struct("!qI")
HEADER_BYTES = HEADER.size
RECORD_OVERHEAD = RECORD.size


@dataclass(frozen=True)
class EntryHeader:
    control: bool
    count: int
    records: int  # running total in the segment, this entry included
    first_txid: int
    last_txid: int
    last_entry: int  # the segment's last data record so far: entry id (-1: none) ...
    last_slot: int  # ... and slot


def pack_entry(header: EntryHeader, txids, payloads) -> bytes:
    """One entry: the header, then each (txid, payload) in order."""
    head = HEADER.pack(ENTRY_VERSION, FLAG_CONTROL if header.control else 0, header.count,
                       header.records, header.first_txid, header.last_txid, header.last_entry,
                       header.last_slot)
    if header.count != len(payloads) or (header.control and header.count):
        raise ValueError("count must match the records; a control entry holds none")
    pack = RECORD.pack
    parts = [head]
    for txid, payload in zip(txids, payloads, strict=True):
        parts.append(pack(txid, len(payload)))
        parts.append(payload)
    return b"".join(parts)


def read_header(data) -> EntryHeader:
    if len(data) < HEADER_BYTES:
        raise CorruptRecordError(f"log entry of {len(data)} bytes is shorter than its header")
    version, flags, count, records, first, last, last_entry, last_slot = \
        HEADER.unpack_from(data)
    if version != ENTRY_VERSION:
        raise CorruptRecordError(f"log entry version {version} is not {ENTRY_VERSION}")
    return EntryHeader(bool(flags & FLAG_CONTROL), count, records, first, last, last_entry,
                       last_slot)


def unpack_entry(data) -> tuple[EntryHeader, list[int], list[bytes]]:
    """The header, the txids and the payloads of one entry."""
    header = read_header(data)
    view = memoryview(data)
    txids: list[int] = []
    payloads: list[bytes] = []
    offset, end = HEADER_BYTES, len(data)
    unpack = RECORD.unpack_from
    for _ in range(header.count):
        if offset + RECORD_OVERHEAD > end:
            raise CorruptRecordError(f"log entry cut inside record {len(txids)}")
        txid, length = unpack(view, offset)
        offset += RECORD_OVERHEAD
        if offset + length > end:
            raise CorruptRecordError(f"log entry cut inside record {len(txids)}'s payload")
        txids.append(txid)
        payloads.append(bytes(view[offset:offset + length]))
        offset += length
    if offset != end:
        raise CorruptRecordError(f"log entry has {end - offset} bytes after its "
                                 f"{header.count} records")
    return header, txids, payloads
