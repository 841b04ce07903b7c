"""The executor's read of a cold segment (``read_cold_partition``), without
Spark or an appliance: the Arrow batches it yields hold exactly the records
of the fully verified read (``read_segment``), in order, with the source's
schema, also split into pieces by row groups and clipped to a stream
batch's DLSN bounds; a damaged file fails before any row, naming the
segment; the planner cuts a large segment into a piece per row group."""

from __future__ import annotations

import crc32c
import pyarrow.fs as pafs
import pytest

from appliance.cold import segment_file
from appliance.cold.segment_file import (
    CorruptColdSegmentError,
    SegmentColumns,
    check_table,
    encode,
    read_segment,
    with_metadata,
)
from appliance.protocol import limits
from appliance.protocol.logs import DLSN, ColdCopy, Segment
from appliance.spark.logs import LOG_ARROW_SCHEMA, piece_row_groups, read_cold_partition
from appliance.spark.planner import ColdSegmentPartition, cold_partitions

SEQ, ENTRIES, PER_ENTRY = 4, 60, 5  # 300 records


@pytest.fixture
def cold_file(tmp_path, monkeypatch):
    """(segment, path, file bytes): a file of 300 records in row groups of 64."""
    monkeypatch.setattr(segment_file, "ROW_GROUP_ROWS", 64)
    cols = SegmentColumns(SEQ)
    for e in range(ENTRIES):
        cols.add_entry(e, [e * PER_ENTRY + i + 1 for i in range(PER_ENTRY)],
                       [b"r%d-" % (e * PER_ENTRY + i) * (i + 1) for i in range(PER_ENTRY)])
    records = ENTRIES * PER_ENTRY
    seg = Segment(seq=SEQ, ledger_id=9, state="COMPLETED", records=records, first_txid=1,
                  last_txid=records, last_dlsn=DLSN(SEQ, ENTRIES - 1, PER_ENTRY - 1),
                  last_entry_id=ENTRIES)
    table = cols.table()
    crc = check_table("orders", seg, table)
    data = encode(with_metadata("orders", seg, table, crc))
    path = tmp_path / "seg.parquet"
    path.write_bytes(data)
    copy = ColdCopy(uri=path.as_uri(), bytes=len(data), crc32c=crc,
                    file_crc32c=crc32c.crc32c(data), moved_ms=1)
    return Segment(**{**seg.__dict__, "tier": "cold", "cold": copy}), str(path), data


def _rows(batches) -> list[tuple]:
    out = []
    for batch in batches:
        assert batch.schema == LOG_ARROW_SCHEMA  # nullability included
        out += zip(*(batch.column(n).to_pylist() for n in LOG_ARROW_SCHEMA.names), strict=True)
    return out


def _expected(seg, path) -> list[tuple]:
    table = read_segment(pafs.LocalFileSystem(), path, "orders", seg, seg.cold.crc32c,
                         seg.cold.file_crc32c)
    return list(zip(*(table.column(n).to_pylist() for n in ("dlsn", "txid", "payload")),
                    strict=True))


def test_batches_hold_exactly_the_verified_records_in_order(cold_file, monkeypatch):
    seg, path, _ = cold_file
    monkeypatch.setattr(limits, "SPARK_BATCH_ROWS_MAX", 50)
    batches = list(read_cold_partition(ColdSegmentPartition(0, "orders", seg, None)))
    assert max(b.num_rows for b in batches) <= 50 and len(batches) >= 6
    assert _rows(batches) == _expected(seg, path)
    assert _rows(batches)[7] == ("4/1/2", 8, b"r7-" * 3)


def test_pieces_by_row_groups_together_read_every_record_once(cold_file):
    seg, path, _ = cold_file
    (partition,) = cold_partitions("orders", [seg], None)  # as planned: ROW_GROUP_ROWS is 1M
    assert partition.piece == (0, 1)
    for pieces in (2, 3, 5, 7):  # 5 row groups: 7 pieces leave two empty
        rows = []
        for k in range(pieces):
            part = ColdSegmentPartition(k, "orders", seg, None, (k, pieces))
            rows += _rows(read_cold_partition(part))
        assert rows == _expected(seg, path)


def test_the_planner_cuts_a_segment_per_row_group(cold_file, monkeypatch):
    seg, _, _ = cold_file
    monkeypatch.setattr("appliance.spark.planner.ROW_GROUP_ROWS", 64)
    small = Segment(**{**seg.__dict__, "seq": SEQ + 1, "records": 10})
    parts = cold_partitions("orders", [seg, small], None, first_index=3)
    assert [(p.value, p.segment.seq, p.piece) for p in parts] == \
        [(3 + k, SEQ, (k, 5)) for k in range(5)] + [(8, SEQ + 1, (0, 1))]
    assert [piece_row_groups(5, k, 5) for k in range(5)] == [[0], [1], [2], [3], [4]]


@pytest.mark.parametrize("bounds", [
    ((SEQ, 10, 2), (SEQ, 40, 3)),      # inside the segment, cut inside entries
    ((SEQ - 1, 5, 0), (SEQ, 0, 1)),    # from an earlier segment to the first record
    ((SEQ, 59, 4), (SEQ + 1, 0, 0)),   # the last record only
    ((SEQ, 12, 0), (SEQ, 12, 0)),      # empty
    ((SEQ + 1, 0, 0), (SEQ + 2, 0, 0)),  # after the segment
])
def test_a_stream_batch_reads_only_the_records_inside_its_bounds(cold_file, bounds):
    seg, path, _ = cold_file
    part = ColdSegmentPartition(0, "orders", seg, None)
    part.bounds = bounds
    start, end = (DLSN(*b) for b in bounds)
    want = [row for row in _expected(seg, path)
            if start <= DLSN(*map(int, row[0].split("/"))) < end]
    assert _rows(read_cold_partition(part)) == want


def test_a_damaged_file_fails_before_any_row_naming_the_segment(cold_file):
    seg, path, data = cold_file
    for i in range(0, len(data), max(1, len(data) // 40)):
        damaged = bytearray(data)
        damaged[i] ^= 0x55
        with open(path, "wb") as fh:
            fh.write(damaged)
        with pytest.raises(CorruptColdSegmentError,
                           match=f"log 'orders' segment {SEQ}: cold file .*damaged"):
            next(read_cold_partition(ColdSegmentPartition(0, "orders", seg, None)))


def test_a_file_of_another_segment_or_count_is_refused(cold_file):
    seg, path, _ = cold_file
    other = Segment(**{**seg.__dict__, "seq": SEQ + 1})
    with pytest.raises(CorruptColdSegmentError, match="names another segment"):
        next(read_cold_partition(ColdSegmentPartition(0, "orders", other, None)))
    fewer = Segment(**{**seg.__dict__, "records": seg.records - 1})
    with pytest.raises(CorruptColdSegmentError, match="names another segment"):
        next(read_cold_partition(ColdSegmentPartition(0, "orders", fewer, None)))
    gone = Segment(**{**seg.__dict__,
                      "cold": ColdCopy(**{**seg.cold.__dict__, "uri": seg.cold.uri + "x"})})
    with pytest.raises(CorruptColdSegmentError, match="is missing"):
        next(read_cold_partition(ColdSegmentPartition(0, "orders", gone, None)))
