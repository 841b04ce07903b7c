"""Batched reads (catch-up reads, peers reading a bookie's share): records that
sit back to back in the same entry log are fetched with one ``pread`` per run,
and every record is still verified before any byte of the run is handed
out: its 24-byte storage header must name the ledger, entry and length the
index holds, and its data must match the header's CRC32C.

Cost: per run, the record headers are gathered and compared with numpy.
Records of one length (the usual case: a writer's batch) are checked with
no per-record Python: each block's records are a matrix, the data is joined
with one copy, and ONE CRC32C call over it must equal the records' CRCs
combined (``storage.crc_vec``); the joined data (a numpy array) is what a
READ_PACKED reply sends.  Otherwise (lengths differ, or that check fails)
each record costs one C call of CRC32C over a view of the run, and the
first bad record is named.  Strength of the combined check: that of one
CRC32C over the joined data (every error of up to 3 bits and every burst of
up to 32 bits is caught; other damage escapes with probability 2^-32, as
with per-record CRCs; per-record CRCs of short records also catch up to 5
bit errors each).

Faults: a short read, a record whose header disagrees with the index (a
misdirected write or a stale index) or whose data fails its CRC raise
``CorruptRecordError`` naming the entry log and offset; nothing of the
batch is returned then (the caller re-reads entry by entry to learn which).
"""

from __future__ import annotations

import crc32c
import numpy as np

from appliance.protocol.errors import CorruptRecordError
from storage import crc_vec

from .codec import RECORD_DTYPE, RECORD_HEADER_BYTES, verify_record

# Largest single pread of a run, plus at most one record: bigger is fewer
# syscalls, smaller bounds the memory one read holds.
RUN_BYTES_MAX = 16 * 1024 * 1024
# Records this close on disk are read in one pread with the bytes between
# them (the next block's header): fewer syscalls and numpy passes per run,
# at the cost of reading those bytes.
GAP_BYTES_MAX = 4096
_HEADER_SPAN = np.arange(RECORD_HEADER_BYTES)
_crc = crc32c.crc32c


def _runs(rows: np.ndarray) -> list[tuple[int, int]]:
    """Split rows (log, offset, length) into [lo, hi) runs of records that
    follow each other in one entry log, at most GAP_BYTES_MAX apart; a run is
    cut where its records start RUN_BYTES_MAX past its stretch's start (so a
    pread is at most RUN_BYTES_MAX plus one record)."""
    n = len(rows)
    offsets = rows[:, 1].astype(np.int64)
    ends = offsets + rows[:, 2].astype(np.int64) + RECORD_HEADER_BYTES
    gaps = offsets[1:] - ends[:-1]
    breaks = (rows[1:, 0] != rows[:-1, 0]) | (gaps < 0) | (gaps > GAP_BYTES_MAX)
    stretch = np.concatenate(([0], np.cumsum(breaks)))
    stretch_start = offsets[np.concatenate(([0], np.flatnonzero(breaks) + 1))][stretch]
    bucket = (offsets - stretch_start) // RUN_BYTES_MAX
    cuts = np.flatnonzero(breaks | (bucket[1:] != bucket[:-1])) + 1
    bounds = [0, *cuts.tolist(), n]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def fit_bytes(rows: np.ndarray, bytes_max: int) -> int:
    """How many leading rows have data adding up to at most ``bytes_max``."""
    total = np.cumsum(rows[:, 2].astype(np.int64))
    return int(np.searchsorted(total, bytes_max, side="right"))


def read_parts(logs, ledger_id: int, first: int, rows: np.ndarray) -> list:
    """The verified data of entries ``first..`` (``rows`` from the index, one
    per entry) as buffers whose concatenation is the entries' data in order
    (``rows[:, 2]`` bytes each): numpy arrays (joined runs of one length)
    or memoryviews (one entry each); raises ``CorruptRecordError``."""
    out: list = []
    for lo, hi in _runs(rows):
        out += _read_run(logs, ledger_id, first + lo, rows[lo:hi])
    return out


def _read_run(logs, ledger_id: int, first: int, rows: np.ndarray) -> list:
    log_id = int(rows[0, 0])
    offsets = rows[:, 1].astype(np.int64)
    lengths = rows[:, 2].astype(np.int64)
    base = int(offsets[0])
    span = int(offsets[-1] + lengths[-1]) + RECORD_HEADER_BYTES - base
    raw = logs.read_record(log_id, base, span)
    if len(raw) != span:
        raise CorruptRecordError(f"entry log {log_id} offset {base}: short read ({len(raw)} of "
                                 f"{span} bytes) for ledger {ledger_id} entries {first}..")
    rel = offsets - base
    if len(rows) > 1 and lengths[0] > 0 and (lengths == lengths[0]).all():
        joined = _uniform_run(raw, rel, int(lengths[0]), ledger_id, first)
        if joined is not None:
            return [joined]
    return _each_record(raw, rel, lengths, ledger_id, first, f"entry log {log_id}", base)


def _check_heads(heads: np.ndarray, ledger_id: int, first: int,
                 lengths: np.ndarray) -> np.ndarray:
    expected = np.arange(first, first + len(heads), dtype=np.uint64)
    ok = (heads["ledger"] == np.uint64(ledger_id)) & (heads["entry"] == expected)
    return ok & (heads["length"] == lengths)


def _uniform_run(raw, rel: np.ndarray, length: int, ledger_id: int, first: int):
    """Records of one length: each stretch of back-to-back records (one
    block) is a matrix, the data is joined with one copy and checked with
    ONE CRC32C call against the records' CRCs combined (``crc_vec``).  The
    joined data (a numpy array), or None if any check fails."""
    stride = RECORD_HEADER_BYTES + length
    cuts = np.flatnonzero(np.diff(rel) != stride) + 1
    bounds = [0, *cuts.tolist(), len(rel)]
    mats = [np.frombuffer(raw, np.uint8, (hi - lo) * stride, int(rel[lo])).reshape(-1, stride)
            for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]
    heads = np.concatenate([m[:, :RECORD_HEADER_BYTES] for m in mats])
    heads = heads.view(RECORD_DTYPE).ravel()
    if not _check_heads(heads, ledger_id, first, np.full(len(rel), length)).all():
        return None
    joined = np.concatenate([m[:, RECORD_HEADER_BYTES:] for m in mats]).reshape(-1)
    if crc_vec.joined_crc(heads["crc"], length) != _crc(joined):
        return None
    return joined


def _each_record(raw, rel: np.ndarray, lengths: np.ndarray, ledger_id: int, first: int,
                 where: str, base: int) -> list[memoryview]:
    """Every record checked on its own: one CRC32C call each."""
    heads = np.frombuffer(raw, np.uint8)[rel[:, None] + _HEADER_SPAN]
    heads = heads.view(RECORD_DTYPE).ravel()
    ok = _check_heads(heads, ledger_id, first, lengths)
    view = memoryview(raw)
    starts = rel + RECORD_HEADER_BYTES
    datas = list(map(view.__getitem__, map(slice, starts.tolist(), (starts + lengths).tolist())))
    ok &= np.fromiter(map(_crc, datas), np.uint32, len(datas)) == heads["crc"]
    if not ok.all():
        i = int(np.argmin(ok))  # verify_record names what is wrong with it, and raises
        rec = view[int(rel[i]):int(starts[i] + lengths[i])]
        verify_record(rec, ledger_id, first + i, int(lengths[i]), f"{where} offset "
                      f"{base + int(rel[i])}")
        raise CorruptRecordError(f"{where} offset {base + int(rel[i])}: record of "
                                 f"ledger {ledger_id} entry {first + i} failed its checks")
    return datas


def split_parts(parts: list, lengths) -> list[bytes]:
    """``read_parts``' buffers (a numpy array: a joined run of entries of one
    length; anything else: one entry) as one ``bytes`` per entry."""
    out: list[bytes] = []
    pos = 0
    for part in parts:
        if not isinstance(part, np.ndarray):  # one entry's data
            out.append(bytes(part))
            pos += 1
            continue
        size, blob = int(lengths[pos]), part.tobytes()  # a joined run of one length > 0
        out += map(blob.__getitem__, map(slice, range(0, len(blob), size),
                                         range(size, len(blob) + 1, size)))
        pos += len(blob) // size
    return out


def read_rows(logs, ledger_id: int, first: int, rows: np.ndarray) -> list[bytes]:
    """``read_parts`` as separate ``bytes`` objects."""
    return split_parts(read_parts(logs, ledger_id, first, rows), rows[:, 2].tolist())
