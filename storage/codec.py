"""On-disk record formats shared by the journal and the entry logs.

Guarantees: every byte a reader acts on is covered by a CRC32C, and a record
is individually verifiable.  A torn write, a flipped bit or a misdirected read
is reported as ``CorruptRecordError`` (or as the end of a log when scanning),
never returned as entry bytes.

Entry block (the unit of an add batch; the same bytes are the body of a
journal ADD record and a block in an entry log), little-endian::

    block header, 32 bytes
      u32 magic 'BKEB'   u32 hdr_crc (crc32c of bytes 8..32)
      u32 block_len (header included)   u32 count
      u32 table_crc (crc32c of the count record headers, concatenated)
      u32 flags (0)      u64 seq (the storage operation sequence number)
    count records, each
      24-byte record header: u64 ledger  u64 entry  u32 length  u32 data_crc
      length bytes of entry data (data_crc = crc32c(data))

A read of one entry reads one record header + data with one ``pread`` and
checks ledger, entry and length against the index and ``data_crc`` against
the data.  A scan checks hdr_crc, table_crc and every data_crc.

Hot path: building a block is per batch: one numpy array of record headers,
one ``crc32c`` call per entry (hardware CRC, ~0.2 us for 1 KiB), one over the
header table and one ``b"".join``.
"""

from __future__ import annotations

import struct

import crc32c
import numpy as np

from appliance.protocol.errors import CorruptRecordError

BLOCK_MAGIC = 0x4245_4B42  # b"BKEB" little-endian
BLOCK_HEADER = struct.Struct("<IIIIIIQ")  # magic hdr_crc len count table_crc flags seq
BLOCK_HEADER_BYTES = BLOCK_HEADER.size  # 32
RECORD_HEADER = struct.Struct("<QQII")  # ledger entry length data_crc
RECORD_HEADER_BYTES = RECORD_HEADER.size  # 24
RECORD_DTYPE = np.dtype([("ledger", "<u8"), ("entry", "<u8"), ("length", "<u4"), ("crc", "<u4")])
assert RECORD_DTYPE.itemsize == RECORD_HEADER_BYTES

crc = crc32c.crc32c
SMALL_BLOCK_RECORDS = 32  # up to this many records a block is built with struct, not numpy


def block_bytes_for(lengths_total: int, count: int) -> int:
    return BLOCK_HEADER_BYTES + count * RECORD_HEADER_BYTES + lengths_total


def build_block(seq: int, ledgers: np.ndarray, entries: np.ndarray, datas: list,
                lengths: np.ndarray) -> tuple[bytes, np.ndarray]:
    """Encode one add batch.  Returns the block and each record's offset in it."""
    count = len(datas)
    if count <= SMALL_BLOCK_RECORDS:
        return _build_small_block(seq, ledgers, entries, datas, lengths)
    table = np.empty(count, RECORD_DTYPE)
    table["ledger"] = ledgers
    table["entry"] = entries
    table["length"] = lengths
    table["crc"] = list(map(crc, datas))
    table_bytes = table.tobytes()
    sizes = lengths.astype(np.int64) + RECORD_HEADER_BYTES
    offsets = np.cumsum(sizes) - sizes + BLOCK_HEADER_BYTES
    block_len = BLOCK_HEADER_BYTES + int(sizes.sum())
    parts = [b""] * (2 * count + 1)
    parts[0] = _block_header(block_len, count, crc(table_bytes), seq)
    step = RECORD_HEADER_BYTES
    parts[1::2] = [table_bytes[i:i + step] for i in range(0, count * step, step)]
    parts[2::2] = datas
    return b"".join(parts), offsets


def _build_small_block(seq: int, ledgers, entries, datas: list,
                       lengths) -> tuple[bytes, np.ndarray]:
    """``build_block`` for a few records: the same bytes, built with struct
    (numpy's per-call cost dominates a batch of one or two entries)."""
    lens = lengths.tolist()
    headers = list(map(RECORD_HEADER.pack, ledgers.tolist(), entries.tolist(), lens,
                       map(crc, datas)))
    offsets, pos = [], BLOCK_HEADER_BYTES
    for length in lens:
        offsets.append(pos)
        pos += RECORD_HEADER_BYTES + length
    parts = [_block_header(pos, len(lens), crc(b"".join(headers)), seq)]
    for header, data in zip(headers, datas, strict=True):
        parts += (header, data)
    return b"".join(parts), np.array(offsets, np.int64)


def build_ledger_block(seq: int, ledger_id: int, entry_ids: list, datas: list,
                       lengths: list) -> tuple[bytes, list[int]]:
    """``build_block`` of a few records of one ledger, from plain lists: the
    same bytes; offsets as a list (the small-add path, no numpy at all)."""
    pack = RECORD_HEADER.pack
    headers = [pack(ledger_id, e, n, crc(d))
               for e, n, d in zip(entry_ids, lengths, datas, strict=True)]
    offsets, pos = [], BLOCK_HEADER_BYTES
    parts = [b""]
    for header, data, length in zip(headers, datas, lengths, strict=True):
        offsets.append(pos)
        pos += RECORD_HEADER_BYTES + length
        parts += (header, data)
    parts[0] = _block_header(pos, len(headers), crc(b"".join(headers)), seq)
    return b"".join(parts), offsets


def _block_header(block_len: int, count: int, table_crc: int, seq: int) -> bytes:
    tail = BLOCK_HEADER.pack(0, 0, block_len, count, table_crc, 0, seq)[8:]
    return struct.pack("<II", BLOCK_MAGIC, crc(tail)) + tail


class BlockInfo:
    """A verified block: its seq and its records (arrays, offsets in the block)."""

    __slots__ = ("seq", "block_len", "ledgers", "entries", "lengths", "offsets", "crcs")

    def __init__(self, seq, block_len, ledgers, entries, lengths, offsets, crcs):
        self.seq, self.block_len = seq, block_len
        self.ledgers, self.entries, self.lengths = ledgers, entries, lengths
        self.offsets, self.crcs = offsets, crcs


def parse_block_header(buf, pos: int) -> tuple[int, int, int, int] | None:
    """(block_len, count, table_crc, seq) if a valid block header is at pos."""
    if pos + BLOCK_HEADER_BYTES > len(buf):
        return None
    magic, hdr_crc, block_len, count, table_crc, _flags, seq = BLOCK_HEADER.unpack_from(buf, pos)
    if magic != BLOCK_MAGIC or hdr_crc != crc(buf[pos + 8:pos + BLOCK_HEADER_BYTES]):
        return None
    if block_len < BLOCK_HEADER_BYTES + count * RECORD_HEADER_BYTES:
        return None
    return block_len, count, table_crc, seq


_LENGTH_AT = struct.Struct("<I").unpack_from  # a record header's length field (offset 16)


def parse_block(buf, pos: int, verify_data: bool = True) -> BlockInfo | None:
    """Verify and decode the block at ``pos``; None if anything fails."""
    head = parse_block_header(buf, pos)
    if head is None or pos + head[0] > len(buf):
        return None
    block_len, count, table_crc, seq = head
    headers = []
    append = headers.append
    off, end = pos + BLOCK_HEADER_BYTES, pos + block_len
    for _ in range(count):  # sequential: each header gives the next one's offset
        if off + RECORD_HEADER_BYTES > end:
            return None
        append(buf[off:off + RECORD_HEADER_BYTES])
        off += RECORD_HEADER_BYTES + _LENGTH_AT(buf, off + 16)[0]
    table_bytes = b"".join(headers)
    if off != end or crc(table_bytes) != table_crc:
        return None
    table = np.frombuffer(table_bytes, RECORD_DTYPE)
    sizes = table["length"].astype(np.int64) + RECORD_HEADER_BYTES
    offsets = np.cumsum(sizes) - sizes + BLOCK_HEADER_BYTES  # record offsets in the block
    if verify_data:
        mv = memoryview(buf)
        starts = (offsets + (pos + RECORD_HEADER_BYTES)).tolist()
        for start, length, data_crc in zip(starts, table["length"].tolist(),
                                           table["crc"].tolist(), strict=True):
            if crc(mv[start:start + length]) != data_crc:
                return None
    return BlockInfo(seq, block_len, table["ledger"].copy(), table["entry"].copy(),
                     table["length"].copy(), offsets, table["crc"].copy())


def verify_record(raw, ledger_id: int, entry_id: int, length: int, where: str) -> memoryview:
    """Check one record read by ``pread`` (header + data); return the data."""
    if len(raw) != RECORD_HEADER_BYTES + length:
        raise CorruptRecordError(f"{where}: short read ({len(raw)} of "
                                 f"{RECORD_HEADER_BYTES + length} bytes) for "
                                 f"ledger {ledger_id} entry {entry_id}")
    led, ent, ln, data_crc = RECORD_HEADER.unpack_from(raw, 0)
    data = memoryview(raw)[RECORD_HEADER_BYTES:]
    if (led, ent, ln) != (ledger_id, entry_id, length):
        raise CorruptRecordError(f"{where}: record header says ledger {led} entry {ent} "
                                 f"length {ln}, expected ledger {ledger_id} entry {entry_id} "
                                 f"length {length}")
    if crc(data) != data_crc:
        raise CorruptRecordError(f"{where}: checksum mismatch for ledger {ledger_id} "
                                 f"entry {entry_id}")
    return data


# -- small checksummed headers (segment/log file headers, markers) -------------

FILE_HEADER = struct.Struct("<8sIIQQ16s")  # magic version crc id aux instance


def pack_file_header(magic: bytes, file_id: int, aux: int, instance: bytes) -> bytes:
    body = FILE_HEADER.pack(magic, 1, 0, file_id, aux, instance)
    value = crc(body[:12] + body[16:])
    return body[:12] + struct.pack("<I", value) + body[16:]


def unpack_file_header(buf, magic: bytes) -> tuple[int, int, bytes] | None:
    """(file_id, aux, instance) if ``buf`` starts with a valid header."""
    if len(buf) < FILE_HEADER.size:
        return None
    got_magic, version, value, file_id, aux, instance = FILE_HEADER.unpack_from(buf, 0)
    raw = bytes(buf[:FILE_HEADER.size])
    if got_magic != magic or version != 1 or crc(raw[:12] + raw[16:]) != value:
        return None
    return file_id, aux, instance
