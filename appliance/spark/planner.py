"""Planning a ``bookkeeper`` scan on the driver: ledger metadata -> partitions
whose bounds are fixed before any task runs.

Guarantees:

* Every entry of the scan lies in exactly one partition, once: the ranges
  are cut from each ledger's ``first..last`` without overlap (``split_ranges``).
* Bounds are fixed here: a CLOSED ledger up to its last entry, an OPEN (or
  IN_RECOVERY) ledger that was named explicitly up to the LAC read now,
  opened *without* recovery (its writer is not disturbed).  A task that is
  retried reads exactly the same entries.
* Failures name what failed: an unknown ledger, a wrong password (checked
  against the metadata's password hash before any bookie is asked) or an
  unreachable metadata store fails the query with the ledger id or the
  endpoint in the message.  The default selection (every CLOSED ledger
  but the logs' segment ledgers, as ``bkctl ledger list``) skips the
  ledgers the password does not open instead, and names them in one
  warning (``skipped_warning``).
* Partitions are cut by the work they carry, not by entries alone: an
  entry weighs the rows it holds (a ledger's entry one, a log's entry the
  records it packs: the segment's records over its entries, from the log's
  metadata, or for the segment being written from the running total in its
  LAC entry's header), or its bytes over ``SPLIT_ROW_BYTES`` if more
  (``entry_work``), never less than one, so a log of many small records
  spreads over the driver's CPUs like a ledger of as many entries.  The
  weight only moves the cuts; every entry is still in one partition, the
  cuts are fixed here, and ``maxEntriesPerPartition`` still counts entries.
* A partition carries all its executor needs (ledger metadata, bookie
  endpoints, read knobs), so executors never query the metadata store.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction

from pyspark.sql.datasource import InputPartition

from appliance.client.bulk_read import BulkReadConfig, BulkReader
from appliance.cold.segment_file import ROW_GROUP_ROWS
from appliance.curve import bookie_routes
from appliance.errors import BKError, NoSuchLedgerError, NoSuchLogError
from appliance.logs.tail import owner_confirmed
from appliance.protocol import limits
from appliance.protocol.keys import check_password, master_key
from appliance.protocol.log_entry import read_header
from appliance.protocol.logs import COLD, COMPLETED
from appliance.protocol.metadata import CLOSED, LedgerMetadata
from appliance.spark.access import open_client, require
from appliance.spark.filters import Bounds
from appliance.spark.options import ScanOptions
from ipc.curve import load_key_pair

log = logging.getLogger("appliance.spark")

# A default read names at most this many skipped ledgers in its warning.
SKIPPED_SHOWN = 20
# Without an explicit minPartitions a scan is spread over the driver's CPUs,
# but not into pieces below this many rows (a task costs tens of ms, a row
# about 1.3 us of CPU: docs/PERFORMANCE.md).  A ledger's entry is one row, a
# log's entry as many as the records it packs (``entry_work``).
DEFAULT_SPLIT_ROWS_MIN = 10_000
DEFAULT_SPLIT_ENTRIES_MIN = DEFAULT_SPLIT_ROWS_MIN  # (the stream's ranges weigh a row an entry)
# ... and an entry weighs at least a row per this many payload bytes: a row
# costs about as much as 600 of its bytes (100 B rows 0.65 us each, 1 KB rows
# 1.54 us: docs/PERFORMANCE.md), so past ~1 KiB the bytes set an entry's
# cost (the floor is then ~10 MiB a piece).  Ledgers of entries up to 1 KiB
# split as one row an entry.
SPLIT_ROW_BYTES = 1024


@dataclass(frozen=True)
class LedgerRange:
    """Entries ``first_entry_id..last_entry_id`` (inclusive) of one ledger."""

    metadata: LedgerMetadata
    first_entry_id: int
    last_entry_id: int

    @property
    def count(self) -> int:
        return self.last_entry_id - self.first_entry_id + 1


class BookKeeperPartition(InputPartition):
    """One Spark task: ledger ranges read in order by one ``BulkReader``."""

    def __init__(self, index: int, ranges: tuple[LedgerRange, ...], endpoints: dict[str, str],
                 read_config: BulkReadConfig, segments: dict[int, int] | None = None,
                 curve_key_file: str | None = None, server_keys: dict[str, bytes] | None = None):
        super().__init__(index)
        self.ranges = ranges
        self.endpoints = endpoints
        self.read_config = read_config
        self.segments = segments  # a log scan: ledger id -> segment number
        # CURVE ([security] of the config): the key file's path, never the
        # secret itself, travels to executors; bookies' public server keys
        self.curve_key_file = curve_key_file
        self.server_keys = server_keys or {}

    def open_reader(self):
        """Executor side: a ``BulkReader`` of this partition's bookies (over
        CURVE when the scan's config has ``[security] curve``)."""
        keys = load_key_pair(self.curve_key_file) if self.curve_key_file else None
        return BulkReader(self.endpoints, self.read_config, curve_keys=keys,
                          server_keys=self.server_keys)

    def __repr__(self) -> str:
        spans = ", ".join(f"{r.metadata.ledger_id}:{r.first_entry_id}..{r.last_entry_id}"
                          for r in self.ranges[:4])
        more = f", +{len(self.ranges) - 4} more" if len(self.ranges) > 4 else ""
        return f"BookKeeperPartition({self.value}: {spans}{more})"


class ColdSegmentPartition(InputPartition):
    """One Spark task: piece ``piece[0]`` of ``piece[1]`` of a cold segment's
    Parquet file (its row groups, cut in contiguous runs), the whole file
    checked (``appliance.cold.reading``) by the executor first."""

    def __init__(self, index: int, log_name: str, segment, cold_config,
                 piece: tuple[int, int] = (0, 1)):
        super().__init__(index)
        self.log_name = log_name
        self.segment = segment
        self.cold_config = cold_config  # the store's uri and credentials file path
        self.piece = piece

    def __repr__(self) -> str:
        part = f" piece {self.piece[0] + 1}/{self.piece[1]}" if self.piece[1] > 1 else ""
        return (f"ColdSegmentPartition({self.value}: {self.log_name} segment "
                f"{self.segment.seq}{part})")


def cold_partitions(log_name: str, segments, cold_config, first_index: int = 0) -> list:
    """A partition per row group of each cold segment's file as the mover
    writes it (``segment_file.ROW_GROUP_ROWS`` records a group), so a large
    segment is read in parallel; each piece checks the whole file."""
    out = []
    for seg in segments:
        pieces = max(1, -(-seg.records // ROW_GROUP_ROWS))
        base = first_index + len(out)
        out += [ColdSegmentPartition(base + k, log_name, seg, cold_config, (k, pieces))
                for k in range(pieces)]
    return out


def plan_partitions(options: ScanOptions, bounds: Bounds) -> list:
    """Connect, read metadata, fix bounds, split; see the module docstring."""
    config, client = open_client(options)
    segments, cold = None, []
    with client:
        if options.log is not None:
            ranges, segments, cold, work = log_ranges(client, options)
        else:
            ranges = ledger_ranges(client, options, bounds)
            work = {r.metadata.ledger_id: ledger_work(r.metadata) for r in ranges}
        endpoints, server_keys = _endpoints(client, config)
    security = config.security if config is not None else None
    key_file = str(security.key_file) if security is not None and security.curve else None
    read_config = bulk_read_config(options, config)
    if options.min_partitions is None:
        cpus = len(os.sched_getaffinity(0))
        pieces = split_ranges(ranges, options.max_entries_per_partition, cpus,
                              DEFAULT_SPLIT_ROWS_MIN, multiple_of=cpus, work=work)
    else:
        pieces = split_ranges(ranges, options.max_entries_per_partition, options.min_partitions,
                              work=work)
    hot = [BookKeeperPartition(i, tuple(p), endpoints, read_config,
                               {r.metadata.ledger_id: segments[r.metadata.ledger_id]
                                for r in p} if segments is not None else None,
                               key_file, server_keys)
           for i, p in enumerate(pieces)]
    return cold_partitions(options.log, cold, client.cold_config, len(hot)) + hot


def bulk_read_config(options: ScanOptions, config) -> BulkReadConfig:
    """The executors' read knobs: with a config, its wire limit on entries
    and the client's read batch (``client.read_batch_entries_max`` /
    ``read_batch_bytes_max``, as ``ReadHandle.read_chunks`` uses; the
    bookies cut a batch at their ``server.batch_entries_max``), else the
    defaults.  Entries per request set the per-message cost on both ends,
    which is most of a 100-byte row's."""
    if config is None:
        return BulkReadConfig(read_timeout_ms=options.read_timeout_ms)
    return BulkReadConfig(read_timeout_ms=options.read_timeout_ms,
                          entry_bytes_max=config.wire_limits().entry_bytes_max,
                          batch_entries_max=config.client.read_batch_entries_max,
                          batch_bytes_max=config.client.read_batch_bytes_max)


def log_ranges(client, options: ScanOptions):
    """A log scan: every live hot segment's entries (COMPLETED: to its last
    entry; the IN_PROGRESS one: to the LAC read now, without disturbing the
    writer), each ledger's segment number, the cold segments (read from
    their files; one metadata read decides each segment's tier, once), only
    those of ``options.segments`` if given, and what an entry of each hot
    segment's ledger weighs (``entry_work``)."""
    try:
        md, _ = client.logs.read_log(options.log)
    except NoSuchLogError:
        raise NoSuchLogError(f"bookkeeper source: log {options.log!r} does not exist "
                             f"({options.where})") from None
    ranges, segments, cold, work = [], {}, [], {}
    for seg in md.live_segments:
        if options.segments is not None and seg.seq not in options.segments:
            continue  # not asked for (native.read_log reads it, or it is newer)
        if seg.tier == COLD:
            require(f"log {options.log!r}", options.password, seg.cold.password_hash)
            cold.append(seg)
            continue
        try:
            ledger = client.ledger_metadata(seg.ledger_id)
        except NoSuchLedgerError:
            raise NoSuchLedgerError(f"bookkeeper source: segment {seg.seq} of log "
                                    f"{options.log!r} (ledger {seg.ledger_id}) is gone: "
                                    "truncated or deleted while planning") from None
        require(f"log {options.log!r}", options.password, ledger.password_hash)
        if seg.state == COMPLETED:
            last, records, size = seg.last_entry_id, seg.records, ledger.length
        else:
            ledger, last, records, size = _in_progress_end(client, ledger, options,
                                                           _confirmed_entry(client, options.log,
                                                                            seg.seq))
        if last >= 0:
            ranges.append(LedgerRange(ledger, 0, last))
            segments[seg.ledger_id] = seg.seq
            work[seg.ledger_id] = entry_work(last + 1, records, size)
    return ranges, segments, cold, work


def ledger_ranges(client, options: ScanOptions, bounds: Bounds) -> list[LedgerRange]:
    """The non-empty range to read of every selected ledger, by ledger id.
    By default (no ``ledgers`` option) every CLOSED ledger the user made
    (not the logs' segment ledgers, unless ``includeLogSegments``); those
    the password does not open are skipped, and named once in a warning; a
    ledger named in ``ledgers`` that it does not open fails the query."""
    key = master_key(options.password)
    named = options.ledgers is not None
    ids = options.ledgers if named else _default_ledgers(client, options)
    out, skipped = [], []
    for ledger_id in (i for i in ids if bounds.admits_ledger(i)):
        md = _selected_metadata(client, ledger_id, options)
        if md is None:
            continue
        if not check_password(md.password_hash, key):
            if not named:
                skipped.append(ledger_id)
                continue
            require(f"ledger {ledger_id}", options.password, md.password_hash)
        md, last = _readable_end(client, md, options)
        first = max(options.start_for(ledger_id), bounds.entry_min)
        last = min(last, options.end_for(ledger_id), bounds.entry_max)
        if first <= last:
            out.append(LedgerRange(md, first, last))
    if skipped:
        log.warning(skipped_warning(skipped))
    return out


def _default_ledgers(client, options: ScanOptions) -> list[int]:
    """Every ledger id, without those holding logs' segments unless
    ``includeLogSegments`` (as ``bkctl ledger list`` / ``--all``)."""
    ids = client.list_ledgers()
    if options.include_log_segments:
        return ids
    segments = client.logs.segment_ledgers()
    return [i for i in ids if i not in segments]


def _selected_metadata(client, ledger_id: int, options: ScanOptions) -> LedgerMetadata | None:
    """The ledger's metadata, or None when the default selection passes it
    by (not CLOSED, or deleted since it was listed)."""
    named = options.ledgers is not None
    try:
        md = client.ledger_metadata(ledger_id)
    except NoSuchLedgerError:
        if named:
            raise NoSuchLedgerError(f"bookkeeper source: ledger {ledger_id} does not exist "
                                    f"({options.where})") from None
        return None
    return md if named or md.state == CLOSED else None


def skipped_warning(ledger_ids: list[int]) -> str:
    """The one line naming the ledgers a default read passed by."""
    shown = ", ".join(map(str, ledger_ids[:SKIPPED_SHOWN]))
    more = (f" and {len(ledger_ids) - SKIPPED_SHOWN} more"
            if len(ledger_ids) > SKIPPED_SHOWN else "")
    return (f"bookkeeper source: skipped {len(ledger_ids)} CLOSED ledger(s) the given "
            f"password does not open: {shown}{more} (name them in option ledgers, with "
            "their password, to read them)")


def _readable_end(client, md: LedgerMetadata, options: ScanOptions):
    """(metadata, last readable entry): CLOSED -> its last entry; otherwise
    the LAC of an open without recovery, with the metadata it used."""
    if md.state == CLOSED:
        return md, md.last_entry_id
    handle = client.open_ledger(md.ledger_id, password=options.password, recovery=False)
    try:
        return handle.metadata, handle.last_add_confirmed
    finally:
        handle.close()


def _confirmed_entry(client, name: str, seq: int) -> int:
    """The last entry of in-progress segment ``seq`` that the log's owner
    says its writer has acknowledged (-1: no owner, or none): read your
    writes, the bookies' LAC being one entry behind a log that went quiet."""
    confirmed = owner_confirmed(client, name)
    return confirmed[1] if confirmed is not None and confirmed[0] == seq else -1


def _in_progress_end(client, md: LedgerMetadata, options: ScanOptions, confirmed: int = -1):
    """The IN_PROGRESS segment's ledger: (metadata, last readable entry as
    ``_readable_end`` gives it, the segment's records up to that entry and
    about its bytes), the records from that entry's header (the segment's
    running total) and the bytes its size times the entries (too few when
    it is a writer's control entry: then the records rule); (None, 0) if
    it cannot be read now (then a row an entry: its task reads it, and
    fails with the reason if it still cannot).  ``confirmed``: the owner's
    acknowledged end (``_confirmed_entry``), read up to although the
    bookies' LAC is behind."""
    handle = client.open_ledger(md.ledger_id, password=options.password, recovery=False)
    try:
        md = handle.metadata
        last = md.last_entry_id if md.state == CLOSED else handle.learn_lac(confirmed)
        if last < 0:
            return md, last, 0, 0
        try:
            (entry,) = handle.read(last, last)
            return md, last, read_header(entry.payload).records, len(entry.payload) * (last + 1)
        except BKError as exc:
            log.debug("bookkeeper source: ledger %d entry %d not read for planning: %s",
                      md.ledger_id, last, exc)
            return md, last, None, 0
    finally:
        handle.close()


def _endpoints(client, config) -> tuple[dict[str, str], dict[str, bytes]]:
    """(bookie id -> endpoint, bookie id -> CURVE server key): the live
    registrations this client may reach, endpoints completed by the config
    (a bookie down now may be back by the time a task runs)."""
    endpoints = {spec.id: spec.endpoint for spec in (config.bookies if config else ())}

    live, server_keys = bookie_routes(client.driver.curve, client.registry.available())
    endpoints.update(live)
    return endpoints, server_keys


def entry_work(entries: int, records: int | None = None, size: int = 0) -> Fraction:
    """What one of ``entries`` entries weighs when a scan is split, in rows:
    the records they hold over the entries (None: a ledger's entries, a row
    each), or their ``size`` payload bytes over ``entries * SPLIT_ROW_BYTES``
    if more; never below 1 (an entry costs its task at least a row).  Pure."""
    if entries <= 0:
        return Fraction(1)
    rows = Fraction(records, entries) if records else Fraction(1)
    return max(Fraction(1), rows, Fraction(size, entries * SPLIT_ROW_BYTES))


def ledger_work(md: LedgerMetadata) -> Fraction:
    """An entry of a ledger scan: a row, or its bytes if the ledger is
    CLOSED (its length known) and its entries are larger than a KiB."""
    if md.state != CLOSED:
        return Fraction(1)
    return entry_work(md.last_entry_id + 1, None, md.length)


def split_ranges(ranges: list[LedgerRange], max_entries: int, min_partitions: int = 1,
                 work_min: int = 1, multiple_of: int = 1,
                 work: Mapping[int, Fraction] | None = None) -> list[list[LedgerRange]]:
    """Cut ranges into about ``count`` partitions of equal work, where
    ``count`` is ``max(min_partitions, ceil(total entries / max_entries))``
    rounded up to a multiple of ``multiple_of`` (so tasks come in whole
    waves over the cores), each of at most ``max_entries`` entries and, if
    the scan allows, at least ``work_min`` work.  ``work`` maps a ledger id
    to what one of its entries weighs (``entry_work``; 1 if absent: then
    work is entries).  Consecutive small ranges are packed together (at
    most ``limits.SPARK_RANGES_PER_PARTITION_MAX`` per partition).  Pure;
    each entry lands in exactly one partition."""
    total = sum(r.count for r in ranges)
    if total == 0:
        return []
    weights = [Fraction((work or {}).get(r.metadata.ledger_id, 1)) for r in ranges]
    count = max(1, min_partitions, -(-total // max_entries))
    count = -(-count // multiple_of) * multiple_of
    carried = sum(r.count * w for r, w in zip(ranges, weights, strict=True))
    target = max(Fraction(work_min), carried / count)
    parts: list[list[LedgerRange]] = []
    current: list[LedgerRange] = []
    room, held = target, 0
    for r, weight in zip(ranges, weights, strict=True):
        start = r.first_entry_id
        while start <= r.last_entry_id:
            take = min(r.last_entry_id - start + 1, max_entries - held, math.ceil(room / weight))
            current.append(LedgerRange(r.metadata, start, start + take - 1))
            start, held, room = start + take, held + take, room - take * weight
            if room <= 0 or held == max_entries or \
                    len(current) >= limits.SPARK_RANGES_PER_PARTITION_MAX:
                parts.append(current)
                current, room, held = [], target, 0
    if current:
        parts.append(current)
    return parts
