"""Writing to a log from Spark (``df.write`` / ``df.writeStream`` with format
``bookkeeper``) in local[2] against a real appliance with its log service:
rows stored once in each partition's order, string payloads, one-line
errors, and a log-to-log query killed with -9 in the middle of a batch and
restarted from its checkpoint (a Spark driver process of its own:
``tests.spark.sink_driver``)."""

from __future__ import annotations

import json

import pytest

from appliance.spark import observe_log_metrics, register
from tests.logservice.support import LogServers
from tests.spark.support import (
    BATCH,
    LAST_ENTRY_VISIBLE_S,
    QUERY_TIMEOUT_S,
    kill_in_a_batch_then_rerun,
    payloads_of,
)
from tests.support.launch import wait_for


@pytest.fixture(scope="module")
def app(appliance_factory, spark):
    register(spark)
    return appliance_factory(3)


@pytest.fixture(scope="module")
def service(app):
    servers = LogServers(app.cluster, app.client)
    try:
        servers.start("logserver-1")
        yield app
    finally:
        servers.kill_all()


def sink_write(df, app, name: str, mode: str = "append"):
    (df.write.format("bookkeeper").option("config", app.config).option("log", name)
     .mode(mode).save())


def test_without_the_log_service_one_line_says_to_start_it(spark, app):
    df = spark.range(3).selectExpr("CAST(CAST(id AS STRING) AS BINARY) AS payload")
    with pytest.raises(Exception, match=r"the log service is not running .*\[log\] servers "
                                        r"> 0") as info:
        sink_write(df, app, "nowhere")
    assert "Traceback" not in str(info.value)


def test_a_batch_write_stores_every_row_once_in_each_partitions_order(spark, service):
    app = service
    n = 3000
    df = spark.range(0, n, 1, 3).selectExpr("CAST(CONCAT('row ', id) AS BINARY) AS payload")
    sink_write(df, app, "batch-out")
    got = payloads_of(app, "batch-out")
    assert sorted(got) == sorted(b"row %d" % i for i in range(n))
    for part in range(3):  # range(0, n, 1, 3): partition p holds [p * n/3, (p + 1) * n/3)
        lo, hi = part * n // 3, (part + 1) * n // 3
        ids = [int(p.split()[1]) for p in got if lo <= int(p.split()[1]) < hi]
        assert ids == list(range(lo, hi))

    strings = spark.createDataFrame([("héllo",), ("wörld",)], "payload string")
    sink_write(strings, app, "strings")
    assert sorted(payloads_of(app, "strings")) == ["héllo".encode(), "wörld".encode()]


@pytest.mark.parametrize("columns, message", [
    ("id, CAST(CAST(id AS STRING) AS BINARY) AS payload",
     r"one column, payload .* got columns \['id', 'payload'\]: map them to one, e\.g\. "
     r".*to_json"),
    ("id AS payload", r"column payload must be binary or string, got bigint"),
])
def test_other_columns_are_one_line_naming_them(spark, service, columns, message):
    df = spark.range(3).selectExpr(*[c.strip() for c in columns.split(", ")])
    with pytest.raises(Exception, match=message) as info:
        sink_write(df, service, "bad")
    assert "Traceback" not in str(info.value)
    assert payloads_of(service, "bad") == []


def test_a_null_payload_fails_the_task_naming_the_row(spark, service):
    df = spark.createDataFrame([(b"a",), (b"b",), (None,)], "payload binary").coalesce(1)
    with pytest.raises(Exception, match="row 2 of this partition has a null payload"):
        sink_write(df, service, "nulls")


def test_overwrite_is_refused(spark, service):
    df = spark.range(1).selectExpr("CAST(CAST(id AS STRING) AS BINARY) AS payload")
    with pytest.raises(Exception, match=r"only appended to: use mode\(\"append\"\)"):
        sink_write(df, service, "bad", mode="overwrite")


def test_a_log_to_log_query_killed_in_a_batch_stores_every_row_once(service, tmp_path):
    kill_in_a_batch_then_rerun(service, tmp_path / "checkpoint")
    got = payloads_of(service, "target")
    assert sorted(got) == sorted(b"copied record %d" % i for i in range(3 * BATCH))


def test_a_micro_batch_numbers_its_rows_the_same_in_every_attempt(service):
    from appliance.protocol.logs import DLSN
    from appliance.spark.sink import producer_id
    from appliance.spark.sink_seq import batch_done, batch_start

    store, pid = service.client.logs.store, producer_id("stream", "a-query", 0)
    at = DLSN(3, 7, 0)
    assert batch_start(store, pid, 0, lambda: at) == (1, at, False)
    # a retry, a replay: the same numbers, and where the first attempt's rows can be
    assert batch_start(store, pid, 0, lambda: DLSN(9, 9, 9)) == (1, at, True)
    batch_done(store, pid, 0, 1, 10)
    assert batch_start(store, pid, 0) == (1, at, True)
    assert batch_start(store, pid, 1).first == 11  # the next batch follows without a gap
    batch_done(store, pid, 1, 11, 5)
    assert batch_start(store, pid, 3).first == 16  # the partition had no rows in batch 2
    with pytest.raises(ValueError, match="already wrote micro-batch 3 and now runs batch 2"):
        batch_start(store, pid, 2)


def test_a_replayed_batch_finds_the_rows_an_earlier_attempt_stored(service):
    """What a later attempt of a micro-batch skips: the producer's rows of the
    batch the log holds from the recorded position on, among other
    producers' rows, and none of an earlier batch's."""
    from appliance.spark.sink import producer_id
    from appliance.spark.sink_scan import log_end, stored_rows

    client, name = service.client, "scanned"
    pid, other = producer_id("stream", "q", 0), producer_id("stream", "q", 1)
    mine, theirs = client.log(name).producer(pid, resume=False), \
        client.log(name).producer(other, resume=False)
    try:
        for seq in (1, 2, 3):  # an earlier batch: rows 1..3
            mine.write(b"old %d" % seq, seq)
        since = log_end(client, name)
        for seq in (4, 5, 6, 7):  # this batch: rows 4.. (the attempt wrote 4 of them)
            mine.write(b"new %d" % seq, seq)
            theirs.write(b"other %d" % seq, seq)
    finally:
        mine.close()
        theirs.close()
    # the last entry is readable once its LAC is published (the owner then knows the rows)
    assert wait_for(lambda: stored_rows(client, name, pid, 4, since) == 4,
                    LAST_ENTRY_VISIBLE_S * 10, 0.1, what="rows 4..7 found")
    assert stored_rows(client, name, other, 8, since) == 0
    assert stored_rows(client, name, pid, 8, log_end(client, name)) == 0


def test_the_worked_pipeline_of_the_docs(spark, service, tmp_path):
    """docs/SPARK.md, "A pipeline": orders -> per-minute totals per customer
    (a streaming aggregation with a watermark) -> the totals log -> Parquet."""
    from pyspark.sql.functions import col, count, from_json, window
    from pyspark.sql.functions import sum as sum_

    app, config, where = service, service.config, tmp_path
    orders_in = [(f"c{i % 3}", i, i * 3) for i in range(60)]  # 3 minutes of orders
    with app.client.log("orders").producer() as p:
        for customer, amount, second in orders_in + [("late", 0, 600)]:  # moves the watermark
            p.write(b'{"customer": "%s", "amount": %d, "ts": "2026-01-01T00:%02d:%02d"}'
                    % (customer.encode(), amount, second // 60, second % 60))

    orders = (spark.readStream.format("bookkeeper").option("config", config)
              .option("log", "orders").option("maxRecordsPerTrigger", "25").load())
    per_minute = (orders
                  .select(from_json(col("payload").cast("string"),
                                    "customer string, amount long, ts timestamp").alias("o"))
                  .select("o.*")
                  .withWatermark("ts", "30 seconds")
                  .groupBy(window("ts", "1 minute"), "customer")
                  .agg(sum_("amount").alias("total"), count("*").alias("orders")))
    to_log = (observe_log_metrics(per_minute.selectExpr("to_json(struct(*)) AS payload"))
              .writeStream.format("bookkeeper")
              .option("config", config).option("log", "totals")
              .option("checkpointLocation", str(where / "chk-totals"))
              .trigger(availableNow=True).start())
    assert to_log.awaitTermination(QUERY_TIMEOUT_S) and to_log.exception() is None
    sent = [json.loads(p.json).get("observedMetrics", {}).get("bookkeeper")
            for p in to_log.recentProgress]
    stored = payloads_of(app, "totals")  # the progress reports count what the log holds
    assert sum(m["records"] for m in sent if m) == len(stored) == 9
    assert sum(m["bytes"] for m in sent if m) == sum(map(len, stored))

    to_parquet = (spark.readStream.format("bookkeeper").option("config", config)
                  .option("log", "totals").load()
                  .select(from_json(col("payload").cast("string"),
                                    "window struct<start: timestamp, end: timestamp>, "
                                    "customer string, total long, orders long").alias("t"))
                  .select("t.window.start", "t.customer", "t.total", "t.orders")
                  .writeStream.format("parquet")
                  .option("checkpointLocation", str(where / "chk-parquet"))
                  .trigger(availableNow=True).start(str(where / "totals")))
    assert to_parquet.awaitTermination(QUERY_TIMEOUT_S) and to_parquet.exception() is None

    got = sorted((r.start.minute, r.customer, r.total, r.orders)
                 for r in spark.read.parquet(str(where / "totals")).collect())
    expected = sorted((m, c, sum(a for k, a, s in orders_in if k == c and s // 60 == m),
                       sum(1 for k, a, s in orders_in if k == c and s // 60 == m))
                      for m in range(3) for c in ("c0", "c1", "c2"))
    assert got == expected  # each closed minute once; the late order's minute is still open


@pytest.mark.parametrize("mode", ["update", "complete"])
def test_a_stream_appends_only(spark, service, tmp_path, mode):
    counts = (spark.readStream.format("rate").load().groupBy("value").count()
              .selectExpr("to_json(struct(*)) AS payload"))
    query = (counts.writeStream.format("bookkeeper").outputMode(mode)
             .option("config", service.config).option("log", "never")
             .option("checkpointLocation", str(tmp_path / mode)).start())
    try:
        with pytest.raises(Exception, match="not support|only appended to"):
            query.awaitTermination(QUERY_TIMEOUT_S)
    finally:
        query.stop()
    assert payloads_of(service, "never") == []
