"""Executor side of a log scan (``.option("log", NAME)``): a partition's
entries, unpacked into records (control entries skipped), as Arrow batches of
``dlsn string, txid long, payload binary``.

Each entry is read verified by ``BulkReader`` exactly as for ledgers; the
records inside are cut out by ``appliance.protocol.log_entry``, so every
record of the planned entries comes out once, in DLSN order within the
partition.  A cold segment (``appliance.cold``) is read from its Parquet
file with the same DLSNs, txids and payloads (a stream's batch: only its
records inside the batch's bounds): the whole file's checksum and footer are
checked before a record is decoded, then its row groups (those of the
partition's piece: a large segment is split by row groups) are decoded
straight into Arrow batches of the source's schema, without per-row work.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from appliance.cold.reading import open_checked_segment
from appliance.protocol import limits
from appliance.protocol.keys import master_key
from appliance.protocol.log_entry import unpack_entry

LOG_ARROW_SCHEMA = pa.schema([pa.field("dlsn", pa.string(), nullable=False),
                              pa.field("txid", pa.int64(), nullable=False),
                              pa.field("payload", pa.binary(), nullable=False)])


def read_log_partition(partition, password: bytes):
    """The partition's records; a stream's partition carries its batch's
    ``bounds`` ``(start, end)``: only records with ``start <= dlsn < end``."""
    bounds = getattr(partition, "bounds", None)
    key = master_key(password)
    rows: tuple[list, list, list] = ([], [], [])
    size = 0
    with partition.open_reader() as reader:
        for r in partition.ranges:
            seq = partition.segments[r.metadata.ledger_id]
            for chunk in reader.read(r.metadata, r.first_entry_id, r.last_entry_id, key):
                view = memoryview(chunk.payloads)
                offsets = chunk.offsets
                for i in range(chunk.count):
                    header, txids, payloads = unpack_entry(view[offsets[i]:offsets[i + 1]])
                    if header.control:
                        continue
                    entry_id = chunk.first_entry_id + i
                    first = 0
                    if bounds is not None:
                        first, stop = _slots(bounds, seq, entry_id, len(txids))
                        txids, payloads = txids[first:stop], payloads[first:stop]
                    rows[0].extend(f"{seq}/{entry_id}/{slot}"
                                   for slot in range(first, first + len(txids)))
                    rows[1].extend(txids)
                    rows[2].extend(payloads)
                    size += sum(map(len, payloads))
                if (len(rows[0]) >= limits.SPARK_BATCH_ROWS_MAX
                        or size >= limits.SPARK_BATCH_BYTES_MAX):
                    yield _batch(rows)
                    rows, size = ([], [], []), 0
    if rows[0]:
        yield _batch(rows)


def _slots(bounds, seq: int, entry_id: int, count: int) -> tuple[int, int]:
    """The slots ``[first, stop)`` of entry ``(seq, entry_id)`` inside ``bounds``."""
    (s_seq, s_entry, s_slot), (e_seq, e_entry, e_slot) = bounds
    here = (seq, entry_id)
    first = 0 if here > (s_seq, s_entry) else (s_slot if here == (s_seq, s_entry) else count)
    stop = count if here < (e_seq, e_entry) else (e_slot if here == (e_seq, e_entry) else 0)
    return min(first, count), max(min(first, count), min(stop, count))


def read_cold_partition(partition):
    """A cold segment's records (the partition's share of its row groups),
    decoded batch by batch from its file once the whole file is checked (a
    damaged file fails the task naming the segment before any row); a
    stream's partition carries its batch's ``bounds``: only records inside
    them."""
    seg = partition.segment
    pf = open_checked_segment(partition.cold_config, partition.log_name, seg)
    bounds = getattr(partition, "bounds", None)
    columns = LOG_ARROW_SCHEMA.names + (["entry_id", "slot"] if bounds is not None else [])
    groups = piece_row_groups(pf.metadata.num_row_groups, *partition.piece)
    if not groups:
        return
    # use_threads off: Spark runs a task per core already
    for batch in pf.iter_batches(batch_size=batch_rows(pf.metadata), row_groups=groups,
                                 columns=columns, use_threads=False):
        if bounds is not None:
            batch = batch.filter(pa.array(_cold_mask(bounds, seg.seq, batch)))
            if batch.num_rows == 0:
                continue
        yield pa.RecordBatch.from_arrays([batch.column(n) for n in LOG_ARROW_SCHEMA.names],
                                        schema=LOG_ARROW_SCHEMA)


def piece_row_groups(row_groups: int, index: int, pieces: int) -> list[int]:
    """The row groups of piece ``index`` of ``pieces``: contiguous, each
    group in exactly one piece (a piece may be empty)."""
    return list(range(row_groups * index // pieces, row_groups * (index + 1) // pieces))


def batch_rows(metadata) -> int:
    """Rows per record batch: ``SPARK_BATCH_ROWS_MAX``, fewer for wide rows
    (about ``SPARK_BATCH_BYTES_MAX`` a batch, from the file's row group sizes)."""
    rows = max(1, metadata.num_rows)
    size = sum(metadata.row_group(i).total_byte_size for i in range(metadata.num_row_groups))
    return max(1, min(limits.SPARK_BATCH_ROWS_MAX, limits.SPARK_BATCH_BYTES_MAX * rows
                      // max(1, size)))


def _cold_mask(bounds, seq: int, table) -> np.ndarray:
    """Which records of cold segment ``seq`` (a table or record batch with
    its ``entry_id`` and ``slot`` columns) lie in ``bounds`` ``[start, end)``."""
    entries = table.column("entry_id").to_numpy()
    slots = table.column("slot").to_numpy()
    (s_seq, s_entry, s_slot), (e_seq, e_entry, e_slot) = bounds
    keep = np.ones(len(entries), dtype=bool)
    if s_seq > seq or e_seq < seq:
        return ~keep
    if s_seq == seq:
        keep &= (entries > s_entry) | ((entries == s_entry) & (slots >= s_slot))
    if e_seq == seq:
        keep &= (entries < e_entry) | ((entries == e_entry) & (slots < e_slot))
    return keep


def _batch(rows) -> pa.RecordBatch:
    dlsns, txids, payloads = rows
    return pa.RecordBatch.from_arrays(
        [pa.array(dlsns, pa.string()), pa.array(np.asarray(txids, np.int64)),
         pa.array(payloads, pa.binary())], schema=LOG_ARROW_SCHEMA)
