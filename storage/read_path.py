"""Batched reads (catch-up reads, peers reading a bookie's share): records that
sit back to back in the same entry log are fetched with one ``pread`` per run,
and every record is still verified on its own before any byte of it is
handed out: its 24-byte storage header must name the ledger, entry and
length the index holds, and its data must match the header's CRC32C.

Cost: per run, the record headers are gathered and compared with numpy;
per record, one C call of CRC32C over a slice of the run (no copy, no
per-record Python bytecode).  Payloads come out as ``memoryview`` slices of
the run, so a caller that packs them (READ_PACKED) copies each byte once.

Faults: a short read, a record whose header disagrees with the index (a
misdirected write or a stale index) or whose data fails its CRC raise
``CorruptRecordError`` naming the entry log and offset; nothing of the
batch is returned then (the caller re-reads entry by entry to learn which).
"""

from __future__ import annotations

import crc32c
import numpy as np

from appliance.errors import CorruptRecordError

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


def read_views(logs, ledger_id: int, first: int, rows: np.ndarray) -> list[memoryview]:
    """The verified data of entries ``first..`` (``rows`` from the index, one
    per entry), as views of the runs read; raises ``CorruptRecordError``."""
    out: list[memoryview] = []
    for lo, hi in _runs(rows):
        out += _read_run(logs, ledger_id, first + lo, rows[lo:hi])
    return out


def _read_run(logs, ledger_id: int, first: int, rows: np.ndarray) -> list[memoryview]:
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
    heads = np.frombuffer(raw, np.uint8)[rel[:, None] + _HEADER_SPAN]
    heads = heads.view(RECORD_DTYPE).ravel()
    expected = np.arange(first, first + len(rows), dtype=np.uint64)
    ok = (heads["ledger"] == np.uint64(ledger_id)) & (heads["entry"] == expected)
    ok &= heads["length"] == lengths
    view = memoryview(raw)
    starts = rel + RECORD_HEADER_BYTES
    datas = list(map(view.__getitem__, map(slice, starts.tolist(), (starts + lengths).tolist())))
    ok &= np.fromiter(map(_crc, datas), np.uint32, len(datas)) == heads["crc"]
    if not ok.all():
        i = int(np.argmin(ok))  # verify_record names what is wrong with it, and raises
        rec = view[int(rel[i]):int(starts[i] + lengths[i])]
        verify_record(rec, ledger_id, first + i, int(lengths[i]),
                      f"entry log {log_id} offset {base + int(rel[i])}")
        raise CorruptRecordError(f"entry log {log_id} offset {base + int(rel[i])}: record of "
                                 f"ledger {ledger_id} entry {first + i} failed its checks")
    return datas


def read_rows(logs, ledger_id: int, first: int, rows: np.ndarray) -> list[bytes]:
    """``read_views`` as separate ``bytes`` objects."""
    return list(map(bytes, read_views(logs, ledger_id, first, rows)))
