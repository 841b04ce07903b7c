"""Batched reads (catch-up reads, peers reading a bookie's share): records that
sit back to back in the same entry log are fetched with one ``pread`` per run,
and every record is still verified before any byte of the run is handed
out: its 24-byte storage header must name the ledger, entry and length the
index holds, and its data must match the header's CRC32C.

Cost: per run, the record headers are gathered and compared with numpy.
Records of one length (the usual case: a writer's batch) are checked with
no per-record Python: each block's records are a matrix whose data is
copied once, straight into the one array that holds the whole read (what a
READ_PACKED reply sends), and ONE CRC32C call over the run's part of it must
equal the records' CRCs combined (``storage.crc_vec``).  Otherwise
(lengths differ, or that check fails) each record costs one C call of
CRC32C over a view of the run, and the first bad record is named.
Strength of the combined check: that of one CRC32C over the joined data
(every error of up to 3 bits and every burst of up to 32 bits is caught;
other damage escapes with probability 2^-32, as with per-record CRCs;
per-record CRCs of short records also catch up to 5 bit errors each).

Faults: a short read, a record whose header disagrees with the index (a
misdirected write or a stale index) or whose data fails its CRC raise
``CorruptRecordError`` naming the entry log and offset; nothing of the
batch is returned then (the caller re-reads entry by entry to learn which).
"""

from __future__ import annotations

import crc32c
import numpy as np

from appliance.protocol import limits
from appliance.protocol.errors import CorruptRecordError
from storage import crc_vec

from .codec import RECORD_DTYPE, RECORD_HEADER_BYTES, verify_record

_HEADER_SPAN = np.arange(RECORD_HEADER_BYTES)
_crc = crc32c.crc32c


def _runs(rows: np.ndarray) -> list[tuple[int, int]]:
    """Split rows (log, offset, length) into [lo, hi) runs of records that
    follow each other in one entry log, at most ``STORAGE_READ_GAP_BYTES_MAX``
    apart; a run is cut where its records start ``STORAGE_READ_RUN_BYTES_MAX``
    past its stretch's start (so a pread is at most that plus one record)."""
    n = len(rows)
    offsets = rows[:, 1].astype(np.int64)
    ends = offsets + rows[:, 2].astype(np.int64) + RECORD_HEADER_BYTES
    gaps = offsets[1:] - ends[:-1]
    gap_max = limits.STORAGE_READ_GAP_BYTES_MAX
    breaks = (rows[1:, 0] != rows[:-1, 0]) | (gaps < 0) | (gaps > gap_max)
    stretch = np.concatenate(([0], np.cumsum(breaks)))
    stretch_start = offsets[np.concatenate(([0], np.flatnonzero(breaks) + 1))][stretch]
    bucket = (offsets - stretch_start) // limits.STORAGE_READ_RUN_BYTES_MAX
    cuts = np.flatnonzero(breaks | (bucket[1:] != bucket[:-1])) + 1
    bounds = [0, *cuts.tolist(), n]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def fit_bytes(rows: np.ndarray, bytes_max: int) -> int:
    """How many leading rows have data adding up to at most ``bytes_max``."""
    total = np.cumsum(rows[:, 2].astype(np.int64))
    return int(np.searchsorted(total, bytes_max, side="right"))


def read_parts(logs, ledger_id: int, first: int, rows: np.ndarray) -> list:
    """The verified data of entries ``first..`` (``rows`` from the index, one
    per entry), back to back in ONE numpy ``uint8`` array (``rows[:, 2]``
    bytes each), returned as a one-item list (empty if there are no rows);
    raises ``CorruptRecordError``.  Each run's data is gathered from its
    ``pread`` straight into that array (no per-run array, no join after)."""
    if not len(rows):
        return []
    out = np.empty(int(rows[:, 2].astype(np.int64).sum()), np.uint8)
    pos = 0
    for lo, hi in _runs(rows):
        pos = _read_run(logs, ledger_id, first + lo, rows[lo:hi], out, pos)
    return [out]


def _read_run(logs, ledger_id: int, first: int, rows: np.ndarray, out: np.ndarray,
              pos: int) -> int:
    """One run's records verified and their data copied to ``out[pos:]``;
    returns the position after it."""
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
    end = pos + int(lengths.sum())
    dest = out[pos:end]
    if len(rows) > 1 and lengths[0] > 0 and (lengths == lengths[0]).all() and \
            _uniform_run(raw, rel, int(lengths[0]), ledger_id, first, dest):
        return end
    datas = _each_record(raw, rel, lengths, ledger_id, first, f"entry log {log_id}", base)
    np.concatenate([np.frombuffer(d, np.uint8) for d in datas], out=dest)
    return end


def _check_heads(heads: np.ndarray, ledger_id: int, first: int,
                 lengths: np.ndarray) -> np.ndarray:
    expected = np.arange(first, first + len(heads), dtype=np.uint64)
    ok = (heads["ledger"] == np.uint64(ledger_id)) & (heads["entry"] == expected)
    return ok & (heads["length"] == lengths)


def _uniform_run(raw, rel: np.ndarray, length: int, ledger_id: int, first: int,
                 dest: np.ndarray) -> bool:
    """Records of one length: each stretch of back-to-back records (one
    block) is a matrix whose data columns are copied into ``dest`` (one copy
    in all), then checked with ONE CRC32C call over ``dest`` against the
    records' CRCs combined (``crc_vec``).  False if any check fails (then
    ``dest`` holds no verified data and the caller checks one by one)."""
    stride = RECORD_HEADER_BYTES + length
    cuts = np.flatnonzero(np.diff(rel) != stride) + 1
    bounds = [0, *cuts.tolist(), len(rel)]
    mats = [np.frombuffer(raw, np.uint8, (hi - lo) * stride, int(rel[lo])).reshape(-1, stride)
            for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]
    heads = np.concatenate([m[:, :RECORD_HEADER_BYTES] for m in mats])
    heads = heads.view(RECORD_DTYPE).ravel()
    if not _check_heads(heads, ledger_id, first, np.full(len(rel), length)).all():
        return False
    rows = dest.reshape(-1, length)
    for (lo, hi), m in zip(zip(bounds[:-1], bounds[1:], strict=True), mats, strict=True):
        rows[lo:hi] = m[:, RECORD_HEADER_BYTES:]
    return crc_vec.joined_crc(heads["crc"], length) == _crc(dest)


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
    """Buffers whose concatenation is the entries' data (``read_parts``'
    array, or one buffer per entry) as one ``bytes`` per entry,
    ``lengths[i]`` bytes each."""
    blob = b"".join(parts)
    ends = np.cumsum(np.asarray(lengths, np.int64)).tolist()
    starts = [0, *ends[:-1]]
    return list(map(blob.__getitem__, map(slice, starts, ends)))


def read_rows(logs, ledger_id: int, first: int, rows: np.ndarray) -> list[bytes]:
    """``read_parts`` as separate ``bytes`` objects."""
    return split_parts(read_parts(logs, ledger_id, first, rows), rows[:, 2].tolist())
