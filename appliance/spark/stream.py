"""Structured Streaming source of a log: ``spark.readStream.format("bookkeeper")``
with option ``log`` (options and offsets: ``stream_options``).

Guarantees:

* Offsets are positions (DLSNs) of the log; a micro-batch ``[start, end)``
  holds exactly the records with ``start <= dlsn < end``, and ``end`` is
  always just after a record readable when it was chosen (COMPLETED
  segments to their end, the IN_PROGRESS one up to its LAC).  So
  ``partitions(start, end)`` planned again after a restart, also after the
  driver was killed, yields the very same records: Spark's checkpoint then
  resumes exactly after the last committed batch.
* ``maxRecordsPerTrigger`` / ``maxBytesPerTrigger`` cut a batch at a record
  boundary (``stream_view``); Spark's read limit (``ReadAllAvailable`` for
  a trigger that asks for everything) is respected.
* A batch is planned per segment range like the batch source (``planner``)
  and read by the same per-segment path (``logs.read_log_partition``),
  clipped to the batch's DLSN bounds on its first and last entries.  A cold
  segment (``appliance.cold``; its ledger may be deleted) is read from its
  verified file (``logs.read_cold_partition``), clipped to the same bounds:
  the same DLSNs, txids and payloads as when it was hot, each record once.
* Records the query still needs that were truncated: ``LogTruncatedError``
  naming the first lost DLSN (``failOnDataLoss`` true, the default), or a
  warning and the query goes on from the truncation point (false); checked
  when a batch is chosen and planned, and when a task finds a segment gone.
* ``latestOffset`` is cheap on a quiet log: one metadata read, one LAC read;
  entry headers are read only when the LAC moved or a limit cuts a batch.
"""

from __future__ import annotations

import copy
import functools
import logging
import os

from pyspark.sql.datasource import DataSourceStreamReader
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

import appliance
from appliance.errors import BKError, LogTruncatedError, NoSuchLedgerError
from appliance.protocol.invariant import invariant
from appliance.protocol.logs import COLD, COMPLETED, DLSN
from appliance.spark.access import check_log_password, open_client, require
from appliance.spark.logs import read_cold_partition, read_log_partition
from appliance.spark.one_line import planning_errors
from appliance.spark.planner import (
    DEFAULT_SPLIT_ENTRIES_MIN,
    BookKeeperPartition,
    ColdSegmentPartition,
    LedgerRange,
    _endpoints,
    bulk_read_config,
    split_ranges,
)
from appliance.spark.stream_options import (
    EARLIEST,
    LATEST,
    StreamOptions,
    offset_json,
    offset_position,
    parse_stream_options,
)
from appliance.spark.stream_view import LogView

log = logging.getLogger("appliance.spark")


class BookKeeperStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets and planning in Spark's driver-side Python worker (which
    keeps this object for the query's life: the view's caches last);
    ``read`` in executors."""

    def __init__(self, options: dict, error: ValueError | None = None):
        self._raw, self._error = options, error
        self._view: LogView | None = None
        self._config = None
        self._target: DLSN | None | bool = False  # availableNow: the end fixed at its start
        self._reported: tuple[DLSN, DLSN] | None = None  # (last end chosen, data end)
        self._checked: int | None = None  # the first segment's ledger the password opened

    @functools.cached_property
    def options(self) -> StreamOptions:
        """Checked at the first call Spark makes, not in ``streamReader``:
        an error there would reach the user as PySpark's ``UnboundLocalError``
        instead of our line."""
        if self._error is not None:
            raise self._error
        return parse_stream_options(self._raw)

    # -- the driver ---------------------------------------------------------------------
    def _fresh(self) -> LogView:
        if self._view is None:
            scan = self.options.scan
            self._config, client = open_client(scan)
            self._view = LogView(client, self.options.log, scan.password, scan.where)
        view = self._view
        view.refresh()
        live = view.md.live_segments
        if live and live[0].ledger_id != self._checked:  # a new first segment: once each
            self._checked = check_log_password(view.client, self.options.log, view.md,
                                               self.options.scan.password)
        return view

    @planning_errors
    def initialOffset(self) -> dict:  # noqa: N802 - Spark's name
        view = self._fresh()
        starting, live = self.options.starting, view.md.live_segments
        # before every record there is or will be (a log with no record: its end too)
        earliest = DLSN(live[0].seq if live else view.md.next_seq, 0, 0)
        if starting == EARLIEST:
            position = earliest
        elif starting == LATEST:
            position = view.data_end() or earliest
        elif isinstance(starting, DLSN):
            position = self._needed(view, starting)
        else:  # a txid: its record, or the end when no record reaches it yet
            position = view.txid_position(starting) or view.data_end() or earliest
        return offset_json(self.options.log, position)

    @planning_errors
    def getDefaultReadLimit(self):  # noqa: N802 - Spark's name
        if self.options.max_records is not None:
            return ReadMaxRows(self.options.max_records)
        if self.options.max_bytes is not None:
            return ReadMaxBytes(self.options.max_bytes)
        return ReadAllAvailable()

    @planning_errors
    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802 - Spark's name
        self._target = self._fresh().data_end()

    @planning_errors
    def latestOffset(self, start: dict, limit) -> dict:  # noqa: N802 - Spark's name
        view = self._fresh()
        start_pos = self._needed(view, offset_position(self.options.log, start))
        end = log_end = view.data_end()
        if self._target is not False:
            end = None if self._target is None or end is None else min(end, self._target)
        if end is None or end <= start_pos:
            self._reported = None if log_end is None else (start_pos, max(start_pos, log_end))
            return offset_json(self.options.log, start_pos)
        if not isinstance(limit, ReadAllAvailable):
            end = self._limited(view, start_pos, end, limit)
        self._reported = (end, log_end)
        return offset_json(self.options.log, end)

    def _limited(self, view: LogView, start: DLSN, end: DLSN, limit) -> DLSN:
        rows = limit.max_rows if isinstance(limit, ReadMaxRows) else self.options.max_records
        size = limit.max_bytes if isinstance(limit, ReadMaxBytes) else self.options.max_bytes
        if rows is not None:
            end = min(end, view.after_records(start, rows) or end)
        if size is not None:
            end = view.after_bytes(start, end, size)
        return end

    def reportLatestOffset(self) -> dict | None:  # noqa: N802 - Spark's name
        """The log's end in Spark's progress, with the records between the
        last batch's end and it (``recordsBehind``)."""
        if self._reported is None or self._view is None:
            return None
        end, data_end = self._reported
        doc = offset_json(self.options.log, data_end)
        try:
            doc["recordsBehind"] = self._view.count(end, data_end)
        except BKError:  # a report only: the next trigger tells the real trouble
            pass
        return doc

    @planning_errors
    def partitions(self, start: dict, end: dict) -> list:
        view = self._fresh()
        start_pos = self._needed(view, offset_position(self.options.log, start))
        end_pos = offset_position(self.options.log, end)
        if end_pos <= start_pos:
            return []
        return self._plan(view, start_pos, end_pos)

    def _needed(self, view: LogView, position: DLSN) -> DLSN:
        """``position``, checked against the truncation point: records from
        it that are gone fail the query or are skipped (``failOnDataLoss``)."""
        point = view.md.truncated_before
        if position.seq == 0 or position >= point:
            return max(position, point) if position.seq == 0 else position
        message = (f"bookkeeper source: log {self.options.log!r}: records from {position} to "
                   f"{point} that this query has not read yet were truncated")
        if self.options.fail_on_data_loss:
            raise LogTruncatedError(f"{message} (failOnDataLoss is true; set it to false to "
                                    "skip lost records)")
        log.warning("%s; skipped (failOnDataLoss is false)", message)
        return point

    def _plan(self, view: LogView, start: DLSN, end: DLSN) -> list:
        ranges, segments, cold = [], {}, []
        for seg in view.segments_from(start):
            if seg.seq > end.seq:
                break
            first = start.entry_id if seg.seq == start.seq else 0
            if seg.seq == end.seq:
                last = end.entry_id if end.slot > 0 else end.entry_id - 1
            else:
                invariant(seg.state == COMPLETED, f"segment {seg.seq} before the batch's end "
                          f"{end} is not completed")
                last = seg.last_entry_id
            if last < first:
                continue
            if seg.tier == COLD:
                self._check_cold_password(seg)
                cold.append(seg)
                continue
            try:
                ledger = view.client.ledger_metadata(seg.ledger_id)
            except NoSuchLedgerError:  # deleted since the metadata was read: truncated?
                view.refresh()
                lost = DLSN(seg.seq, first, 0)
                if self._needed(view, lost) == lost:
                    raise NoSuchLedgerError(f"bookkeeper source: segment {seg.seq} of log "
                                            f"{self.options.log!r} (ledger {seg.ledger_id}) "
                                            "is gone") from None
                continue
            ranges.append(LedgerRange(ledger, first, last))
            segments[seg.ledger_id] = seg.seq
        hot = self._partitions(view, ranges, segments, (start, end), first_index=len(cold))
        return self._cold_partitions(view, cold, (start, end)) + hot

    def _check_cold_password(self, seg) -> None:
        require(f"log {self.options.log!r}", self.options.scan.password, seg.cold.password_hash)

    def _cold_partitions(self, view: LogView, cold, bounds) -> list:
        out = []
        for i, seg in enumerate(cold):
            part = ColdSegmentPartition(i, self.options.log, seg, view.client.cold_config)
            part.bounds = bounds
            out.append(part)
        return out

    def _partitions(self, view: LogView, ranges, segments, bounds, first_index=0) -> list:
        scan = self.options.scan
        endpoints, server_keys = _endpoints(view.client, self._config)
        security = self._config.security if self._config is not None else None
        key_file = str(security.key_file) if security is not None and security.curve else None
        read_config = bulk_read_config(scan, self._config)
        if scan.min_partitions is None:
            cpus = len(os.sched_getaffinity(0))
            pieces = split_ranges(ranges, scan.max_entries_per_partition, cpus,
                                  DEFAULT_SPLIT_ENTRIES_MIN, multiple_of=cpus)
        else:
            pieces = split_ranges(ranges, scan.max_entries_per_partition, scan.min_partitions)
        out = []
        for i, piece in enumerate(pieces, start=first_index):
            part = BookKeeperPartition(i, tuple(piece), endpoints, read_config,
                                       {r.metadata.ledger_id: segments[r.metadata.ledger_id]
                                        for r in piece}, key_file, server_keys)
            part.bounds = bounds
            out.append(part)
        return out

    def commit(self, end: dict) -> None:
        """Nothing to release: the log keeps every record until it is truncated."""

    def stop(self) -> None:
        if self._view is not None:
            view, self._view = self._view, None
            view.close()
            view.client.close()

    # -- executors ----------------------------------------------------------------------
    def read(self, partition):
        if isinstance(partition, ColdSegmentPartition):
            return read_cold_stream_partition(partition, self.options)
        if not isinstance(partition, BookKeeperPartition):
            return iter(())
        return read_stream_partition(partition, self.options)


def read_cold_stream_partition(partition: ColdSegmentPartition, options: StreamOptions):
    """A batch's cold segment; its file gone because the segment was
    truncated since planning: as for a hot segment (``read_stream_partition``)."""
    try:
        yield from read_cold_partition(partition)
    except BKError:
        seq = partition.segment.seq
        if not _truncated(options, seq):
            raise
        first = max(partition.bounds[0], DLSN(seq, 0, 0))
        _lost(options, first, seq)


def read_stream_partition(partition: BookKeeperPartition, options: StreamOptions):
    """A batch's partition, segment by segment; a segment that fails to read
    and is found truncated since planning fails the task naming its first
    DLSN, or is skipped with a warning (``failOnDataLoss`` false)."""
    for ledger_id in dict.fromkeys(r.metadata.ledger_id for r in partition.ranges):
        part = copy.copy(partition)
        part.ranges = tuple(r for r in partition.ranges if r.metadata.ledger_id == ledger_id)
        try:
            yield from read_log_partition(part, options.scan.password)
        except BKError:
            seq = partition.segments[ledger_id]
            if not _truncated(options, seq):
                raise
            first = max(partition.bounds[0], DLSN(seq, part.ranges[0].first_entry_id, 0))
            _lost(options, first, seq)


def _lost(options: StreamOptions, first: DLSN, seq: int) -> None:
    """Records from ``first`` (segment ``seq``) were truncated while a task
    read them: fail it, or warn and go on (``failOnDataLoss`` false)."""
    message = (f"bookkeeper source: log {options.log!r}: records from {first} on "
               f"(segment {seq}) were truncated while this batch read them")
    if options.fail_on_data_loss:
        raise LogTruncatedError(f"{message} (failOnDataLoss is true)") from None
    log.warning("%s; skipped (failOnDataLoss is false)", message)


def _truncated(options: StreamOptions, seq: int) -> bool:
    """Whether segment ``seq`` of the log is truncated now (an executor asks
    the metadata store only after a read failed)."""
    try:
        with appliance.connect(options.scan.target) as client:
            md, _ = client.logs.read_log(options.log)
    except BKError:
        return False
    return all(s.seq != seq for s in md.live_segments)
