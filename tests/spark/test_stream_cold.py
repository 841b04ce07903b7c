"""Structured Streaming from a log whose first segments are in cold storage
and their ledgers deleted: batches cut by maxRecordsPerTrigger and
maxBytesPerTrigger inside cold segments, and txid / DLSN starting positions
in them, give every record once with the DLSN, txid and payload of the
batch read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from appliance.errors import NoSuchLedgerError
from appliance.spark import register
from tests.spark.conftest import PASSWORD

QUERY_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def app(appliance_factory, spark):
    register(spark)
    return appliance_factory(3, log={"segment_records_max": 40, "flush_interval_us": 200},
                             cold_storage={"uri": "cold", "delete_after_ms": 0})


@pytest.fixture(scope="module")
def written(app):
    """200 records (entries of 10) in segments of 40; the first three
    segments moved to cold storage and their ledgers deleted."""
    from appliance.cold.mover import offloader

    log = app.client.log("coldstream", PASSWORD)
    writer = log.writer()
    futures = []
    for i in range(200):
        futures.append(writer.write_async(b"event %d" % i))
        if i % 10 == 9:
            writer.flush()
    rows = [(str(f.result(timeout=60)), i + 1, b"event %d" % i) for i, f in enumerate(futures)]
    writer.close()
    fourth = log.metadata().live_segments[3]
    result = offloader(app.client, PASSWORD).offload("coldstream", before=fourth.last_dlsn)
    assert result.moved == [1, 2, 3]
    live = log.metadata().live_segments
    assert [s.ledger_deleted for s in live[:3]] == [True] * 3
    assert all(s.tier == "hot" for s in live[3:])
    for seg in live[:3]:
        with pytest.raises(NoSuchLedgerError):
            app.client.ledger_metadata(seg.ledger_id)
    return rows


def _run(spark, app, name: str, tmp_path: Path, **options):
    """Everything there now, through a memory sink: (rows, input rows per batch)."""
    reader = (spark.readStream.format("bookkeeper").option("config", app.config)
              .option("password", PASSWORD.decode()).option("log", "coldstream"))
    for key, value in options.items():
        reader = reader.option(key, str(value))
    query = (reader.load().writeStream.format("memory").queryName(name)
             .option("checkpointLocation", str(tmp_path / name))
             .trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(QUERY_TIMEOUT_S)
        assert query.exception() is None
        sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
        rows = [(r.dlsn, r.txid, bytes(r.payload)) for r in spark.table(name).collect()]
        return sorted(rows, key=lambda row: row[1]), sizes, query.recentProgress
    finally:
        query.stop()


def test_cold_segments_stream_in_batches_cut_inside_them(spark, app, written, tmp_path):
    batch = (spark.read.format("bookkeeper").option("config", app.config)
             .option("password", PASSWORD.decode()).option("log", "coldstream").load())
    assert sorted(((r.dlsn, r.txid, bytes(r.payload)) for r in batch.collect()),
                  key=lambda row: row[1]) == written
    got, sizes, progress = _run(spark, app, "cold_records", tmp_path, maxRecordsPerTrigger=25)
    assert got == written  # every record once, the same DLSNs and txids
    assert sizes == [25] * 8
    ends = [json.loads(p["sources"][0]["endOffset"])["dlsn"] for p in progress
            if p["numInputRows"]]
    assert ends[0] == _next(written[24][0])  # cut inside cold segment 1, inside an entry
    behind = [json.loads(p["sources"][0]["latestOffset"])["recordsBehind"] for p in progress
              if p["numInputRows"]]
    assert behind == [175 - 25 * i for i in range(8)]


def test_cold_segments_stream_by_bytes_and_from_positions_inside_them(
        spark, app, written, tmp_path):
    by_bytes, sizes, _ = _run(spark, app, "cold_bytes", tmp_path, maxBytesPerTrigger=200)
    assert by_bytes == written
    assert len(sizes) > 5 and max(sizes) <= 30  # whole entries of 10 records, >= 1
    from_txid, _, _ = _run(spark, app, "cold_txid", tmp_path, startingPosition="txid:57",
                           maxRecordsPerTrigger=30)
    assert from_txid == written[56:]
    from_dlsn, _, _ = _run(spark, app, "cold_dlsn", tmp_path,
                           startingPosition=written[93][0], maxRecordsPerTrigger=7)
    assert from_dlsn == written[93:]


def _next(dlsn: str) -> str:
    seq, entry, slot = dlsn.split("/")
    return f"{seq}/{entry}/{int(slot) + 1}"


def test_a_query_goes_on_into_segments_moved_to_cold_since_its_last_batch(
        spark, app, tmp_path):
    """A Parquet sink's query reads a hot log, stops; segments it has read
    and one it has not are moved to cold storage, their ledgers deleted;
    restarted from its checkpoint it writes exactly the new records."""
    from appliance.cold.mover import offloader

    log = app.client.log("movedlater", PASSWORD)
    rows = []
    for first, count in ((0, 120), (120, 80)):
        writer = log.writer()
        futures = [writer.write_async(b"later %d" % i) for i in range(first, first + count)]
        writer.flush()
        rows += [(str(f.result(timeout=60)), first + i + 1, b"later %d" % (first + i))
                 for i, f in enumerate(futures)]
        writer.close()
        if first == 0:
            _to_parquet(spark, app, tmp_path)
            assert sorted(_parquet_rows(spark, tmp_path), key=lambda r: r[1]) == rows
    unread = next(s for s in log.metadata().live_segments if s.first_txid > 120)
    moved = offloader(app.client, PASSWORD).offload("movedlater", before=unread.last_dlsn.next())
    assert unread.seq in moved.moved and len(moved.ledgers_deleted) == len(moved.moved)
    _to_parquet(spark, app, tmp_path)
    assert sorted(_parquet_rows(spark, tmp_path), key=lambda r: r[1]) == rows


def _to_parquet(spark, app, tmp_path: Path) -> None:
    query = (spark.readStream.format("bookkeeper").option("config", app.config)
             .option("password", PASSWORD.decode()).option("log", "movedlater")
             .option("maxRecordsPerTrigger", "33").load()
             .writeStream.format("parquet").option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start(str(tmp_path / "out")))
    try:
        assert query.awaitTermination(QUERY_TIMEOUT_S)
        assert query.exception() is None
    finally:
        query.stop()


def _parquet_rows(spark, tmp_path: Path) -> list:
    return [(r.dlsn, r.txid, bytes(r.payload))
            for r in spark.read.parquet(str(tmp_path / "out")).collect()]
