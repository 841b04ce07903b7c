"""Executor side of a log scan (``.option("log", NAME)``): a partition's
entries, unpacked into records (control entries skipped), as Arrow batches of
``dlsn string, txid long, payload binary``.

Each entry is read verified by ``BulkReader`` exactly as for ledgers; the
records inside are cut out by ``appliance.protocol.log_entry``, so every
record of the planned entries comes out once, in DLSN order within the
partition.  A cold segment (``appliance.cold``) is one partition of its own,
read from its verified Parquet file with the same DLSNs, txids and payloads
(a stream's batch: only its records inside the batch's bounds).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from appliance.cold.reading import load_segment
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
    """A cold segment's records, from its verified Parquet file (a damaged
    file fails the task naming the segment, never yields rows); a stream's
    partition carries its batch's ``bounds``: only records inside them."""
    table = load_segment(partition.cold_config, partition.log_name, partition.segment)
    bounds = getattr(partition, "bounds", None)
    if bounds is not None:
        table = table.filter(pa.array(_cold_mask(bounds, partition.segment.seq, table)))
    table = table.select(LOG_ARROW_SCHEMA.names).cast(LOG_ARROW_SCHEMA)
    yield from table.to_batches(max_chunksize=limits.SPARK_BATCH_ROWS_MAX)


def _cold_mask(bounds, seq: int, table) -> np.ndarray:
    """Which records of cold segment ``seq`` lie in ``bounds`` ``[start, end)``."""
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
