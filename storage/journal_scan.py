"""Journal replay: read segments from a checkpoint mark, verify every record,
cut a torn tail, refuse a journal that is garbage or lost acknowledged data.

Journal record (little-endian), 32-byte header then body::

    u32 magic 'BKJR'  u32 hdr_crc (crc32c of header bytes 8..32)
    u16 type  u16 flags  u32 body_len  u32 body_crc  u32 reserved  u64 seq

``body_crc`` is crc32c(body), except for ADD records whose body is an entry
block (see ``codec``) that verifies itself (header, table and per-entry CRCs).
Groups are zero-padded to 4 KiB; a zero byte where a record should start
means "padding: continue at the next 4 KiB boundary" (magics never start with
a zero byte), and a zero byte at a boundary means "end of segment".

Rules (what replay decides):

* A segment whose header is not valid is garbage: ``CorruptRecordError``
  naming the file (the journal cannot be trusted; see the message for the fix).
* Within a segment, the first record that fails verification ends it: the
  rest is a torn or corrupt tail, cut and logged, never replayed.
* Each segment header records the previous segment's valid end.  If the scan
  of the previous segment stopped earlier, records that had been synced
  (hence possibly acknowledged) are unreadable: ``CorruptRecordError``.
"""

from __future__ import annotations

import logging
import os
import re
import struct
from dataclasses import dataclass

from appliance.protocol.errors import CorruptRecordError

from .aligned_io import FileWindow
from .codec import crc, parse_block, unpack_file_header
from .options import ALIGN_BYTES

log = logging.getLogger(__name__)

SEGMENT_MAGIC = b"BKJSEG01"
RECORD = struct.Struct("<IIHHIIIQ")
RECORD_BYTES = RECORD.size  # 32
RECORD_MAGIC = 0x524A_4B42

# record types
ADD, FENCE, MASTER_KEY, LIMBO_SET, LIMBO_CLEAR, EXPLICIT_LAC, DELETE = range(1, 8)
STATE_TYPES = frozenset({FENCE, MASTER_KEY, LIMBO_SET, LIMBO_CLEAR, EXPLICIT_LAC, DELETE})

_SEGMENT_RE = re.compile(r"^journal-(\d{12})\.seg$")


def segment_path(directory: str, segment_id: int) -> str:
    return os.path.join(directory, f"journal-{segment_id:012d}.seg")


def list_segments(directory: str) -> list[int]:
    ids = []
    for name in os.listdir(directory):
        m = _SEGMENT_RE.match(name)
        if m:
            ids.append(int(m.group(1)))
    return sorted(ids)


@dataclass
class ReplayEnd:
    """Where replay stopped: the last segment, its valid end, the highest seq."""

    segment_id: int
    end_offset: int
    last_seq: int
    records: int
    cut: str | None  # description of a cut tail, None if it ended cleanly


def _align(n: int) -> int:
    return -(-n // ALIGN_BYTES) * ALIGN_BYTES


def _record_at(buf, pos: int, already_verified=None):
    """(type, seq, body view, next pos, block) for a valid record at pos, else None."""
    if pos + RECORD_BYTES > len(buf):
        return None
    magic, hdr_crc, rtype, _fl, body_len, body_crc, _r, seq = RECORD.unpack_from(buf, pos)
    if magic != RECORD_MAGIC or hdr_crc != crc(buf[pos + 8:pos + RECORD_BYTES]):
        return None
    start = pos + RECORD_BYTES
    if start + body_len > len(buf):
        return None
    body = memoryview(buf)[start:start + body_len]
    block = None
    if rtype == ADD:
        # Data CRCs of a block already verified in an entry log need no second pass:
        # recovery indexes that copy, never this one.
        verify = already_verified is None or not already_verified(seq)
        block = parse_block(buf, start, verify_data=verify)
        if block is None or block.block_len != body_len or block.seq != seq:
            return None
    elif crc(body) != body_crc:
        return None
    return rtype, seq, body, start + body_len, block


def scan_segment(fd: int, size: int, start: int, on_record,
                 already_verified=None) -> tuple[int, int, int, str | None]:
    """Replay records of one segment file from ``start`` (windowed reads).

    Returns (valid end, last seq, records, cut description or None)."""
    win = FileWindow(fd, size)
    pos, last_seq, count = start, 0, 0
    while pos < size:
        buf, rel = win.get(pos, RECORD_BYTES)
        # Padding: a record's first byte (magic) is never 0; the padding before
        # the next 4 KiB boundary can be shorter than a magic, so test one byte.
        if buf[rel] == 0:
            aligned = _align(pos)
            if aligned == pos:
                return pos, last_seq, count, None
            pos = aligned
            continue
        if len(buf) - rel >= RECORD_BYTES:
            body_len = RECORD.unpack_from(buf, rel)[4]
            buf, rel = win.get(pos, RECORD_BYTES + min(body_len, size - pos))
        rec = _record_at(buf, rel, already_verified)
        if rec is None:
            return pos, last_seq, count, f"invalid record at offset {pos}"
        rtype, seq, body, nxt, block = rec
        on_record(rtype, seq, body, block)
        last_seq, count, pos = max(last_seq, seq), count + 1, pos + (nxt - rel)
    return pos, last_seq, count, None


def replay(directory: str, mark_segment: int, mark_offset: int, on_record,
           already_verified=None, allow_missing_mark: bool = False) -> ReplayEnd:
    """Feed every valid record from the mark to ``on_record(type, seq, body, block)``.

    ``already_verified(seq)``: True for ADD blocks whose entry-log copy was verified
    (their journal copy's data CRCs are then not checked again)."""
    segments = [s for s in list_segments(directory) if s >= mark_segment]
    if allow_missing_mark and mark_segment and (not segments or segments[0] != mark_segment):
        log.warning("journal segment %s (the checkpoint mark) is missing: the journal dir "
                    "was replaced; replaying what is there", segment_path(directory, mark_segment))
        if not segments:
            return ReplayEnd(mark_segment, mark_offset, 0, 0, None)
        mark_segment, mark_offset = segments[0], 0
    if mark_segment and (not segments or segments[0] != mark_segment):
        raise CorruptRecordError(
            f"journal segment {segment_path(directory, mark_segment)} (the checkpoint mark) "
            f"is missing: the journal dir was wiped or replaced; restore it, or reformat "
            f"this bookie (its data will be re-replicated from peers)")
    end = ReplayEnd(mark_segment, mark_offset, 0, 0, None)
    prev_end = None
    for sid in segments:
        path = segment_path(directory, sid)
        start = mark_offset if sid == mark_segment and mark_offset else ALIGN_BYTES
        with open(path, "rb") as f:
            _check_header(f.fileno(), sid, path, prev_end,
                          segment_path(directory, end.segment_id))
            valid_end, last_seq, count, cut = scan_segment(
                f.fileno(), os.fstat(f.fileno()).st_size, start, on_record, already_verified)
        if cut:
            log.warning("journal %s: %s; the tail from there is cut and not replayed",
                        path, cut)
        end = ReplayEnd(sid, _align(valid_end), max(end.last_seq, last_seq),
                        end.records + count, cut)
        prev_end = end.end_offset
    return end


def _check_header(fd: int, sid: int, path: str, prev_end: int | None, prev_path: str) -> None:
    header = unpack_file_header(os.pread(fd, ALIGN_BYTES, 0), SEGMENT_MAGIC)
    if header is None or header[0] != sid:
        raise CorruptRecordError(
            f"journal segment {path} has no valid header (garbage from its start): "
            f"move it away only if you accept losing its entries, or reformat the bookie")
    if prev_end is not None and header[1] != prev_end:
        raise CorruptRecordError(
            f"journal segment {prev_path} is unreadable from offset {prev_end} but the "
            f"next segment says it held data up to {header[1]}: synced records were lost; "
            f"restore the disk or reformat the bookie (BP-46 recovery then re-replicates it)")
