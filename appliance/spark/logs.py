"""Executor side of a log scan (``.option("log", NAME)``): a partition's
entries, unpacked into records (control entries skipped), as Arrow batches of
``dlsn string, txid long, payload binary``.

Each entry is read verified by ``BulkReader`` exactly as for ledgers; the
records inside are cut out by ``appliance.protocol.log_entry``, so every
record of the planned entries comes out once, in DLSN order within the
partition.  A cold segment (``appliance.cold``) is one partition of its own,
read from its verified Parquet file with the same DLSNs, txids and payloads.
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
                    rows[0].extend(f"{seq}/{entry_id}/{slot}" for slot in range(len(txids)))
                    rows[1].extend(txids)
                    rows[2].extend(payloads)
                    size += sum(map(len, payloads))
                if (len(rows[0]) >= limits.SPARK_BATCH_ROWS_MAX
                        or size >= limits.SPARK_BATCH_BYTES_MAX):
                    yield _batch(rows)
                    rows, size = ([], [], []), 0
    if rows[0]:
        yield _batch(rows)


def read_cold_partition(partition):
    """A cold segment's records, from its verified Parquet file (a damaged
    file fails the task naming the segment, never yields rows)."""
    table = load_segment(partition.cold_config, partition.log_name, partition.segment)
    table = table.select(LOG_ARROW_SCHEMA.names).cast(LOG_ARROW_SCHEMA)
    yield from table.to_batches(max_chunksize=limits.SPARK_BATCH_ROWS_MAX)


def _batch(rows) -> pa.RecordBatch:
    dlsns, txids, payloads = rows
    return pa.RecordBatch.from_arrays(
        [pa.array(dlsns, pa.string()), pa.array(np.asarray(txids, np.int64)),
         pa.array(payloads, pa.binary())], schema=LOG_ARROW_SCHEMA)
