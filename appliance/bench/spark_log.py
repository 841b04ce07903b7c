"""Spark batch over a log, hot and cold (``bkctl bench spark-log``): rows/s
of ``spark.read.format("bookkeeper").option("log", NAME)`` and of
``appliance.spark.read_log`` (cold segments read by Spark's own Parquet
reader) over a log on the bookies and over the same-shaped log moved to
cold storage, next to ``spark.read.parquet`` of the cold files themselves.

How it measures: a log of ``records`` records of ``size`` bytes per tier
(written once with ``write_many_async``, 1,000 records a call; on a running
appliance logs of the same names are reused), sealed into segments of
``records / segments`` records on the temporary appliance; the cold tier's
log has every sealed segment moved (``offloader``) before anything is
timed.  Each query

    <DataFrame>.write.format("noop").mode("overwrite").save()

plans, reads and materialises every row (all three columns).  After one
untimed run of each, the queries of every tier run in turn, ``repeat``
rounds (hot, cold, hot, cold, ...: both tiers see the same load), each
timed on the wall clock from the driver, the load average (1 min) taken
after each run; a figure is the best run, and the ratios come from this one
run.  ``read_log_call_s``: the ``read_log`` call itself, first with no
file verified yet (it reads each cold file once for its checksum) and then
again (verified files are remembered).  ``source`` in the document is the
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
from appliance.spark import read_log, register
from appliance.spark.native import forget_verified_files

PASSWORD = b"bench"
WRITE_BATCH = 1000
TIERS = ("hot", "cold")


def log_name(size: int, records: int, tier: str = "cold") -> str:
    """The bench log of a tier (the hot one's name ends in ``-hot``)."""
    return f"bench-spark-log-{size}b-{records}" + ("-hot" if tier == "hot" else "")


def run_spark_log_bench(config_path: str | None, size: int, records: int, segments: int,
                        repeat: int, master: str, tiers=TIERS,
                        workdir: str | None = None) -> dict:
    """Measure each tier, in alternation; returns one JSON-able document."""
    unknown = sorted(set(tiers) - set(TIERS))
    if unknown or not tiers:
        raise ValueError(f"tiers: pick from {', '.join(TIERS)} (got {', '.join(unknown)})")
    tiers = [t for t in TIERS if t in tiers]
    names = {tier: log_name(size, records, tier) for tier in tiers}
    with log_bench(config_path, workdir, "bksparklog", -(-records // segments),
                   master) as (config, _work, spark):
        segs = _prepare_logs(config, names, size, records)
        doc = {"master": master, "log": names[tiers[-1]], "logs": names, "size": size,
               "records": records, "appliance": config_path or "temporary (3 bookies)",
               "source": _sources(spark)}
        doc.update(_measure(spark, config, names, segs, records, repeat))
    if "hot" in doc and "cold" in doc:
        hot = doc["hot"]["bookkeeper"]["rows_per_s"]
        doc["cold_to_hot"] = doc["cold"]["bookkeeper"]["rows_per_s"] / hot
        doc["cold_native_to_hot"] = doc["cold"]["read_log"]["rows_per_s"] / hot
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


def _prepare_logs(config: str, names: dict[str, str], size: int, records: int) -> dict:
    """Each tier's log written; the cold one's sealed segments moved.  Returns
    tier -> the log's live segments."""
    out = {}
    with appliance.connect(config) as client:
        for tier, name in names.items():
            _ensure_log(client, name, size, records)
            log = client.log(name, PASSWORD)
            segs = log.metadata().live_segments
            if tier == "hot" and any(s.tier == COLD for s in segs):
                raise ValueError(f"log {name!r} is already (partly) cold: delete it to measure "
                                 "hot again")
            if tier == "cold":
                from appliance.cold.mover import offloader  # on use: only the cold run needs it
                offloader(client, PASSWORD).offload(name)
                segs = log.metadata().live_segments
                if any(s.tier != COLD for s in segs):
                    raise RuntimeError(f"log {name!r}: not every segment moved to cold storage")
            out[tier] = segs
    return out


def _measure(spark, config: str, names: dict[str, str], segs: dict, records: int,
             repeat: int) -> dict:
    """Every tier's queries, timed in alternation."""
    frames, doc = {}, {}
    for tier, name in names.items():
        source = (spark.read.format("bookkeeper").option("config", config).option("log", name)
                  .option("password", PASSWORD.decode()).load())
        forget_verified_files()
        calls = []
        for _ in range(2):  # the first verifies every cold file, the second remembers them
            start = time.perf_counter()
            native = read_log(spark, name, config=config, password=PASSWORD.decode())
            calls.append(round(time.perf_counter() - start, 4))
        frames[(tier, "bookkeeper")], frames[(tier, "read_log")] = source, native
        if tier == "cold":
            frames[(tier, "parquet_direct")] = spark.read.parquet(
                *[s.cold.uri for s in segs[tier]]).select("dlsn", "txid", "payload")
        for key in ("bookkeeper", "read_log"):
            counted = frames[(tier, key)].count()
            if counted != records:
                raise RuntimeError(f"{key} read {counted} records of log {name!r}, expected "
                                   f"{records}")
        doc[tier] = {"segments": len(segs[tier]), "partitions": source.rdd.getNumPartitions(),
                     "read_log_partitions": native.rdd.getNumPartitions(),
                     "read_log_call_s": {"first": calls[0], "cached": calls[1]}}
    for (tier, key), m in _alternating(frames, records, repeat, bookie_pids(config)).items():
        doc[tier][key] = m
    return doc


def _alternating(frames: dict, rows: int, repeat: int, bookies: dict[str, int]) -> dict:
    """Each frame run once untimed (the JVM's first noop write of a query
    costs more), then ``repeat`` rounds of one timed run of each, in turn."""
    for frame in frames.values():
        _noop(frame)
    times = {key: [] for key in frames}
    loads = {key: [] for key in frames}
    cpu = {key: {} for key in frames}
    for _ in range(repeat):
        for key, frame in frames.items():
            before = cpu_by_role(bookies)
            times[key].append(_noop(frame))
            after = cpu_by_role(bookies)
            loads[key].append(round(os.getloadavg()[0], 2))
            for role in after:
                cpu[key][role] = cpu[key].get(role, 0.0) + after[role] - before[role]
    out = {}
    for key in frames:
        best = min(times[key])
        out[key] = {"runs_s": [round(t, 4) for t in times[key]], "best_s": round(best, 4),
                    "rows_per_s": rows / best, "load_avg_1m": loads[key],
                    "cpu_us_per_row": {role: used * 1e6 / (rows * repeat)
                                       for role, used in cpu[key].items()}}
    return out


def _timed(frame, rows: int, repeat: int, bookies: dict[str, int]) -> dict:
    """One query alone (``bkctl bench spark-stream``'s batch read)."""
    return _alternating({"query": frame}, rows, repeat, bookies)["query"]


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

