"""The ``bookkeeper`` PySpark data source: classes Spark instantiates, and
the executor-side read that turns verified chunks into Arrow record batches.

Guarantees:

* The schema is fixed: ``ledger_id long not null, entry_id long not null,
  payload binary not null``; every record batch carries exactly that Arrow
  schema (nullability included), so Spark takes it without conversion.
* A task yields exactly the entries of its partition, in (ledger, entry)
  order, each once, with the bytes the bookies verified (``BulkReader``);
  any failure (no replica served an entry, every replica corrupt, bookies
  unreachable) fails the task with the error naming ledger, entry, bookies
  and endpoints, rather than yielding fewer rows.
* Arrow arrays are built from buffers: one join of the payloads and numpy
  offsets per batch, no per-row Python objects.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader

from appliance.heap import freeze_long_lived_objects, retain_freed_memory
from appliance.protocol import limits
from appliance.protocol.invariant import invariant
from appliance.protocol.keys import master_key
from appliance.spark.access import check_load
from appliance.spark.filters import Bounds, push_filters
from appliance.spark.logs import read_cold_partition, read_log_partition
from appliance.spark.one_line import planning_errors
from appliance.spark.options import parse_options
from appliance.spark.planner import BookKeeperPartition, ColdSegmentPartition, plan_partitions
from appliance.spark.sink import (
    BookKeeperBatchWriter,
    BookKeeperStreamWriter,
    check_service,
    check_sink_schema,
    parse_sink_options,
)
from appliance.spark.stream import BookKeeperStreamReader

SCHEMA_DDL = "ledger_id long not null, entry_id long not null, payload binary not null"
ARROW_SCHEMA = pa.schema([pa.field("ledger_id", pa.int64(), nullable=False),
                          pa.field("entry_id", pa.int64(), nullable=False),
                          pa.field("payload", pa.binary(), nullable=False)])
LOG_SCHEMA_DDL = "dlsn string not null, txid long not null, payload binary not null"
# A chunk with at least this many payload bytes is a record batch of its own,
# over the chunk's buffer: no join copy (1 KiB rows, 1,024 to a reply).
DIRECT_BYTES_MIN = 1 << 20


def _is_log_scan(options) -> bool:
    return any(str(k).lower() == "log" for k in options)


class BookKeeperDataSource(DataSource):
    """``spark.read.format("bookkeeper")``; options in ``appliance.spark.options``."""

    @classmethod
    def name(cls) -> str:
        return "bookkeeper"

    @planning_errors
    def schema(self) -> str:
        """Called by ``load()`` (without a schema of the user's): the target
        and the password are checked here, in one line (``access``)."""
        check_load(self.options)
        return LOG_SCHEMA_DDL if _is_log_scan(self.options) else SCHEMA_DDL

    @planning_errors
    def reader(self, schema) -> DataSourceReader:
        _check_schema(schema, _is_log_scan(self.options))
        return BookKeeperReader(dict(self.options))

    def streamReader(self, schema):  # noqa: N802 - Spark's name
        """``spark.readStream``: a log's records (``appliance.spark.stream``)."""
        try:  # reported by the reader's first call (appliance.spark.stream)
            _check_schema(schema, _is_log_scan(self.options))
            error = None
        except ValueError as exc:
            error = exc
        return BookKeeperStreamReader(dict(self.options), error)

    @planning_errors
    def writer(self, schema, overwrite: bool) -> BookKeeperBatchWriter:
        """``df.write.format("bookkeeper").option("log", NAME).mode("append")``
        (``appliance.spark.sink``)."""
        return BookKeeperBatchWriter(*_sink(self.options, schema, overwrite))

    @planning_errors
    def streamWriter(self, schema, overwrite: bool) -> BookKeeperStreamWriter:  # noqa: N802
        """``df.writeStream.format("bookkeeper").option("log", NAME)``."""
        return BookKeeperStreamWriter(*_sink(self.options, schema, overwrite))


def _sink(options, schema, overwrite: bool):
    """The sink's options and whether its payload is a string, checked on
    the driver: options, then the schema, then the log service."""
    sink = parse_sink_options(dict(options))
    if overwrite:
        raise ValueError("bookkeeper sink: a log is only appended to: use mode(\"append\") "
                         "(streaming: outputMode append or update)")
    string = check_sink_schema(schema)
    check_service(sink)
    return sink, string


class BookKeeperPushdownDataSource(BookKeeperDataSource):
    """The same source, with filter pushdown on ``ledger_id`` / ``entry_id``
    (registered when ``spark.sql.python.filterPushdown.enabled`` is on)."""

    @planning_errors
    def reader(self, schema) -> DataSourceReader:
        _check_schema(schema, _is_log_scan(self.options))
        return BookKeeperPushdownReader(dict(self.options))


class BookKeeperReader(DataSourceReader):
    """Plans on the driver (``partitions``), reads in executors (``read``)."""

    def __init__(self, options: dict):
        self.options = parse_options(options)
        self.bounds = Bounds()

    @planning_errors
    def partitions(self):
        return plan_partitions(self.options, self.bounds)

    def read(self, partition):
        if isinstance(partition, ColdSegmentPartition):
            return read_cold_partition(partition)
        if not isinstance(partition, BookKeeperPartition):
            return iter(())  # nothing to read: Spark plans one empty partition
        if partition.segments is not None:
            return read_log_partition(partition, self.options.password)
        return read_partition(partition, self.options.password)


class BookKeeperPushdownReader(BookKeeperReader):
    def pushFilters(self, filters):  # noqa: N802 - Spark's name
        if self.options.log is not None:  # no ledger_id / entry_id columns: Spark filters
            return list(filters)
        self.bounds, rest = push_filters(filters)
        return rest


def _check_schema(schema, log: bool = False) -> None:
    from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

    if log:
        expected = StructType([StructField("dlsn", StringType(), False),
                               StructField("txid", LongType(), False),
                               StructField("payload", BinaryType(), False)])
    else:
        expected = StructType([StructField("ledger_id", LongType(), False),
                               StructField("entry_id", LongType(), False),
                               StructField("payload", BinaryType(), False)])
    if schema is not None and schema != expected:
        ddl = LOG_SCHEMA_DDL if log else SCHEMA_DDL
        raise ValueError(f"the bookkeeper source has a fixed schema ({ddl}); "
                         f"do not pass another one (got {schema.simpleString()})")


def read_partition(partition, password: bytes):
    """Executor side: the partition's rows as Arrow record batches."""
    retain_freed_memory()  # received replies and batches reuse freed memory
    freeze_long_lived_objects()  # pyspark's gc.collect() after each task walks less

    key = master_key(password)
    batcher = ArrowBatcher()
    with partition.open_reader() as reader:
        for r in partition.ranges:
            for chunk in reader.read(r.metadata, r.first_entry_id, r.last_entry_id, key):
                yield from batcher.add(chunk)
    batch = batcher.flush()
    if batch is not None:
        yield batch


class ArrowBatcher:
    """Accumulates ``VerifiedChunk``s into record batches of bounded size, in
    order; a chunk of ``direct_bytes_min`` payload bytes or more is a batch of
    its own (the batches before it flushed first)."""

    def __init__(self, rows_max: int = limits.SPARK_BATCH_ROWS_MAX,
                 bytes_max: int = limits.SPARK_BATCH_BYTES_MAX,
                 direct_bytes_min: int = DIRECT_BYTES_MIN):
        self.rows_max, self.bytes_max = rows_max, bytes_max
        self.direct_bytes_min = direct_bytes_min
        self._chunks: list = []
        self._rows = self._bytes = 0

    def add(self, chunk) -> list:
        """Take a chunk; returns the batches now ready, in order (often none)."""
        if len(chunk.payloads) >= self.direct_bytes_min:
            before = self.flush()
            return ([before] if before is not None else []) + [chunks_to_batch([chunk])]
        self._chunks.append(chunk)
        self._rows += chunk.count
        self._bytes += len(chunk.payloads)
        if self._rows >= self.rows_max or self._bytes >= self.bytes_max:
            return [self.flush()]
        return []

    def flush(self):
        if not self._chunks:
            return None
        chunks, self._chunks, self._rows, self._bytes = self._chunks, [], 0, 0
        return chunks_to_batch(chunks)


def chunks_to_batch(chunks) -> pa.RecordBatch:
    """One record batch from verified chunks (any ledgers), without per-row work."""
    counts = np.fromiter((c.count for c in chunks), np.int64, len(chunks))
    n = int(counts.sum())
    ledger_ids = np.repeat(np.fromiter((c.ledger_id for c in chunks), np.int64, len(chunks)),
                           counts)
    starts = np.repeat(np.fromiter((c.first_entry_id for c in chunks), np.int64, len(chunks)),
                       counts)
    chunk_base = np.repeat(np.cumsum(counts) - counts, counts)
    entry_ids = starts + (np.arange(n, dtype=np.int64) - chunk_base)
    sizes = np.concatenate([np.diff(c.offsets) for c in chunks])
    invariant(int(sizes.sum()) < 2**31, "record batch payloads over binary's int32 offsets")
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(sizes, out=offsets[1:])
    data = pa.py_buffer(b"".join([c.payloads for c in chunks]))  # one chunk: its buffer
    payload = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), data])
    return pa.RecordBatch.from_arrays([int64_array(ledger_ids), int64_array(entry_ids),
                                       payload], schema=ARROW_SCHEMA)


def int64_array(values: np.ndarray) -> pa.Array:
    """An Arrow int64 array over the numpy buffer (no copy; unlike
    ``pa.array`` it never imports pandas to ask whether this is a Series)."""
    values = np.ascontiguousarray(values, np.int64)
    return pa.Array.from_buffers(pa.int64(), len(values), [None, pa.py_buffer(values)])
