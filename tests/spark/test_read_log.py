"""``read_log``: a log's cold segments read by Spark's own Parquet reader,
the rest by the ``bookkeeper`` source.  The same rows (dlsn, txid, payload)
and schema as the source, each record once, over cold, hot and in-progress
segments, also when a segment moves cold after ``read_log`` planned; a
damaged cold file fails ``read_log`` naming the segment, and one damaged
after that check fails the query (Parquet page CRCs); after a truncation
only the records kept are read, a DataFrame made before it fails naming a
file it removed, and a segment truncated while ``read_log`` checks its
file is left out; a truncation at a DLSN inside a cold or a hot segment
gives the source, ``read_log`` and the stream from earliest the records
``LogReader`` gives; a file is read for its checksum once per content."""

from __future__ import annotations

import os

import pytest

from appliance.cold.mover import offloader
from appliance.cold.segment_file import CorruptColdSegmentError
from appliance.protocol.logs import DLSN
from appliance.spark import read_log, register
from tests.spark.conftest import PASSWORD


@pytest.fixture(scope="module")
def app(appliance_factory):
    return appliance_factory(3, log={"segment_records_max": 40, "flush_interval_us": 200},
                             cold_storage={"uri": "cold", "delete_after_ms": 0})


def _write(log, n: int, writer=None) -> list[tuple]:
    """``n`` records (flushed every 10): (dlsn, txid, payload) of each."""
    own = writer is None
    writer = writer or log.writer()
    futures = []
    for i in range(n):
        futures.append(writer.write_async(b"event %d" % i))
        if i % 10 == 9:
            writer.flush()
    writer.flush()
    rows = [(str(f.result(timeout=60)), i + 1, b"event %d" % i) for i, f in enumerate(futures)]
    if own:
        writer.close()
    return rows


def _rows(df) -> list[tuple]:
    return sorted(((r.dlsn, r.txid, bytes(r.payload)) for r in df.collect()),
                  key=lambda row: row[1])


def _source(spark, app, name: str):
    register(spark)
    return (spark.read.format("bookkeeper").option("config", app.config)
            .option("password", PASSWORD.decode()).option("log", name).load())


def test_read_log_gives_the_sources_rows_once_with_cold_files_read_by_spark(spark, app):
    log = app.client.log("mixed", PASSWORD)
    writer = log.writer()
    written = _write(log, 200, writer)
    segs = log.metadata().live_segments
    assert offloader(app.client, PASSWORD).offload("mixed", before=segs[3].last_dlsn).moved \
        == [1, 2, 3]
    df = read_log(spark, "mixed", config=app.config, password=PASSWORD.decode())
    plan = df._jdf.queryExecution().executedPlan().toString()
    assert plan.count("FileScan parquet") == 1 and "BatchScan" in plan  # + the source
    # segment 4 moves cold after read_log decided: the source reads it, once
    assert offloader(app.client, PASSWORD).offload("mixed", before=segs[4].last_dlsn).moved \
        == [4]
    assert df.schema == _source(spark, app, "mixed").schema
    assert _rows(df) == written == _rows(_source(spark, app, "mixed"))
    writer.close()
    with pytest.raises(Exception, match="wrong password"):
        read_log(spark, "mixed", config=app.config, password="wrong")


def test_a_damaged_cold_file_is_refused_naming_its_segment(spark, app):
    log = app.client.log("damaged", PASSWORD)
    written = _write(log, 120)
    offloader(app.client, PASSWORD).offload("damaged")
    first, second = [s for s in log.metadata().live_segments if s.cold is not None][:2]
    path = first.cold.uri.removeprefix("file://")
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0x55
    open(path, "wb").write(bytes(data))
    with pytest.raises(CorruptColdSegmentError, match=f"segment {first.seq}: cold file"):
        read_log(spark, "damaged", config=app.config, password=PASSWORD.decode())
    data[len(data) // 2] ^= 0x55
    open(path, "wb").write(bytes(data))
    df = read_log(spark, "damaged", config=app.config, password=PASSWORD.decode())
    plan = df._jdf.queryExecution().executedPlan().toString()
    assert "FileScan parquet" in plan and "BatchScan" not in plan  # no Python source at all
    assert _rows(df) == written
    # damaged after read_log checked it: Spark's page CRC check fails the query
    import pyarrow.parquet as pq

    path = second.cold.uri.removeprefix("file://")
    payload = pq.ParquetFile(path).metadata.row_group(0).column(2)
    data = bytearray(open(path, "rb").read())
    data[payload.data_page_offset + payload.total_compressed_size // 2] ^= 0x55
    open(path, "wb").write(bytes(data))
    with pytest.raises(Exception, match="CRC checksum verification failed"):
        df.collect()


def test_after_a_truncation_only_the_records_kept_are_read(spark, app):
    log = app.client.log("truncated", PASSWORD)
    written = _write(log, 160)
    offloader(app.client, PASSWORD).offload("truncated")
    cold = [s for s in log.metadata().live_segments if s.cold is not None]
    keep = next(i for i, row in enumerate(written) if row[0].startswith(f"{cold[2].seq}/"))
    before = read_log(spark, "truncated", config=app.config, password=PASSWORD.decode())
    log.truncate(DLSN.parse(written[keep][0]))
    df = read_log(spark, "truncated", config=app.config, password=PASSWORD.decode())
    assert _rows(df) == written[keep:] == _rows(_source(spark, app, "truncated"))
    removed = "|".join(s.cold.uri.rsplit("/", 1)[1] for s in cold[:2])
    spark.conf.set("spark.sql.files.ignoreMissingFiles", "true")  # not for these files
    try:
        with pytest.raises(Exception, match=f"({removed}). File does not exist"):
            before.collect()
    finally:
        spark.conf.unset("spark.sql.files.ignoreMissingFiles")


def test_a_segment_truncated_while_read_log_checks_it_is_left_out(spark, app, monkeypatch):
    from appliance.spark import native

    log = app.client.log("racing", PASSWORD)
    written = _write(log, 120)
    offloader(app.client, PASSWORD).offload("racing")
    second = [s for s in log.metadata().live_segments if s.cold is not None][1]
    keep = next(i for i, row in enumerate(written) if row[0].startswith(f"{second.seq}/"))
    real = native.verify_cold_file

    def truncating_first(cold_config, name, seg):
        if seg.seq < second.seq:  # after read_log read the metadata, before the check
            log.truncate(DLSN.parse(written[keep][0]))
        return real(cold_config, name, seg)

    monkeypatch.setattr(native, "verify_cold_file", truncating_first)
    df = read_log(spark, "racing", config=app.config, password=PASSWORD.decode())
    assert _rows(df) == written[keep:]


def test_a_cold_file_is_read_for_its_checksum_once_per_content(tmp_path, monkeypatch):
    """No Spark: ``verify_cold_file`` reads a file again only when its size,
    modification time or the segment's record changed; a damaged, short,
    missing file, or one whose DLSNs are not its entry ids and slots, is
    refused naming the segment."""
    import crc32c
    import pyarrow as pa

    from appliance.cold.segment_file import SegmentColumns, check_table, encode, with_metadata
    from appliance.protocol.logs import ColdCopy, Segment
    from appliance.spark import native

    cols = SegmentColumns(3)
    for e in range(20):
        cols.add_entry(e, [e * 2 + 1, e * 2 + 2], [b"a%d" % e, b"b%d" % e])
    seg = Segment(seq=3, ledger_id=7, state="COMPLETED", records=40, first_txid=1,
                  last_txid=40, last_dlsn=DLSN(3, 19, 1), last_entry_id=20)
    crc = check_table("l", seg, cols.table())
    data = encode(with_metadata("l", seg, cols.table(), crc))
    path = tmp_path / "3-7-x.parquet"
    path.write_bytes(data)
    copy = ColdCopy(uri=path.as_uri(), bytes=len(data), crc32c=crc,
                    file_crc32c=crc32c.crc32c(data), moved_ms=1)
    seg = Segment(**{**seg.__dict__, "tier": "cold", "cold": copy})
    reads = []
    real = native.open_segment
    monkeypatch.setattr(native, "open_segment", lambda *a: reads.append(a[1]) or real(*a))
    native.forget_verified_files()
    for _ in range(3):
        native.verify_cold_file(None, "l", seg)
    assert len(reads) == 1
    damaged = bytearray(data)
    damaged[len(data) // 2] ^= 1
    path.write_bytes(bytes(damaged))
    os.utime(path, ns=(1, 1))  # another modification time: read again, and refused
    with pytest.raises(CorruptColdSegmentError, match=r"segment 3: cold file .*\(damaged\)"):
        native.verify_cold_file(None, "l", seg)
    path.write_bytes(data[:-1])
    with pytest.raises(CorruptColdSegmentError, match="segment 3: cold file .* bytes, the segment"):
        native.verify_cold_file(None, "l", seg)
    path.unlink()
    with pytest.raises(CorruptColdSegmentError, match="segment 3: cold file .* missing"):
        native.verify_cold_file(None, "l", seg)
    # a file that is whole, but whose dlsn strings are not its entry_id / slot
    table = cols.table()
    table = table.set_column(0, "dlsn", pa.array(["3/0/0"] * 40, pa.string()))
    data = encode(with_metadata("l", seg, table, crc))
    path.write_bytes(data)
    copy = ColdCopy(uri=path.as_uri(), bytes=len(data), crc32c=crc,
                    file_crc32c=crc32c.crc32c(data), moved_ms=1)
    seg = Segment(**{**seg.__dict__, "cold": copy})
    with pytest.raises(CorruptColdSegmentError, match="dlsn column does not match"):
        native.verify_cold_file(None, "l", seg)


def _log_reader_rows(log, last: str) -> list[tuple]:
    """What ``LogReader`` gives from the start up to the record at ``last``:
    (dlsn, txid, payload) of each (fails if the reader stalls)."""
    out: list[tuple] = []
    with log.reader() as reader:
        while not out or out[-1][0] != last:
            got = reader.read(max_records=1000, timeout_s=60)
            assert got, f"stalled after {len(out)} records"
            out += [(str(r.dlsn), r.txid, r.payload) for r in got]
    return out


def _stream_rows(spark, app, name: str, checkpoint) -> list[tuple]:
    """Everything the streaming source gives from ``earliest`` (availableNow)."""
    df = (spark.readStream.format("bookkeeper").option("config", app.config)
          .option("password", PASSWORD.decode()).option("log", name).load())
    query = (df.writeStream.format("memory").queryName(checkpoint.name)
             .option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(300) and query.exception() is None
        return _rows(spark.table(checkpoint.name))
    finally:
        query.stop()


def test_a_truncation_inside_a_segment_is_read_alike_by_every_reader(spark, app, tmp_path):
    """``truncate`` at a DLSN inside a cold segment, then inside a hot one:
    the source, ``read_log`` and the stream from earliest give exactly the
    records ``LogReader`` gives from the start, each once.  A truncation
    keeps the segment holding its DLSN whole (the log's truncation point is
    that segment's start), so these are the whole segment's records; were
    the point ever recorded inside a segment, the Spark readers would have
    to follow it too and this test says so."""
    log = app.client.log("midcut", PASSWORD)
    written = _write(log, 200)
    segs = log.metadata().live_segments
    assert offloader(app.client, PASSWORD).offload("midcut", before=segs[2].last_dlsn).moved \
        == [1, 2]
    for step, seq in (("cold", 2), ("hot", 4)):
        inside = [row for row in written if row[0].startswith(f"{seq}/")][15]
        assert DLSN.parse(inside[0]).entry_id > 0  # not a segment's first record
        log.truncate(DLSN.parse(inside[0]))
        expected = _log_reader_rows(log, written[-1][0])
        assert len({row[0] for row in expected}) == len(expected)
        assert expected == written[written.index(expected[0]):]
        assert expected[0][0].split("/")[0] == str(seq), step
        assert _rows(_source(spark, app, "midcut")) == expected, step
        assert _rows(read_log(spark, "midcut", config=app.config,
                              password=PASSWORD.decode())) == expected, step
        assert _stream_rows(spark, app, "midcut", tmp_path / f"midcut_{step}") == expected, step
