"""The ``bookkeeper`` source over a log whose first segments are in cold
storage: cold, hot and in-progress segments read together, every record
once with its DLSN, txid and payload; a cold file read by Spark's own
Parquet reader gives the same rows; a damaged cold file fails the query
naming its segment."""

from __future__ import annotations

import json

import pytest

from appliance.spark import register
from tests.spark.conftest import PASSWORD


@pytest.fixture(scope="module")
def app(appliance_factory):
    return appliance_factory(3, log={"segment_records_max": 40, "flush_interval_us": 200},
                             cold_storage={"uri": "cold", "delete_after_ms": 0})


def _load(spark, app, **options):
    reader = (spark.read.format("bookkeeper").option("config", app.config)
              .option("password", PASSWORD.decode()))
    for key, value in options.items():
        reader = reader.option(key, value if isinstance(value, str) else json.dumps(value))
    return reader.load()


def test_cold_hot_and_in_progress_segments_read_once(spark, app):
    from appliance.cold.mover import offloader

    register(spark)
    log = app.client.log("mixed", PASSWORD)
    writer = log.writer()
    written = []
    for i in range(200):
        written.append(writer.write_async(b"event %d" % i))
        if i % 10 == 9:
            writer.flush()
    written = [(str(f.result(timeout=60)), i + 1, b"event %d" % i)
               for i, f in enumerate(written)]
    middle = log.metadata().live_segments[3]
    result = offloader(app.client, PASSWORD).offload("mixed", before=middle.last_dlsn)
    assert result.moved == [1, 2, 3]
    tiers = [s.tier for s in log.metadata().live_segments]
    assert tiers[:3] == ["cold"] * 3 and tiers[3:] == ["hot"] * (len(tiers) - 3)
    writer.flush()
    df = _load(spark, app, log="mixed")
    rows = sorted(((r.dlsn, r.txid, bytes(r.payload)) for r in df.collect()),
                  key=lambda row: row[1])
    assert rows == written
    # the fast path: Spark's own Parquet reader on the cold files
    cold = [s.cold.uri for s in log.metadata().live_segments if s.cold is not None]
    direct = spark.read.parquet(*cold).select("dlsn", "txid", "payload").collect()
    assert sorted((r.dlsn, r.txid, bytes(r.payload)) for r in direct) == \
        sorted(written[:120])
    writer.close()
    with pytest.raises(Exception, match="wrong password for log 'mixed'"):  # at load()
        (spark.read.format("bookkeeper").option("config", app.config)
         .option("password", "wrong").option("log", "mixed").load())


def test_a_damaged_cold_file_fails_the_query_naming_the_segment(spark, app):
    from appliance.cold.mover import offloader

    register(spark)
    log = app.client.log("damaged", PASSWORD)
    with log.writer() as w:
        for i in range(50):
            w.write(b"x%d" % i)
    offloader(app.client, PASSWORD).offload("damaged")
    seg = next(s for s in log.metadata().live_segments if s.cold is not None)
    path = seg.cold.uri.removeprefix("file://")
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0x55
    open(path, "wb").write(bytes(data))
    with pytest.raises(Exception, match=f"segment {seg.seq}"):
        _load(spark, app, log="damaged").collect()
