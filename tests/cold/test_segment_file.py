"""The cold segment file alone (no appliance): what the mover writes is read
back with the same records; every single-byte change of the file is refused
with an error naming the segment; another segment's file is refused; the
metadata's tier round-trips through JSON and older records read as hot."""

from __future__ import annotations

import crc32c
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from appliance.cold.segment_file import (
    CorruptColdSegmentError,
    SegmentColumns,
    check_table,
    encode,
    read_segment,
    with_metadata,
)
from appliance.protocol.logs import (
    COLD,
    DLSN,
    ColdCopy,
    LogMetadata,
    Segment,
    forget_ledger,
    move_to_cold,
)


def _segment(seq: int = 3, entries: int = 5) -> tuple[Segment, SegmentColumns]:
    cols = SegmentColumns(seq)
    for e in range(entries):
        cols.add_entry(e, [e * 10 + i + 1 for i in range(10)],
                       [b"payload-%d" % (e * 10 + i) for i in range(10)])
    seg = Segment(seq=seq, ledger_id=70 + seq, state="COMPLETED", records=entries * 10,
                  first_txid=1, last_txid=entries * 10,
                  last_dlsn=DLSN(seq, entries - 1, 9), last_entry_id=entries)
    return seg, cols


def _file(tmp_path, seg, cols) -> tuple[str, bytes, int, int]:
    table = cols.table()
    crc = check_table("orders", seg, table)
    data = encode(with_metadata("orders", seg, table, crc))
    path = str(tmp_path / "seg.parquet")
    with open(path, "wb") as fh:
        fh.write(data)
    return path, data, crc, crc32c.crc32c(data)


def test_the_file_reads_back_with_the_same_records_in_any_parquet_reader(tmp_path):
    seg, cols = _segment()
    path, _, crc, file_crc = _file(tmp_path, seg, cols)
    table = read_segment(pafs.LocalFileSystem(), path, "orders", seg, crc, file_crc)
    assert table.column("dlsn").to_pylist()[:2] == ["3/0/0", "3/0/1"]
    assert table.column("txid").to_pylist() == list(range(1, 51))
    plain = pq.read_table(path)  # no appliance: a plain Parquet file
    assert plain.column("payload").to_pylist() == [b"payload-%d" % i for i in range(50)]
    assert plain.schema.metadata[b"bookkeeper.segment"] == b"3"


def test_every_single_byte_change_is_refused_naming_the_segment(tmp_path):
    seg, cols = _segment(entries=2)
    path, data, crc, file_crc = _file(tmp_path, seg, cols)
    for i in range(0, len(data), 7):
        damaged = bytearray(data)
        damaged[i] ^= 0x55
        with open(path, "wb") as fh:
            fh.write(damaged)
        with pytest.raises(CorruptColdSegmentError, match="log 'orders' segment 3"):
            read_segment(pafs.LocalFileSystem(), path, "orders", seg, crc, file_crc)


def test_a_file_of_another_segment_or_with_other_records_is_refused(tmp_path):
    seg, cols = _segment()
    path, _, crc, file_crc = _file(tmp_path, seg, cols)
    other = Segment(seq=4, ledger_id=seg.ledger_id, state="COMPLETED", records=seg.records,
                    first_txid=1, last_txid=50, last_dlsn=DLSN(4, 4, 9), last_entry_id=5)
    with pytest.raises(CorruptColdSegmentError, match="names another segment"):
        read_segment(pafs.LocalFileSystem(), path, "orders", other, crc, file_crc)
    with pytest.raises(CorruptColdSegmentError, match="40 records|holds 40"):
        check_table("orders", Segment(seq=3, ledger_id=73, state="COMPLETED", records=40),
                    cols.table())
    with pytest.raises(CorruptColdSegmentError, match="missing"):
        read_segment(pafs.LocalFileSystem(), path + ".gone", "orders", seg, crc, file_crc)


def test_tier_round_trips_and_only_a_sealed_hot_segment_moves():
    seg, _ = _segment()
    md = LogMetadata(name="orders", segments=(seg,), next_seq=4)
    copy = ColdCopy(uri="file:///c/x.parquet", bytes=10, crc32c=1, file_crc32c=2, moved_ms=5)
    moved = move_to_cold(md, 3, seg.ledger_id, copy)
    assert LogMetadata.from_bytes(moved.to_bytes()) == moved
    assert moved.segment(3).tier == COLD and moved.describe()["segments"][0]["tier"] == "cold"
    with pytest.raises(ValueError, match="not a sealed hot segment"):
        move_to_cold(moved, 3, seg.ledger_id, copy)  # moved already: the file is an orphan
    with pytest.raises(ValueError, match="not a sealed hot segment"):
        move_to_cold(md, 3, 999, copy)
    gone = forget_ledger(moved, 3)
    assert gone.segment(3).ledger_deleted and forget_ledger(gone, 3) == gone
    old = md.to_bytes().replace(b',"tier":"hot"', b"").replace(b',"cold":null', b"")
    assert LogMetadata.from_bytes(old).segment(3).tier == "hot"
