"""Writing a DataFrame to a log: ``df.write.format("bookkeeper")`` (batch,
mode ``append``) and ``df.writeStream.format("bookkeeper")`` (a streaming
sink), option ``log``.  Rows go through the log service's producers
(``appliance.logs.producer``; docs/LOGS.md, "The log service").

Guarantees:

* Input: one column, ``payload``, binary or string (stored as its UTF-8
  bytes); any other column, a missing ``payload`` or mode ``overwrite`` is
  one ``ValueError`` of ours before anything runs.  A null payload fails
  the task naming the row.
* Each task writes its partition's rows in order through one producer with
  consecutive sequence numbers.  A stream's producer id is derived from
  (the query's id, which its checkpoint keeps, the partition id): one
  producer per partition for the query's life; where each micro-batch's
  numbers start is recorded before its first row is written
  (``sink_seq``).  A batch write's is derived from (a random id of the
  ``save()``, the partition id), numbers from 1.  A task that runs again
  with the same rows (a task retry, or a micro-batch Spark replays from its
  checkpoint after a crash) writes the same (producer id, sequence number)
  pairs.  A later attempt of a micro-batch first reads what the target log
  holds of it from the position recorded with its first number
  (``sink_scan``) and skips those rows; the log's owner stores the rest
  once (it answers a repeated pair, e.g. a row past the log's last
  confirmed entry, with the first copy's position).  So every row is in
  the log once, in its partition's order, whichever log server owns the log
  and however long after the crash the batch runs again.  A batch write's
  retried task relies on the owner alone (a task retry follows at once).
* A task returns (its commit message) only once every row it wrote is
  durable (the producer's ``flush``); commit then has nothing left to do.
  Abort removes nothing: a log cannot unwrite, and a reader sees a batch's
  rows as they are stored; a replay adds none twice.
* Without a log server registered, ``writer`` / ``streamWriter`` fail with
  one ``LogServiceUnavailableError`` saying to start the service.
"""

from __future__ import annotations

import collections
import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

import appliance
from appliance.errors import BKError, LogServiceUnavailableError
from appliance.protocol import limits
from appliance.protocol.invariant import invariant
from appliance.protocol.log_service import PRODUCER_ID_BYTES
from appliance.protocol.logs import check_log_name
from appliance.spark.sink_scan import log_end, stored_rows
from appliance.spark.sink_seq import BatchStart, batch_done, batch_start

# Spark's local properties on the tasks of a micro-batch (MicroBatchExecution,
# StreamExecution): the batch id and the query id kept in the checkpoint.
BATCH_ID_PROPERTY = "streaming.sql.batchId"
QUERY_ID_PROPERTY = "sql.streaming.queryId"
# Futures of writes not yet settled that a task keeps before it waits for the
# oldest (the producer's own window bounds what is in flight).
PENDING_MAX = limits.LOG_PRODUCER_INFLIGHT_RECORDS_MAX
SINK_OPTIONS = "config, metadata, log, checkpointLocation"


@dataclass(frozen=True)
class SinkOptions:
    target: str  # config path or metadata URI
    is_config: bool
    log: str

    @property
    def where(self) -> str:
        return f"{'config' if self.is_config else 'metadata'} {self.target}"


@dataclass
class SinkCommitMessage(WriterCommitMessage):
    """What one task wrote: its rows and payload bytes, and the positions of
    its first and last rows (None: no row, or answered as already stored
    beyond the owner's memory of positions)."""

    partition: int
    rows: int
    bytes: int
    first: str | None
    last: str | None


def parse_sink_options(raw: Mapping[str, str]) -> SinkOptions:
    opts = {str(k).lower(): v for k, v in raw.items()}
    config, metadata = opts.pop("config", None), opts.pop("metadata", None)
    if (config is None) == (metadata is None):
        raise ValueError("bookkeeper sink: set exactly one of option 'config' (the appliance's "
                         "TOML file) or 'metadata' (its metadata URI)")
    name = opts.pop("log", None)
    if name is None:
        raise ValueError("bookkeeper sink: set option log (the log the rows are written to)")
    try:
        name = check_log_name(str(name))
    except ValueError as exc:
        raise ValueError(f"option log: {exc}") from None
    for ignored in ("path", "checkpointlocation"):  # Spark's own
        opts.pop(ignored, None)
    if opts:
        raise ValueError(f"bookkeeper sink: unknown option(s) {sorted(opts)}; known: "
                         f"{SINK_OPTIONS}")
    return SinkOptions(str(config if config is not None else metadata), config is not None,
                       name)


def check_sink_schema(schema) -> bool:
    """Whether the payload column is a string (else binary); ``ValueError``
    naming the columns when the schema is not one payload column."""
    from pyspark.sql.types import BinaryType, StringType

    names = [f.name for f in schema.fields]
    hint = ("e.g. selectExpr(\"to_json(struct(*)) AS payload\") or "
            "selectExpr(\"CAST(value AS BINARY) AS payload\")")
    if names != ["payload"]:
        raise ValueError(f"bookkeeper sink: the rows must have one column, payload (binary or "
                         f"string), got columns {names}: map them to one, {hint}")
    kind = schema.fields[0].dataType
    if not isinstance(kind, BinaryType | StringType):
        raise ValueError(f"bookkeeper sink: column payload must be binary or string, got "
                         f"{kind.simpleString()}: convert it, {hint}")
    return isinstance(kind, StringType)


def check_service(options: SinkOptions) -> None:
    """The driver's check that a log server is registered."""
    try:
        with appliance.connect(options.target) as client:
            running = client.log(options.log).service_running()
    except BKError as exc:
        raise type(exc)(f"bookkeeper sink: cannot reach the appliance ({options.where}): "
                        f"{exc}") from exc
    if not running:
        raise LogServiceUnavailableError(
            f"bookkeeper sink: the log service is not running ({options.where}: no log server "
            "registered); the sink writes through it: start the appliance with [log] servers "
            "> 0 (bkctl up; docs/LOGS.md, The log service)")


def producer_id(*parts: object) -> bytes:
    """The producer id of a task: the same parts give the same id."""
    text = "\x00".join(str(p) for p in parts).encode("utf-8")
    return hashlib.blake2b(text, digest_size=PRODUCER_ID_BYTES,
                           person=b"bk-spark-sink").digest()


class BookKeeperBatchWriter(DataSourceArrowWriter):
    """``df.write.format("bookkeeper").mode("append").save()``."""

    def __init__(self, options: SinkOptions, string: bool):
        self.options, self.string = options, string
        self.job = os.urandom(16).hex()  # this save(): a task's retries share its producer

    def write(self, iterator) -> SinkCommitMessage:
        from pyspark import TaskContext  # executor side only

        partition = TaskContext.get().partitionId()
        pid = producer_id("write", self.job, partition)
        return write_partition(self.options, self.string, pid, partition, iterator)

    def commit(self, messages) -> None:
        """Nothing left: every task's rows were durable when it returned."""

    def abort(self, messages) -> None:
        """Nothing to undo: rows already stored stay (a log cannot unwrite)."""


class BookKeeperStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("bookkeeper")``: exactly once per micro-batch."""

    def __init__(self, options: SinkOptions, string: bool):
        self.options, self.string = options, string

    def write(self, iterator) -> SinkCommitMessage:
        from pyspark import TaskContext  # executor side only

        ctx = TaskContext.get()
        query, batch = ctx.getLocalProperty(QUERY_ID_PROPERTY), \
            ctx.getLocalProperty(BATCH_ID_PROPERTY)
        invariant(query is not None and batch is not None,
                  "a streaming sink task without Spark's query id or batch id")
        partition, batch = ctx.partitionId(), int(batch)
        pid = producer_id("stream", query, partition)
        log_name = self.options.log
        return write_partition(
            self.options, self.string, pid, partition, iterator,
            start=lambda client: batch_start(client.logs.store, pid, batch,
                                             lambda: log_end(client, log_name)),
            done=lambda store, first, rows: batch_done(store, pid, batch, first, rows))

    def commit(self, messages, batchId) -> None:  # noqa: N803 - Spark's name
        """Nothing left: every task's rows were durable when it returned."""

    def abort(self, messages, batchId) -> None:  # noqa: N803 - Spark's name
        """Nothing to undo: rows already stored stay; a replay of the batch
        adds none of them twice."""


def write_partition(options: SinkOptions, string: bool, pid: bytes, partition: int,
                    iterator, start=None, done=None) -> SinkCommitMessage:
    """Executor side: the partition's rows, in order, with sequence numbers
    from ``start(client)`` (a ``BatchStart``; default: 1, a first attempt)
    up, skipping those a log already holds from an earlier attempt; returns
    once all are durable (and ``done(store, first, rows)`` has recorded it)."""
    with appliance.connect(options.target) as client:
        begin = BatchStart(1, None, False) if start is None else start(client)
        skip = 0
        if begin.again and begin.since is not None:  # None: recorded by an older sink
            skip = stored_rows(client, options.log, pid, begin.first, begin.since)
        producer = client.log(options.log).producer(pid, resume=False)
        try:
            rows, size, first, last = _write_rows(producer, string, iterator, begin.first, skip)
        finally:
            producer.close()
        if rows < skip:
            raise ValueError(f"bookkeeper sink: log {options.log!r} holds {skip} rows of this "
                             f"batch's partition {partition} from an earlier attempt, and this "
                             f"attempt has {rows}: the query's input is not deterministic "
                             "(docs/SPARK.md, Writing to a log)")
        if done is not None:
            done(client.logs.store, begin.first, rows)
    return SinkCommitMessage(partition, rows, size, None if first is None else str(first),
                             None if last is None else str(last))


def _write_rows(producer, string: bool, iterator, first_seq: int, skip: int = 0):
    """(rows, bytes, first DLSN, last DLSN) once every row is durable; the
    first ``skip`` rows (stored by an earlier attempt) are counted, not sent."""
    rows = size = 0
    first = last = None
    pending: collections.deque = collections.deque()
    for batch in iterator:
        for payload in _payloads(batch, string, rows):
            rows += 1
            size += len(payload)
            if rows <= skip:
                continue
            pending.append(producer.write_async(payload, first_seq + rows - 1))
            while len(pending) > PENDING_MAX or (pending and pending[0].done()):
                dlsn = pending.popleft().result()
                first, last = first or dlsn, dlsn or last
    producer.flush()
    while pending:
        dlsn = pending.popleft().result()
        first, last = first or dlsn, dlsn or last
    return rows, size, first, last


def _payloads(batch: pa.RecordBatch, string: bool, before: int) -> list[bytes]:
    column = batch.column(batch.schema.get_field_index("payload"))
    if column.null_count:
        index = before + column.is_null().to_pylist().index(True)
        raise ValueError(f"bookkeeper sink: row {index} of this partition has a null payload; "
                         "a log record is bytes: filter or fill the nulls")
    if string:
        column = column.cast(pa.binary())  # Arrow strings are UTF-8 already
    return column.to_pylist()
