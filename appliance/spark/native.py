"""A log read by Spark with its cold segments' files read by Spark's own
Parquet reader (the fast path): ``read_log``.

    from appliance.spark import read_log
    df = read_log(spark, "events", config="configs/local.toml", password="secret")
    # dlsn string, txid long, payload binary: the rows of
    # spark.read.format("bookkeeper").option("log", "events")

Guarantees:

* The rows are those of the ``bookkeeper`` source's log scan, each record
  once, over the segments live when ``read_log`` is called (one read of the
  log's metadata): the cold ones whose files Spark can open (a local
  directory or ``file://`` cold tier) are read by ``spark.read.parquet``,
  the others by the ``bookkeeper`` source restricted to them (option
  ``segments``; none: no source at all), which plans when a query runs,
  reading each of them from the tier it is in then (a segment that moved
  cold since is read from its file, once: a cold segment never turns hot
  again) and the in-progress one to its last confirmed entry.  Segments
  the log gains later are not read: like ``spark.read.parquet``'s list of
  files, the DataFrame's segments are fixed when it is made.
* The DLSN is the file's ``dlsn`` column, checked on the driver (below)
  against the segment number in the log's metadata and the file's
  ``entry_id`` and ``slot`` columns: ``seq/entry/slot``, the string the
  source gives.  (Building it in Spark from those columns instead halves
  the scan's rows/s at 100-byte records: the casts and the concatenation
  cost more than the whole Parquet read.)
* Every native file is verified on the driver before the DataFrame is
  returned (``verify_cold_file``: size, the whole file's crc32c, the
  footer's identity and content checksum against the segment's metadata,
  every DLSN); a damaged or missing file is ``CorruptColdSegmentError``
  naming the log, the segment and the file, and nothing is read (a
  segment truncated away since the metadata read is left out instead).  A file is read for its
  checksum once per driver process and content (cached by URI, size,
  modification time and the segment's checksums).  The scan then has
  Spark verify each Parquet page's CRC (the mover writes them), so bytes
  damaged after the check fail the query instead of being served.
* Spark filters the rows: nothing is pushed into the reads.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

import appliance
from appliance.cold.reading import open_file
from appliance.cold.segment_file import CorruptColdSegmentError, identity, open_segment
from appliance.errors import BKError, NoSuchLogError
from appliance.protocol import limits
from appliance.protocol.logs import COLD, Segment
from appliance.spark.access import require
from appliance.spark.options import parse_options
from appliance.spark.registry import register
from appliance.spark.source import LOG_SCHEMA_DDL

# Spark's Parquet reader (parquet-mr) checks each page's CRC with this set;
# passed as an option of the read, it reaches the scan's Hadoop settings.
PAGE_CHECKSUMS = "parquet.page.verify-checksum.enabled"
# The scan's options: page CRCs checked, and a damaged or missing file fails
# the query whatever the session says (spark.sql.files.ignoreCorruptFiles /
# ignoreMissingFiles would skip it: its records silently missing).
SCAN_OPTIONS = {PAGE_CHECKSUMS: "true", "ignoreCorruptFiles": "false",
                "ignoreMissingFiles": "false"}
# The columns Spark reads from a cold segment's file (segment_file.SCHEMA).
FILE_COLUMNS_DDL = "dlsn string, txid long, payload binary"

_verified: OrderedDict = OrderedDict()  # verification key -> None, oldest first
_verified_lock = threading.Lock()


def read_log(spark, log: str, *, config=None, metadata=None, password: str = "",
             **options):
    """A DataFrame of log ``log``'s records (``dlsn string, txid long,
    payload binary``, none null), the same rows as
    ``spark.read.format("bookkeeper").option("log", log)``, its cold
    segments read by Spark's own Parquet reader.

    ``config`` (the appliance's TOML file) or ``metadata`` (its metadata
    URI), exactly one; ``password``: the log's; ``options``: the source's
    other options: ``segments`` (only these segment numbers) and, for the
    segments it reads, ``maxEntriesPerPartition``, ``minPartitions``,
    ``readTimeoutMs``.  Registers the
    ``bookkeeper`` format (``register``) if needed.  Raises
    ``CorruptColdSegmentError`` for a damaged cold file,
    ``UnauthorizedError`` for a wrong password, ``NoSuchLogError``."""
    raw = {**{k: str(v) for k, v in options.items()}, "log": log, "password": password}
    for key, value in (("config", config), ("metadata", metadata)):
        if value is not None:
            raw[key] = str(value)
    scan = parse_options(raw)  # every option checked before anything connects
    segments, cold_config = _live_segments(scan)
    if scan.segments is not None:
        segments = [seg for seg in segments if seg.seq in scan.segments]
    native, gone = _native_files(scan, segments, cold_config)
    segments = [seg for seg in segments if seg.seq not in gone]
    others = [seg.seq for seg in segments if seg.seq not in native]
    if not segments:
        return spark.createDataFrame([], LOG_SCHEMA_DDL)
    rest = None
    if others:
        register(spark)
        rest = (spark.read.format("bookkeeper").options(**raw)
                .option("segments", ",".join(map(str, others))).load())
    if not native:
        return rest
    cold = cold_frame(spark, native)
    return cold if rest is None else cold.unionByName(rest)


def _native_files(scan, segments, cold_config) -> tuple[dict[int, str], set[int]]:
    """(segment number -> path of each cold file Spark reads, each checked;
    the segments truncated or deleted since the metadata read).  A file
    that fails its check is an error unless its segment has left the log
    meanwhile (a truncation removes its files): then it is left out."""
    native, gone = {}, set()
    for seg in segments:
        path = native_path(cold_config, seg)
        if path is None:
            continue
        require(f"log {scan.log!r}", scan.password, seg.cold.password_hash, "read_log")
        try:
            verify_cold_file(cold_config, scan.log, seg)
        except CorruptColdSegmentError:
            if any(s.seq == seg.seq for s in _live_segments(scan)[0]):
                raise
            gone.add(seg.seq)
            continue
        native[seg.seq] = path
    return native, gone


def _live_segments(scan) -> tuple[list[Segment], object]:
    """The log's live segments (one metadata read) and the cold tier's config."""
    try:
        client = appliance.connect(scan.target)
    except BKError as exc:
        raise type(exc)(f"read_log: cannot reach the appliance ({scan.where}): {exc}") from exc
    with client:
        try:
            md, _ = client.logs.read_log(scan.log)
        except NoSuchLogError:
            raise NoSuchLogError(f"read_log: log {scan.log!r} does not exist "
                                 f"({scan.where})") from None
        return list(md.live_segments), client.cold_config


def native_path(cold_config, seg: Segment) -> str | None:
    """The path Spark opens for a cold segment's file, or None when Spark
    reads it through the ``bookkeeper`` source (a hot segment, or a file
    outside the local filesystem: Spark needs Hadoop's S3 connector and its
    credentials for an object store)."""
    if seg.tier != COLD or urlsplit(seg.cold.uri).scheme != "file":
        return None
    fs, path = open_file(cold_config, seg.cold.uri)
    return "file://" + path if isinstance(fs, pafs.LocalFileSystem) else None


def verify_cold_file(cold_config, log_name: str, seg: Segment) -> None:
    """Check a cold segment's file before Spark reads it (see the module
    docstring); once per file content: a file whose URI, size, modification
    time and segment checksums were verified before is not read again."""
    fs, path = open_file(cold_config, seg.cold.uri)
    where = f"log {log_name!r} segment {seg.seq}: cold file {seg.cold.uri}"
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        raise CorruptColdSegmentError(f"{where} is missing")
    if info.size != seg.cold.bytes:
        raise CorruptColdSegmentError(f"{where}: {info.size} bytes, the segment's file has "
                                      f"{seg.cold.bytes} (damaged)")
    key = (seg.cold.uri, info.size, info.mtime_ns, seg.cold.file_crc32c, seg.cold.crc32c,
           tuple(sorted(identity(log_name, seg).items())))
    with _verified_lock:
        if key in _verified:
            _verified.move_to_end(key)
            return
    pf = open_segment(fs, path, log_name, seg, seg.cold.crc32c, seg.cold.file_crc32c,
                      seg.cold.uri)
    _check_dlsns(pf, seg.seq, where)
    with _verified_lock:
        _verified[key] = None
        while len(_verified) > limits.SPARK_COLD_FILES_VERIFIED_CACHED:
            _verified.popitem(last=False)


def _check_dlsns(pf, seq: int, where: str) -> None:
    """Every row's ``dlsn`` is ``seq/entry_id/slot`` (the file's bytes are
    checked whole already: this is the one column Spark takes as it is)."""
    text = pa.string()
    cols = pf.read(columns=["dlsn", "entry_id", "slot"], use_threads=False)
    expected = pc.binary_join_element_wise(str(seq), cols["entry_id"].cast(text),
                                           cols["slot"].cast(text), "/")
    if not cols["dlsn"].equals(expected):
        raise CorruptColdSegmentError(f"{where}: its dlsn column does not match its "
                                      "entry_id and slot columns")


def cold_frame(spark, paths: dict[int, str]):
    """Segments' files (segment number -> path) as ``dlsn, txid, payload``:
    one ``spark.read.parquet`` of them all (``SCAN_OPTIONS``).  The columns
    are REQUIRED in the files (no nulls; the verified bytes are the ones the
    mover wrote), but Spark reads every file column as nullable:
    ``coalesce`` with a never-used value states it."""
    from pyspark.sql import functions as F  # on use: the module imports without Spark

    files = (spark.read.options(**SCAN_OPTIONS).schema(FILE_COLUMNS_DDL)
             .parquet(*paths.values()))
    return files.select(F.coalesce(F.col("dlsn"), F.lit("")).alias("dlsn"),
                        F.coalesce(F.col("txid"), F.lit(0).cast("long")).alias("txid"),
                        F.coalesce(F.col("payload"), F.lit(b"")).alias("payload"))


def forget_verified_files() -> None:
    """Forget which cold files were verified: the next ``read_log`` reads
    each file for its checksum again (a benchmark's first call)."""
    with _verified_lock:
        _verified.clear()
