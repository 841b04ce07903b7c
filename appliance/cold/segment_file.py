"""One cold segment = one Parquet file, readable without the appliance.

Columns: ``dlsn string`` (``seq/entry/slot``, as readers print it),
``txid int64``, ``payload binary``, and ``entry_id int64``, ``slot int32``
(the DLSN's parts, so a reader needs no string parsing).  One row per data
record, in DLSN order; control entries are not there.  The file's key-value
metadata (``bookkeeper.*``) names the segment: log, segment number, ledger
id, record count, first/last txid, last DLSN, last entry id, and the
*content checksum*: crc32c over the txid column, the payload lengths and the
payload bytes, in order (``content_crc32c``).

Verification (``read_segment``): the whole file's crc32c against the one in
the segment's metadata (``ColdCopy.file_crc32c``), Parquet's page checksums
(written with ``write_page_checksum``, checked on read), then the identity in the metadata
against the segment's record in the log, the row count, and the content
checksum recomputed from what was read.  Spark's read (``open_segment``)
checks the whole file's crc32c, the footer and the record count before it
decodes a record, then decodes batch by batch from the checked bytes.
Anything wrong is ``CorruptColdSegmentError`` naming the log, the segment
and the file: a damaged copy is never served.

Spark, DuckDB or pandas read the file as any Parquet file
(``spark.read.parquet(uri)``).
"""

from __future__ import annotations

import crc32c
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from appliance.errors import CorruptRecordError
from appliance.protocol.logs import DLSN, NO_TXID, Segment

FORMAT = "bookkeeper-log-segment/1"
SCHEMA = pa.schema([pa.field("dlsn", pa.string(), nullable=False),
                    pa.field("txid", pa.int64(), nullable=False),
                    pa.field("payload", pa.binary(), nullable=False),
                    pa.field("entry_id", pa.int64(), nullable=False),
                    pa.field("slot", pa.int32(), nullable=False)])
ROW_GROUP_ROWS = 1 << 20  # rows per row group: readers split a file's work by these


class CorruptColdSegmentError(CorruptRecordError):
    """A cold segment's file does not hold what its segment's record says."""


class SegmentColumns:
    """A segment's records gathered column by column while it is read (a
    few C calls per entry; the DLSN strings built by Arrow at the end)."""

    def __init__(self, seq: int):
        self.seq = seq
        self.entry_ids: list[int] = []
        self.counts: list[int] = []
        self.txids: list[int] = []
        self.payloads: list[bytes] = []

    def add_entry(self, entry_id: int, txids: list[int], payloads: list) -> None:
        self.entry_ids.append(entry_id)
        self.counts.append(len(txids))
        self.txids.extend(txids)
        self.payloads.extend(payloads)

    def table(self) -> pa.Table:
        counts = np.asarray(self.counts, np.int64)
        entry_ids = np.repeat(np.asarray(self.entry_ids, np.int64), counts)
        starts = np.repeat(np.cumsum(counts) - counts, counts)
        slots = (np.arange(len(entry_ids), dtype=np.int64) - starts).astype(np.int32)
        entries, slot_arr = pa.array(entry_ids), pa.array(slots)
        text = pa.string()
        dlsns = pc.binary_join_element_wise(
            pa.array(np.full(len(entry_ids), self.seq, np.int64)).cast(text),
            entries.cast(text), slot_arr.cast(text), "/")
        return pa.table([dlsns, pa.array(np.asarray(self.txids, np.int64)),
                         pa.array(self.payloads, pa.binary()), entries, slot_arr],
                        schema=SCHEMA)


def content_crc32c(table: pa.Table) -> int:
    """crc32c over the txids (little-endian int64), the payload lengths
    (int64) and the payload bytes, in row order."""
    txids = table.column("txid").combine_chunks()
    payload = table.column("payload").combine_chunks()
    crc = crc32c.crc32c(np.asarray(txids.to_numpy(zero_copy_only=False), "<i8").tobytes())
    if len(payload) == 0:
        return crc
    _, offsets_buf, data_buf = payload.buffers()
    offsets = np.frombuffer(offsets_buf, np.int32, len(payload) + 1, payload.offset * 4)
    crc = crc32c.crc32c(np.diff(offsets).astype("<i8").tobytes(), crc)
    return crc32c.crc32c(memoryview(data_buf)[offsets[0]:offsets[-1]], crc)


def identity(log_name: str, seg: Segment) -> dict[str, str]:
    """The key-value metadata naming the segment (everything but the checksum)."""
    def txid(value: int) -> str:
        return "" if value == NO_TXID else str(value)
    return {"bookkeeper.format": FORMAT, "bookkeeper.log": log_name,
            "bookkeeper.segment": str(seg.seq), "bookkeeper.ledger_id": str(seg.ledger_id),
            "bookkeeper.records": str(seg.records), "bookkeeper.first_txid": txid(seg.first_txid),
            "bookkeeper.last_txid": txid(seg.last_txid),
            "bookkeeper.last_dlsn": "" if seg.last_dlsn is None else str(seg.last_dlsn),
            "bookkeeper.last_entry_id": str(seg.last_entry_id)}


def check_table(log_name: str, seg: Segment, table: pa.Table) -> int:
    """The table's content checksum, after checking it holds the segment's
    records (count, first/last txid, last DLSN); ``CorruptColdSegmentError``."""
    where = f"log {log_name!r} segment {seg.seq} (ledger {seg.ledger_id})"
    if table.num_rows != seg.records:
        raise CorruptColdSegmentError(f"{where}: {table.num_rows} records read, the segment "
                                      f"holds {seg.records}")
    if seg.records:
        txids = table.column("txid")
        last = DLSN(seg.seq, table.column("entry_id")[-1].as_py(),
                    table.column("slot")[-1].as_py())
        if (txids[0].as_py(), txids[-1].as_py(), last) != (seg.first_txid, seg.last_txid,
                                                            seg.last_dlsn):
            raise CorruptColdSegmentError(f"{where}: records do not match the segment's "
                                          f"txids {seg.first_txid}..{seg.last_txid} / last "
                                          f"{seg.last_dlsn}")
    return content_crc32c(table)


def with_metadata(log_name: str, seg: Segment, table: pa.Table, crc: int) -> pa.Table:
    meta = {**identity(log_name, seg), "bookkeeper.content_crc32c": str(crc)}
    return table.replace_schema_metadata({k.encode(): v.encode() for k, v in meta.items()})


def encode(table: pa.Table) -> bytes:
    """The file's bytes (its crc32c goes into the segment's metadata)."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=ROW_GROUP_ROWS, compression="zstd",
                   write_page_checksum=True, use_dictionary=False,
                   write_statistics=["txid", "entry_id"])
    return sink.getvalue().to_pybytes()


def read_segment(fs, path: str, log_name: str, seg: Segment, expected_crc: int,
                 file_crc: int | None = None, uri: str = "") -> pa.Table:
    """Read and verify a cold segment's file (see the module docstring):
    ``file_crc`` (crc32c of the whole file, from the segment's metadata)
    also catches damage outside the pages (headers, statistics, footer)."""
    where = _where(log_name, seg, uri or path)
    data = _file_bytes(fs, path, where, file_crc)
    try:
        pf = pq.ParquetFile(pa.BufferReader(data), page_checksum_verification=True)
        meta = _check_footer(pf, where, log_name, seg, expected_crc)
        table = pf.read()
    except CorruptColdSegmentError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever a damaged file makes the parser raise
        raise CorruptColdSegmentError(f"{where} is unreadable: {type(exc).__name__}: "
                                      f"{exc}") from exc
    try:
        crc = check_table(log_name, seg, table.select(SCHEMA.names).cast(SCHEMA))
    except (KeyError, pa.ArrowException) as exc:
        raise CorruptColdSegmentError(f"{where}: wrong columns ({exc})") from exc
    except CorruptColdSegmentError as exc:
        raise CorruptColdSegmentError(f"{where}: {exc}") from exc
    if crc != expected_crc or meta.get("bookkeeper.content_crc32c") != str(expected_crc):
        raise CorruptColdSegmentError(f"{where}: content checksum {crc:#010x}, expected "
                                      f"{expected_crc:#010x}")
    return table


def open_segment(fs, path: str, log_name: str, seg: Segment, expected_crc: int,
                 file_crc: int, uri: str = "") -> pq.ParquetFile:
    """A cold segment's file, checked before any record is decoded, to be
    decoded batch by batch (``iter_batches``; Spark's read).

    Checked: the whole file's crc32c against ``file_crc`` (the file read
    once, into memory: every page, page header, statistic and the footer),
    then the footer's identity, content checksum, columns and record count
    against the segment.  ``file_crc`` is the crc32c of the very bytes the
    mover read back and verified record by record against the ledger before
    it recorded the file, so bytes with that checksum hold exactly those
    records: the records are not checksummed again, and the pages (decoded
    from the checked bytes in memory) skip their Parquet checksums, which are
    there for readers without the appliance.  Anything wrong is
    ``CorruptColdSegmentError`` naming the log, the segment and the file."""
    where = _where(log_name, seg, uri or path)
    data = _file_bytes(fs, path, where, file_crc)
    try:
        pf = pq.ParquetFile(pa.BufferReader(data))
        _check_footer(pf, where, log_name, seg, expected_crc)
    except CorruptColdSegmentError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever a damaged file makes the parser raise
        raise CorruptColdSegmentError(f"{where} is unreadable: {type(exc).__name__}: "
                                      f"{exc}") from exc
    columns = {f.name: f.type for f in pf.schema_arrow}
    wrong = [f.name for f in SCHEMA if columns.get(f.name) != f.type]
    if wrong:
        raise CorruptColdSegmentError(f"{where}: wrong columns ({', '.join(wrong)})")
    if pf.metadata.num_rows != seg.records:
        raise CorruptColdSegmentError(f"{where}: {pf.metadata.num_rows} records in the file, "
                                      f"the segment holds {seg.records}")
    return pf


def _where(log_name: str, seg: Segment, name: str) -> str:
    return f"log {log_name!r} segment {seg.seq}: cold file {name}"


def _file_bytes(fs, path: str, where: str, file_crc: int | None) -> pa.Buffer:
    """The whole file, its crc32c checked against ``file_crc`` (if given).
    One read of the file's size into one buffer (a stream's ``readall``
    grows its buffer as it goes: 5-10x slower for a 20 MB file)."""
    try:
        with fs.open_input_file(path) as fh:
            data = fh.read_buffer()
    except FileNotFoundError as exc:
        raise CorruptColdSegmentError(f"{where} is missing") from exc
    if file_crc is not None and crc32c.crc32c(data) != file_crc:
        raise CorruptColdSegmentError(f"{where}: file checksum {crc32c.crc32c(data):#010x}, "
                                      f"expected {file_crc:#010x} (damaged)")
    return data


def _check_footer(pf: pq.ParquetFile, where: str, log_name: str, seg: Segment,
                  expected_crc: int) -> dict[str, str]:
    """The footer's key-value metadata, after checking it names the segment
    and its content checksum is ``expected_crc``."""
    meta = {k.decode(): v.decode() for k, v in (pf.schema_arrow.metadata or {}).items()}
    expected = identity(log_name, seg)
    wrong = sorted(k for k, v in expected.items() if meta.get(k) != v)
    if wrong:
        raise CorruptColdSegmentError(f"{where} names another segment ({', '.join(wrong)})")
    if meta.get("bookkeeper.content_crc32c") != str(expected_crc):
        raise CorruptColdSegmentError(f"{where}: content checksum "
                                      f"{meta.get('bookkeeper.content_crc32c')}, expected "
                                      f"{expected_crc}")
    return meta
