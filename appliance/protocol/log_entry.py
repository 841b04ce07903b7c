"""How a log's records travel in one ledger entry (pure).

A log writer batches records into entries: an entry holds ``count`` records
(slots ``0 .. count - 1``), or none when it is a *control* entry (written by
an idle writer only to move the ledger's LAC, so readers see its last
records; never delivered).  Every entry's header also carries the segment's
running totals, so the segment's end is known from its last entry alone
(what a new writer needs after recovering a crashed writer's segment).

Layout (big-endian)::

    header   version u8 = 2 | flags u8 (bit 0: control, bit 1: tagged) | count u32 |
             records u64 (data records in the segment up to and including
             this entry) | first_txid i64 (the segment's first; NO_TXID if
             none yet) | last_txid i64 (the segment's last so far) |
             last_entry i64, last_slot u32 (the segment's last data record
             so far; -1 / 0 if none)
    txids    count x i64
    lengths  count x u32
    tags     count x (producer id 16 bytes | sequence number u64): only
             when the tagged flag is set (records written through the log
             service by idempotent producers: the owner that takes the log
             over rebuilds its duplicate filter from them)
    payloads the records' bytes, back to back

The tags column is optional and flagged, so entries written before it
existed read as they did; readers hand out payloads only, tags or not.

Columns rather than one (txid, length, payload) triple per record: packing
and unpacking are a few C calls per entry, not a Python step per record.

The ledger entry around it is checksummed (digest) by the ledger layer; a
header or record that does not fit the entry is ``CorruptRecordError``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from itertools import accumulate

from appliance.protocol.errors import CorruptRecordError

ENTRY_VERSION = 2
FLAG_CONTROL = 0x01
FLAG_TAGGED = 0x02
HEADER = struct.Struct("!BBIqqqqI")
HEADER_BYTES = HEADER.size
RECORD_OVERHEAD = 12  # a txid and a length per record
PRODUCER_ID_BYTES = 16
TAG = struct.Struct("!16sQ")
TAG_BYTES = TAG.size  # per record of a tagged entry, on top of RECORD_OVERHEAD


@dataclass(frozen=True)
class EntryHeader:
    control: bool
    count: int
    records: int  # running total in the segment, this entry included
    first_txid: int
    last_txid: int
    last_entry: int  # the segment's last data record so far: entry id (-1: none) ...
    last_slot: int  # ... and slot


def pack_entry(header: EntryHeader, txids, payloads, tags=None) -> bytes:
    """One entry: the header, then the records' txids, lengths (tags) and
    bytes.  ``tags``: None, or one ``(producer_id, seq)`` per record."""
    count = len(payloads)
    if header.count != count or len(txids) != count or (header.control and count):
        raise ValueError("count must match the records; a control entry holds none")
    flags = FLAG_CONTROL if header.control else 0
    tag_column = b""
    if tags is not None:
        if len(tags) != count:
            raise ValueError(f"{len(tags)} tags for {count} records")
        flags |= FLAG_TAGGED
        tag_column = b"".join([TAG.pack(pid, seq) for pid, seq in tags])
    head = HEADER.pack(ENTRY_VERSION, flags, count,
                       header.records, header.first_txid, header.last_txid, header.last_entry,
                       header.last_slot)
    return b"".join((head, struct.pack(f"!{count}q", *txids),
                     struct.pack(f"!{count}I", *map(len, payloads)), tag_column, *payloads))


def read_header(data) -> EntryHeader:
    if len(data) < HEADER_BYTES:
        raise CorruptRecordError(f"log entry of {len(data)} bytes is shorter than its header")
    version, flags, count, records, first, last, last_entry, last_slot = \
        HEADER.unpack_from(data)
    if version != ENTRY_VERSION:
        raise CorruptRecordError(f"log entry version {version} is not {ENTRY_VERSION}")
    return EntryHeader(bool(flags & FLAG_CONTROL), count, records, first, last, last_entry,
                       last_slot)


def _tagged(data) -> bool:
    return bool(data[1] & FLAG_TAGGED)


def unpack_entry(data) -> tuple[EntryHeader, list[int], list[bytes]]:
    """The header, the txids and the payloads of one entry (tags skipped)."""
    header = read_header(data)
    count = header.count
    columns = HEADER_BYTES + count * (RECORD_OVERHEAD + (TAG_BYTES if _tagged(data) else 0))
    if columns > len(data):
        raise CorruptRecordError(f"log entry of {len(data)} bytes cannot hold {count} records")
    txids = list(struct.unpack_from(f"!{count}q", data, HEADER_BYTES))
    lengths = struct.unpack_from(f"!{count}I", data, HEADER_BYTES + 8 * count)
    ends = list(accumulate(lengths, initial=columns))
    if ends[-1] != len(data):
        raise CorruptRecordError(f"log entry of {len(data)} bytes: its {count} records need "
                                 f"{ends[-1]}")
    if not isinstance(data, bytes):
        data = bytes(data)
    return header, txids, [data[a:b] for a, b in zip(ends, ends[1:], strict=False)]


def unpack_tags(data) -> list[tuple[bytes, int]] | None:
    """The ``(producer_id, seq)`` of each record of a tagged entry; None for
    an entry without tags (an exclusive writer's, or a control entry)."""
    header = read_header(data)
    if not _tagged(data):
        return None
    count = header.count
    start = HEADER_BYTES + count * RECORD_OVERHEAD
    if start + count * TAG_BYTES > len(data):
        raise CorruptRecordError(f"log entry of {len(data)} bytes cannot hold {count} tags")
    return list(TAG.iter_unpack(bytes(data[start:start + count * TAG_BYTES])))
