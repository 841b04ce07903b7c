"""Structured Streaming from a log (``spark.readStream.format("bookkeeper")``)
in local[2] against a real appliance: batches cut by maxRecordsPerTrigger,
every starting position, truncation under a running query, and a driver
killed with -9 and restarted from its checkpoint (a Spark driver process of
its own: ``tests.spark.stream_driver``)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from appliance.spark import observe_log_metrics, register
from tests.spark.conftest import PASSWORD

SEGMENT_RECORDS = 700  # a few segments per log
QUERY_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def app(appliance_factory, spark):
    register(spark)
    app = appliance_factory(3)
    app.client.log_config = dataclasses.replace(app.client.log_config,
                                                segment_records_max=SEGMENT_RECORDS)
    return app


def write(app, name: str, count: int, first: int = 0, close: bool = True, writer=None):
    """``count`` records (txid 10 * i, flushed every 25: entries of many
    records); returns [(dlsn, txid, payload)] and the writer if kept open."""
    writer = writer or app.client.log(name, PASSWORD).writer()
    futures = []
    for i in range(first, first + count):
        futures.append((writer.write_async(b"record %d" % i, 10 * (i + 1)), i))
        if i % 25 == 24:
            writer.flush()
    writer.flush()
    rows = [(str(f.result(timeout=60)), 10 * (i + 1), b"record %d" % i) for f, i in futures]
    if close:
        writer.close()
        return rows, None
    return rows, writer


def stream(spark, app, name: str, **options):
    reader = (spark.readStream.format("bookkeeper").option("config", app.config)
              .option("password", PASSWORD.decode()).option("log", name))
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()


def rows_of(df) -> list[tuple[str, int, bytes]]:
    return sorted(((r.dlsn, r.txid, bytes(r.payload)) for r in df.collect()),
                  key=lambda row: row[1])


def run_available_now(spark, df, name: str, tmp_path: Path):
    """Everything there now into a memory table: (rows, input rows per batch)."""
    query = (df.writeStream.format("memory").queryName(name)
             .option("checkpointLocation", str(tmp_path / name))
             .trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(QUERY_TIMEOUT_S)
        assert query.exception() is None
        sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
        return rows_of(spark.table(name)), sizes, query.recentProgress
    finally:
        query.stop()


def test_a_log_streams_in_batches_of_max_records_from_every_starting_position(
        spark, app, tmp_path):
    written, _ = write(app, "positions", 2000)
    got, sizes, progress = run_available_now(
        spark, observe_log_metrics(stream(spark, app, "positions", maxRecordsPerTrigger=400)),
        "earliest", tmp_path)
    assert got == written
    assert sizes == [400] * 5
    reported = [json.loads(p.json)["observedMetrics"]["bookkeeper"] for p in progress
                if p["numInputRows"]]  # what a user reads in lastProgress: records and bytes
    assert reported == [{"records": 400, "bytes": sum(len(r[2]) for r in written[i:i + 400])}
                        for i in range(0, 2000, 400)]
    offsets = [json.loads(p["sources"][0]["endOffset"]) for p in progress if p["numInputRows"]]
    assert offsets[-1] == {"log": "positions", "dlsn": str(_next(written[-1][0]))}
    assert offsets[0]["dlsn"] == str(_next(written[399][0]))  # a batch ends at a record
    behind = [json.loads(p["sources"][0]["latestOffset"]) for p in progress
              if p["numInputRows"]]
    assert [b["recordsBehind"] for b in behind] == [1600, 1200, 800, 400, 0]  # the lag
    assert {b["dlsn"] for b in behind} == {offsets[-1]["dlsn"]}  # the log's end

    from_dlsn, sizes, _ = run_available_now(
        spark, stream(spark, app, "positions", startingPosition=written[1234][0],
                      maxBytesPerTrigger=4000), "from_dlsn", tmp_path)
    assert from_dlsn == written[1234:]
    assert len(sizes) > 1 and max(sizes) <= 4000 // len(b"record 1234") + 25

    from_txid, _, _ = run_available_now(
        spark, stream(spark, app, "positions", startingPosition="txid:15005"), "from_txid",
        tmp_path)
    assert from_txid == written[1500:]  # 15005 is no txid: from the next one, 15010

    query = (stream(spark, app, "positions", startingPosition="latest").writeStream
             .format("memory").queryName("latest")
             .option("checkpointLocation", str(tmp_path / "latest")).start())
    try:
        query.processAllAvailable()
        more, _ = write(app, "positions", 30, first=2000)
        deadline = time.monotonic() + QUERY_TIMEOUT_S
        while len(spark.table("latest").collect()) < 30 and time.monotonic() < deadline:
            query.processAllAvailable()
        assert rows_of(spark.table("latest")) == more
    finally:
        query.stop()

    no_log = (spark.readStream.format("bookkeeper").option("config", app.config).load()
              .writeStream.format("memory").queryName("no_log").start())
    with pytest.raises(Exception, match="a streaming read follows a log: set option log"):
        no_log.awaitTermination(QUERY_TIMEOUT_S)
    no_log.stop()
    for bad, message in (("startingPosition", "3/x"), ("maxRecordsPerTrigger", "0"),
                         ("failOnDataLoss", "maybe")):
        with pytest.raises(Exception, match=bad):
            run_available_now(spark, stream(spark, app, "positions", **{bad: message}),
                              f"bad_{bad}", tmp_path)


def _next(dlsn: str) -> str:
    seq, entry, slot = dlsn.split("/")
    return f"{seq}/{entry}/{int(slot) + 1}"


@pytest.mark.parametrize("fail_on_data_loss", ["true", "false"])
def test_a_truncation_under_a_running_query(spark, app, tmp_path, fail_on_data_loss):
    name = f"truncated-{fail_on_data_loss}"
    written, _ = write(app, name, 2500)
    log = app.client.log(name, PASSWORD)
    point = log.metadata().live_segments[2].seq  # segments 1 and 2 go after batch 0
    batches = []

    def each_batch(df, batch_id):
        batches.append(rows_of(df))
        if batch_id == 0:
            log.truncate(f"{point}/0/0")

    query = (stream(spark, app, name, maxRecordsPerTrigger=300,
                    failOnDataLoss=fail_on_data_loss)
             .writeStream.foreachBatch(each_batch)
             .option("checkpointLocation", str(tmp_path / name))
             .trigger(availableNow=True).start())
    error = None
    try:
        assert query.awaitTermination(QUERY_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - Spark's StreamingQueryException
        error = exc
    finally:
        query.stop()
    first_lost = _next(written[299][0])
    if fail_on_data_loss == "true":
        assert error is not None
        message = str(error)
        assert f"records from {first_lost} to {point}/0/0" in message
        assert "Traceback" not in message.split("records from")[0][-200:]
        assert batches == [written[:300]]
    else:
        assert error is None
        got = [row for batch in batches for row in batch]
        kept = [row for row in written if int(row[0].split("/")[0]) >= point]
        assert got == written[:300] + kept


def test_a_killed_driver_resumes_from_its_checkpoint_every_record_once(spark, app, tmp_path):
    written, writer = write(app, "killed", 5000, close=False)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    driver = _driver(app, "killed", out, checkpoint, until=10**9)
    try:
        deadline = time.monotonic() + QUERY_TIMEOUT_S
        while _commits(checkpoint) < 2 and driver.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.2)  # polling the checkpoint's files, with a deadline
        assert driver.poll() is None and _commits(checkpoint) >= 2, _stderr(driver)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    assert _commits(checkpoint) < 13  # killed in the middle of the backlog

    more: list = []
    thread = threading.Thread(target=lambda: more.extend(
        write(app, "killed", 1000, first=5000, writer=writer)[0]))
    driver = _driver(app, "killed", out, checkpoint, until=6000)
    try:
        thread.start()
        thread.join(QUERY_TIMEOUT_S)
        assert driver.wait(QUERY_TIMEOUT_S) == 0, _stderr(driver)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    got = rows_of(spark.read.parquet(str(out)))
    assert len(more) == 1000 and got == written + more


def _driver(app, log: str, out: Path, checkpoint: Path, until: int) -> subprocess.Popen:
    root = Path(__file__).resolve().parents[2]
    with open(checkpoint.parent / "driver.err", "ab") as err:  # a file: a pipe could fill
        driver = subprocess.Popen(
            [sys.executable, "-m", "tests.spark.stream_driver", app.config, log,
             PASSWORD.decode(), str(out), str(checkpoint), str(until)],
            cwd=root, start_new_session=True, stdout=subprocess.DEVNULL, stderr=err)
    driver.err_path = checkpoint.parent / "driver.err"
    return driver


def _commits(checkpoint: Path) -> int:
    commits = checkpoint / "commits"
    return sum(1 for p in commits.iterdir() if p.name.isdigit()) if commits.exists() else 0


def _stderr(driver: subprocess.Popen) -> str:
    if driver.poll() is None:
        return "driver still running"
    return driver.err_path.read_bytes().decode(errors="replace")[-3000:]
