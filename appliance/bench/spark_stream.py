"""Spark Structured Streaming over logs (``bkctl bench spark-stream``):
three parts, each measured in the same run, on a temporary appliance of 3
bookies (and its log server) or a running one.

* ``backlog``: one log of ``records`` records of ``size`` bytes (written
  once; on a running appliance a log of the same name is reused), read by
  ``spark.read.format("bookkeeper").option("log", NAME)`` into the ``noop``
  sink (after one untimed run) and then by a streaming query with
  ``trigger(availableNow=True)`` into ``noop`` (timed from ``start()`` to
  its end, so it includes starting the query and its checkpoint; Spark's
  own ``addBatch`` time is reported beside it).  rows/s of each, and
  stream / batch.
* ``latency``: a writer appends ``rate`` records/s (open loop) for
  ``duration_s`` seconds, each payload starting with its write time
  (``time.time()``, a little-endian double); a streaming query with
  ``trigger(processingTime="100 milliseconds")`` and a ``foreachBatch``
  function takes, per row, the time after it collected the batch minus the
  write time.  p50 / p99 over the rows written after the first
  ``warmup_s`` seconds (min(5, duration_s / 4)).
* ``sink``: the backlog's payloads written by ``df.write.format("bookkeeper")``
  into a new log (timed ``save()``), and by a log-to-log streaming query
  (``availableNow``) into a third log (timed from ``start()``); each target
  log's records are counted afterwards and must equal ``records``.

The 1-minute load average is taken after each part.  Target and latency
logs get a fresh name per run.
"""

from __future__ import annotations

import os
import struct
import time
import uuid

import numpy as np

import appliance
from appliance.bench.launcher import wait_for
from appliance.bench.spark_log import PASSWORD, _timed, log_bench

PARTS = ("backlog", "latency", "sink")
SEND_TIME = struct.Struct("<d")
TRIGGER = "100 milliseconds"
QUERY_TIMEOUT_S = 1800  # a backlog query of a million rows on a loaded machine
LAST_ENTRY_S = 3.0  # > client.explicit_lac_interval_ms (1 s), with room for a busy machine
COUNT_TIMEOUT_S = 60.0  # counting a target log: its last records may take a few LAC rounds
SERVERS_TIMEOUT_S = 60.0  # a temporary appliance's log server registers after its bookies
SEGMENTS = 5  # the temporary appliance cuts the backlog into about this many segments


def run_spark_stream_bench(config_path: str | None, records: int, size: int, rate: int,
                           duration_s: float, master: str, parts=PARTS,
                           workdir: str | None = None) -> dict:
    """Measure each part in order; returns one JSON-able document."""
    unknown = sorted(set(parts) - set(PARTS))
    if unknown or not parts:
        raise ValueError(f"parts: pick from {', '.join(PARTS)} (got {', '.join(unknown)})")
    name = f"bench-spark-stream-{size}b-{records}"
    token = uuid.uuid4().hex[:8]
    backlog = (name, size, records) if {"backlog", "sink"} & set(parts) else None
    # a short folder name: the log server's ipc:// socket lives under it
    with log_bench(config_path, workdir, "bkss", -(-records // SEGMENTS), master,
                   backlog) as (config, work, spark):
        if "sink" in parts:  # the sink writes through a log server
            with appliance.connect(config) as client:
                wait_for(client.log(name).service_running, SERVERS_TIMEOUT_S, 0.05,
                         "a log server (the sink writes through the log service)")
        doc = {"master": master, "log": name, "size": size, "records": records,
               "appliance": config_path or "temporary (3 bookies)"}
        q = _Queries(spark, config, work)
        if "backlog" in parts:
            doc["backlog"] = _backlog(q, name, records)
        if "latency" in parts:
            doc["latency"] = _latency(q, f"bench-spark-stream-latency-{token}", size, rate,
                                      duration_s)
        if "sink" in parts:
            doc["sink"] = _sink(q, name, records, token)
    return doc


class _Queries:
    """The session, the appliance's config and a checkpoint folder per query."""

    def __init__(self, spark, config: str, work: str):
        self.spark, self.config, self.work = spark, config, work

    def batch(self, log: str):
        return (self.spark.read.format("bookkeeper").option("config", self.config)
                .option("password", PASSWORD.decode()).option("log", log).load())

    def stream(self, log: str):
        return (self.spark.readStream.format("bookkeeper").option("config", self.config)
                .option("password", PASSWORD.decode()).option("log", log)
                .option("startingPosition", "earliest").load())

    def checkpoint(self, name: str) -> str:
        return os.path.join(self.work, "checkpoints", name)

    def run_available_now(self, writer, name: str) -> tuple[float, dict]:
        """Start ``writer`` (a DataStreamWriter) availableNow; (wall seconds
        from start() to its end, totals of its progress reports)."""
        start = time.perf_counter()
        query = (writer.option("checkpointLocation", self.checkpoint(name))
                 .trigger(availableNow=True).start())
        try:
            if not query.awaitTermination(QUERY_TIMEOUT_S):
                raise RuntimeError(f"the {name} query did not end in {QUERY_TIMEOUT_S} s")
            took = time.perf_counter() - start
            if query.exception() is not None:
                raise RuntimeError(f"the {name} query failed: {query.exception()}")
            progress = query.recentProgress
        finally:
            query.stop()
        return took, {"rows": sum(p["numInputRows"] for p in progress),
                      "batches": sum(1 for p in progress if p["numInputRows"]),
                      "add_batch_s": sum(p["durationMs"].get("addBatch", 0)
                                         for p in progress) / 1000}


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def _backlog(q: _Queries, name: str, records: int) -> dict:
    batch = _timed(q.batch(name), records, 1, {})
    took, prog = q.run_available_now(q.stream(name).writeStream.format("noop"), "backlog")
    if prog["rows"] != records:
        raise RuntimeError(f"the streaming query read {prog['rows']} rows, expected {records}")
    stream = {"s": round(took, 4), "rows_per_s": records / took, "batches": prog["batches"],
              "add_batch_s": prog["add_batch_s"],
              "add_batch_rows_per_s": records / max(prog["add_batch_s"], 1e-3)}
    return {"batch": {"s": batch["best_s"], "rows_per_s": batch["rows_per_s"]},
            "stream": stream, "stream_to_batch": stream["rows_per_s"] / batch["rows_per_s"],
            "load_avg_1m": _load()}


def _sink(q: _Queries, name: str, records: int, token: str) -> dict:
    batch_target = f"bench-spark-stream-sink-batch-{token}"
    stream_target = f"bench-spark-stream-sink-stream-{token}"
    start = time.perf_counter()
    (q.batch(name).select("payload").write.format("bookkeeper").option("config", q.config)
     .option("log", batch_target).mode("append").save())
    batch_s = time.perf_counter() - start
    writer = (q.stream(name).select("payload").writeStream.format("bookkeeper")
              .option("config", q.config).option("log", stream_target))
    stream_s, prog = q.run_available_now(writer, "sink")
    with appliance.connect(q.config) as client:
        counts = {t: _count(client, t, records) for t in (batch_target, stream_target)}
    for target, held in counts.items():
        if held != records:
            raise RuntimeError(f"log {target!r} holds {held} records, expected {records}")
    return {"batch": {"log": batch_target, "s": round(batch_s, 4),
                      "rows_per_s": records / batch_s, "records_in_log": counts[batch_target]},
            "stream": {"log": stream_target, "s": round(stream_s, 4),
                       "rows_per_s": records / stream_s, "add_batch_s": prog["add_batch_s"],
                       "records_in_log": counts[stream_target]},
            "load_avg_1m": _load()}


def _count(client, name: str, expected: int) -> int:
    """The log's records, read from its start by a log reader until a read
    of ``LAST_ENTRY_S`` brings none (the last entry of an open segment is
    visible once its writer's LAC reaches the bookies) and at least
    ``expected`` came or ``COUNT_TIMEOUT_S`` passed."""
    held = 0
    deadline = time.monotonic() + COUNT_TIMEOUT_S
    with client.log(name).reader() as reader:
        while True:
            got = len(reader.read(max_records=10_000, timeout_s=LAST_ENTRY_S))
            held += got
            if not got and (held >= expected or time.monotonic() > deadline):
                return held


def _latency(q: _Queries, name: str, size: int, rate: int, duration_s: float) -> dict:
    total = max(1, int(rate * duration_s))
    warmup_s = min(5.0, duration_s / 4)
    filler = os.urandom(max(0, size - SEND_TIME.size))
    seen: list[tuple[float, float]] = []  # (write time, seen time) per row

    def each_batch(df, _batch_id):
        rows = df.select("payload").collect()
        now = time.time()
        seen.extend((SEND_TIME.unpack_from(r.payload)[0], now) for r in rows)

    with appliance.connect(q.config) as client, client.log(name, PASSWORD).writer() as w:
        w.write(SEND_TIME.pack(time.time()) + filler)  # the log exists before the query
        query = (q.stream(name).writeStream.foreachBatch(each_batch)
                 .option("checkpointLocation", q.checkpoint("latency"))
                 .trigger(processingTime=TRIGGER).start())
        try:
            _wait_rows(query, seen, 1, 120)  # the query is up: it saw the first record
            start = _paced_writes(w, filler, rate, total)
            _wait_rows(query, seen, total + 1, 120 + duration_s * 4)
        finally:
            query.stop()
    lat = np.asarray([s - t for t, s in seen if t >= start + warmup_s]) * 1000
    if not lat.size:
        raise RuntimeError("no row was written after the warm-up: raise --duration-s")
    return {"log": name, "rate": rate, "duration_s": duration_s, "records": total,
            "trigger": TRIGGER, "warmup_s": warmup_s, "rows_measured": int(lat.size),
            "p50_ms": round(float(np.percentile(lat, 50)), 3),
            "p99_ms": round(float(np.percentile(lat, 99)), 3),
            "max_ms": round(float(lat.max()), 3), "load_avg_1m": _load()}


def _paced_writes(writer, filler: bytes, rate: int, total: int) -> float:
    """``total`` records at ``rate`` a second (open loop); the start time."""
    start = time.time()
    for i in range(total):
        pause = start + i / rate - time.time()
        if pause > 0:
            time.sleep(pause)  # pacing the writer, not waiting for a condition
        writer.write_async(SEND_TIME.pack(time.time()) + filler)
    writer.flush()
    return start


def _wait_rows(query, seen: list, rows: int, timeout_s: float) -> None:
    """Until the foreachBatch function saw ``rows`` rows (the query's error
    if it fails; an error after ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while len(seen) < rows:
        if query.awaitTermination(0.1):  # polls; returns at once if the query ended
            raise RuntimeError(f"the latency query ended: {query.exception()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the latency query saw {len(seen)} of {rows} rows in "
                               f"{timeout_s:g} s")
