"""Spark batch over a log, hot and then cold (``bkctl bench spark-log``):
rows/s of ``spark.read.format("bookkeeper").option("log", NAME)`` over the
same log while its segments are on the bookies and after they moved to
cold storage, next to ``spark.read.parquet`` of the cold files themselves.

How it measures: one log of ``records`` records of ``size`` bytes (written
once with ``write_many_async``, 1,000 records a call; on a running
appliance a log of the same name is reused), sealed into segments of
``records / segments`` records on the temporary appliance.  Per tier, after
one untimed run, ``repeat`` times

    spark.read.format("bookkeeper").option("log", NAME).load()
         .write.format("noop").mode("overwrite").save()

which plans, reads and materialises every row (all three columns), timed on
the wall clock from the driver; the load average (1 min) is taken after
each run.  ``cold`` first moves every sealed segment (``offloader``), then
measures the source and Spark's own Parquet reader on the files
(``parquet_direct``: no verification, the ceiling).  ``tiers`` picks
``hot``, ``cold`` or both (in that order: the same log, first hot); a
log already cold cannot be measured hot.  ``source`` in the document is the
``appliance`` package the driver and the Python workers imported (to tell
trees apart when comparing code).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import appliance
from appliance.bench.launcher import bookie_pids, temporary_appliance
from appliance.bench.spark import _session, cpu_by_role
from appliance.errors import NoSuchLogError
from appliance.protocol.logs import COLD
from appliance.spark import register

PASSWORD = b"bench"
WRITE_BATCH = 1000
TIERS = ("hot", "cold")


def log_name(size: int, records: int) -> str:
    return f"bench-spark-log-{size}b-{records}"


def run_spark_log_bench(config_path: str | None, size: int, records: int, segments: int,
                        repeat: int, master: str, tiers=TIERS,
                        workdir: str | None = None) -> dict:
    """Measure each tier in order; returns one JSON-able document."""
    unknown = sorted(set(tiers) - set(TIERS))
    if unknown or not tiers:
        raise ValueError(f"tiers: pick from {', '.join(TIERS)} (got {', '.join(unknown)})")
    name = log_name(size, records)
    with log_bench(config_path, workdir, "bksparklog", -(-records // segments), master,
                   (name, size, records)) as (config, _work, spark):
        doc = {"master": master, "log": name, "size": size, "records": records,
               "appliance": config_path or "temporary (3 bookies)", "source": _sources(spark)}
        for tier in (t for t in TIERS if t in tiers):
            doc[tier] = _measure_tier(spark, config, name, tier, records, repeat)
    if "hot" in doc and "cold" in doc:
        doc["cold_to_hot"] = (doc["cold"]["bookkeeper"]["rows_per_s"]
                              / doc["hot"]["bookkeeper"]["rows_per_s"])
    return doc


@contextmanager
def log_bench(config_path: str | None, workdir: str | None, prefix: str, segment_records: int,
              master: str, log: tuple[str, int, int] | None = None):
    """What the log benches share: a work folder (removed at exit), the
    appliance (``_appliance``), the bench log ``log`` = (name, size, records)
    written once when given, then a Spark session with the bookkeeper source
    (stopped at exit when this made it).  Yields (config, work, spark)."""
    work = tempfile.mkdtemp(prefix=prefix, dir=workdir)
    try:
        with _appliance(config_path, work, segment_records) as config:
            if log is not None:
                with appliance.connect(config) as client:
                    _ensure_log(client, *log)
            spark, owned = _session(master)
            try:
                register(spark)
                yield config, work, spark
            finally:
                if owned:
                    spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _measure_tier(spark, config: str, name: str, tier: str, records: int,
                  repeat: int) -> dict:
    with appliance.connect(config) as client:
        log = client.log(name, PASSWORD)
        segs = log.metadata().live_segments
        if tier == "hot" and any(s.tier == COLD for s in segs):
            raise ValueError(f"log {name!r} is already (partly) cold: measure hot on a new log")
        if tier == "cold":
            from appliance.cold.mover import offloader  # on use: only the cold run needs it
            offloader(client, PASSWORD).offload(name)
            segs = log.metadata().live_segments
            if any(s.tier != COLD for s in segs):
                raise RuntimeError(f"log {name!r}: not every segment moved to cold storage")
    df = (spark.read.format("bookkeeper").option("config", config).option("log", name)
          .option("password", PASSWORD.decode()).load())
    counted = df.count()
    if counted != records:
        raise RuntimeError(f"the bookkeeper source read {counted} records, expected {records}")
    out = {"segments": len(segs), "partitions": df.rdd.getNumPartitions(),
           "bookkeeper": _timed(df, records, repeat, bookie_pids(config))}
    if tier == "cold":
        direct = spark.read.parquet(*[s.cold.uri for s in segs]).select("dlsn", "txid",
                                                                         "payload")
        out["parquet_direct"] = _timed(direct, records, repeat, {})
    return out


def _timed(frame, rows: int, repeat: int, bookies: dict[str, int]) -> dict:
    _noop(frame)  # untimed: the JVM's first noop write of a query costs more
    cpu_before = cpu_by_role(bookies)
    times, loads = [], []
    for _ in range(repeat):
        times.append(_noop(frame))
        loads.append(round(os.getloadavg()[0], 2))
    cpu_after = cpu_by_role(bookies)
    best = min(times)
    return {"runs_s": [round(t, 4) for t in times], "best_s": round(best, 4),
            "rows_per_s": rows / best, "load_avg_1m": loads,
            "cpu_us_per_row": {role: (cpu_after[role] - cpu_before[role]) * 1e6 /
                               (rows * repeat) for role in cpu_after}}


def _noop(frame) -> float:
    start = time.perf_counter()
    frame.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - start


def _sources(spark) -> dict:
    """Where the driver and a Python worker import ``appliance`` from."""
    def worker_file(_):
        import appliance as imported  # in the worker: its own import path
        return [imported.__file__]
    workers = spark.sparkContext.parallelize([0], 1).mapPartitions(worker_file).collect()
    return {"driver": appliance.__file__, "worker": workers[0]}


def _ensure_log(client, name: str, size: int, records: int) -> None:
    """The bench log, written once (reused when it holds ``records`` records)."""
    log = client.log(name, PASSWORD)
    try:
        held = sum(s.records for s in log.metadata().live_segments)
    except NoSuchLogError:
        held = 0
    if held == records:
        return
    if held:
        raise ValueError(f"log {name!r} holds {held} records, not {records}: delete it first")
    pool = os.urandom(size * 1024 + size)
    with log.writer() as writer:
        for start in range(0, records, WRITE_BATCH):
            n = min(WRITE_BATCH, records - start)
            payloads = [pool[(i % 1024) * size:(i % 1024) * size + size]
                        for i in range(start, start + n)]
            futures = writer.write_many_async(payloads)
            if start // WRITE_BATCH % 50 == 49:
                futures[-1].result(timeout=600)
        writer.flush()


@contextmanager
def _appliance(config_path: str | None, work: str, segment_records: int):
    """The given appliance's config, or a temporary one (stopped at exit) of
    three bookies, segments of ``segment_records`` records and a cold tier
    under its folder."""
    if config_path is not None:
        yield str(Path(config_path).resolve())
        return
    with temporary_appliance(3, work, prefix="a",
                             log={"segment_records_max": segment_records},
                             cold_storage={"uri": "cold"}) as (config, _root):
        yield str(config)

