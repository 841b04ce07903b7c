"""Spark ingest benchmark (``bkctl bench spark``): rows/s and MB/s of the
``bookkeeper`` source, next to ``spark.read.parquet`` of the same rows and
to an in-memory Python data source of the same shape, all in one run.

How it measures, per entry size: ``ledgers`` CLOSED ledgers of ``entries``
entries each (written once; on a running appliance, earlier bench ledgers
of the same shape are reused, tagged in their custom metadata), then
``repeat`` times each query

    spark.read.format(...).load().write.format("noop").mode("overwrite").save()

which plans, reads and materialises every row (all three columns), timed
on the wall clock from the driver, after one untimed run of the same query
(a query's first noop write costs the JVM more; CPU per row is averaged
over the timed runs).  ``read_batch_entries``: the entries per
read request of the temporary appliance (its ``server.batch_entries_max``
and ``client.read_batch_entries_max``; the document reports the value
used).  Parquet: the same rows, written once by Spark to a temp dir
(snappy).  Memory: ``MemoryArrowSource`` yields pre-built Arrow batches of
the same schema and sizes, built as the bookkeeper source builds its own
(like with like), the ceiling of any Python data source in this Spark;
``ratio_to_memory_source`` compares with it.  MB are 10**6 payload bytes.
The temporary appliance (without ``--config``) runs its own supervisor and 3
bookies under a temp dir, and is stopped at the end, also on failure.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

import appliance
from appliance.bench.launcher import bookie_pids, temporary_appliance
from appliance.config import load_config
from appliance.spark import register
from appliance.spark.source import ARROW_SCHEMA, SCHEMA_DDL, int64_array

BENCH_TAG = "bkctl-bench-spark"
PASSWORD = b"bench"
WRITE_WINDOW = 800  # adds in flight per ledger while loading (below inflight_adds_max)


def run_spark_bench(config_path: str | None, sizes: list[int], entries: int, ledgers: int,
                    repeat: int, master: str, workdir: str | None = None,
                    read_batch_entries: int | None = None) -> dict:
    """Measure every size; returns one JSON-able document (see module doc).
    ``read_batch_entries``: the temporary appliance's entries per read
    request (``server.batch_entries_max`` and ``client.read_batch_entries_max``;
    None: their defaults); not with ``config_path``."""
    if config_path is not None and read_batch_entries is not None:
        raise ValueError("read_batch_entries sets up the temporary appliance; with a config, "
                         "set server.batch_entries_max and client.read_batch_entries_max there")
    work = tempfile.mkdtemp(prefix="bkspark", dir=workdir)
    try:
        with _appliance(config_path, work, read_batch_entries) as config:
            batch = load_config(config).client.read_batch_entries_max
            spark, owned = _session(master)
            try:
                register(spark)
                spark.dataSource.register(MemoryArrowSource)
                runs = [_measure_size(spark, config, size, entries, ledgers, repeat, work)
                        for size in sizes]
            finally:
                if owned:
                    spark.stop()
        return {"master": master, "entries_per_ledger": entries, "ledgers": ledgers,
                "repeat": repeat, "appliance": config_path or "temporary (3 bookies)",
                "read_batch_entries": batch,
                "sizes": runs}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _measure_size(spark, config: str, size: int, entries: int, n_ledgers: int, repeat: int,
                  work: str) -> dict:
    with appliance.connect(config) as client:
        ids = _bench_ledgers(client, size, entries, n_ledgers)
    rows = entries * n_ledgers
    df = (spark.read.format("bookkeeper").option("config", config)
          .option("ledgers", ",".join(map(str, ids))).option("password", PASSWORD.decode())
          .load())
    counted = df.count()
    if counted != rows:
        raise RuntimeError(f"the bookkeeper source read {counted} rows, expected {rows}")
    payload_bytes = int(df.selectExpr("sum(length(payload))").collect()[0][0])
    parquet = os.path.join(work, f"rows-{size}.parquet")
    df.write.mode("overwrite").parquet(parquet)
    memory = (spark.read.format(MemoryArrowSource.name()).option("rows", str(rows))
              .option("size", str(size)).option("partitions", str(df.rdd.getNumPartitions()))
              .load())
    out = {"size": size, "rows": rows, "payload_mb": payload_bytes / 1e6, "ledgers": ids,
           "partitions": df.rdd.getNumPartitions()}
    bookies = bookie_pids(config)
    for name, frame in (("bookkeeper", df), ("parquet", spark.read.parquet(parquet)),
                        ("python_memory_source", memory)):
        _time_noop(frame)  # untimed: the JVM's first noop write of a source costs more
        cpu_before = cpu_by_role(bookies)
        times = [_time_noop(frame) for _ in range(repeat)]
        cpu_after = cpu_by_role(bookies)
        best = min(times)
        out[name] = {"runs_s": [round(t, 4) for t in times], "best_s": round(best, 4),
                     "rows_per_s": rows / best, "mb_per_s": payload_bytes / 1e6 / best,
                     "cpu_us_per_row": {role: (cpu_after[role] - cpu_before[role]) * 1e6 /
                                        (rows * repeat) for role in cpu_after}}
    out["ratio_to_parquet"] = out["bookkeeper"]["rows_per_s"] / out["parquet"]["rows_per_s"]
    out["ratio_to_memory_source"] = (out["bookkeeper"]["rows_per_s"]
                                     / out["python_memory_source"]["rows_per_s"])
    return out


def cpu_by_role(bookie_pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds used so far by the bookies, the Spark JVM (this process's
    java child) and the Python workers (the JVM's descendants, with workers
    that already exited: their parent's reaped-children times)."""
    import psutil

    def own(proc) -> float:
        t = proc.cpu_times()
        return t.user + t.system

    out = {"bookies": 0.0, "spark_jvm": 0.0, "python_workers": 0.0}
    for pid in bookie_pids.values():
        try:
            out["bookies"] += own(psutil.Process(pid))
        except psutil.Error:
            continue
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.name() != "java":
                continue
            out["spark_jvm"] += own(proc)
            for worker in proc.children(recursive=True):
                t = worker.cpu_times()
                out["python_workers"] += t.user + t.system + t.children_user + \
                    t.children_system
        except psutil.Error:
            continue
    return out


def _time_noop(frame) -> float:
    start = time.perf_counter()
    frame.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - start


def _bench_ledgers(client, size: int, entries: int, n_ledgers: int) -> list[int]:
    """Closed bench ledgers of this shape: reused when present, else written."""
    tag = f"size={size},entries={entries}"
    found = []
    for ledger_id in client.list_ledgers():
        md = client.ledger_metadata(ledger_id)
        if md.state == "CLOSED" and dict(md.custom).get(BENCH_TAG) == tag:
            found.append(ledger_id)
    if len(found) >= n_ledgers:
        return found[:n_ledgers]
    return found + _write_ledgers(client, size, entries, n_ledgers - len(found), tag)


def _write_ledgers(client, size: int, entries: int, n_ledgers: int, tag: str) -> list[int]:
    rng = np.random.default_rng(size)
    pool = rng.integers(0, 256, size * 1024 + size, dtype=np.uint8).tobytes()
    handles = [client.create_ledger(password=PASSWORD, custom={BENCH_TAG: tag})
               for _ in range(n_ledgers)]
    pending = []
    for i in range(entries):
        start = (i * 7919) % 1024 * size
        payload = pool[start:start + size]
        pending += [h.add_async(payload) for h in handles]
        if len(pending) >= WRITE_WINDOW * n_ledgers:
            for fut in pending:
                fut.result(timeout=600)
            pending = []
    for fut in pending:
        fut.result(timeout=600)
    for h in handles:
        h.close()
    return [h.id for h in handles]


def _session(master: str):
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    owned = SparkSession.getActiveSession() is None
    spark = (SparkSession.builder.master(master).appName("bkctl-bench-spark")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    if owned:
        spark.sparkContext.setLogLevel("ERROR")
    return spark, owned


@contextmanager
def _appliance(config_path: str | None, work: str, read_batch_entries: int | None = None):
    """The given appliance's config, or a temporary one (stopped at exit):
    three bookies, the client's default in-flight limit, journal on, and
    the default read batch unless ``read_batch_entries`` is given."""
    if config_path is not None:
        yield str(Path(config_path).resolve())
        return
    sections = {} if read_batch_entries is None else {
        "server": {"batch_entries_max": read_batch_entries},
        "client": {"read_batch_entries_max": read_batch_entries}}
    with temporary_appliance(3, work, prefix="a", **sections) as (config, _root):
        yield str(config)


class _MemoryReader(DataSourceReader):
    """Pre-built batches, built as the bookkeeper source builds its own (its
    int64 columns over numpy buffers: ``pa.array`` would import pandas in
    each Python worker, a cost inside the timed runs that is not reading)."""

    def __init__(self, options):
        self.rows = int(options.get("rows", 0))
        self.size = int(options.get("size", 100))
        self.parts = max(1, int(options.get("partitions", 1)))

    def partitions(self):
        per = -(-self.rows // self.parts)
        return [InputPartition((i * per, min(self.rows, (i + 1) * per)))
                for i in range(self.parts) if i * per < self.rows]

    def read(self, partition):
        lo, hi = partition.value
        step = 65536
        data = pa.py_buffer(bytes(self.size * step))
        offsets = pa.py_buffer(np.arange(0, (step + 1) * self.size, self.size,
                                         dtype=np.int32).tobytes())
        for start in range(lo, hi, step):
            n = min(step, hi - start)
            payload = pa.Array.from_buffers(pa.binary(), n, [None, offsets, data])
            yield pa.RecordBatch.from_arrays(
                [int64_array(np.zeros(n, np.int64)),
                 int64_array(np.arange(start, start + n, dtype=np.int64)),
                 payload], schema=ARROW_SCHEMA)


class MemoryArrowSource(DataSource):
    """Rows of the bookkeeper schema from memory: the Python-source ceiling."""

    @classmethod
    def name(cls) -> str:
        return "bookkeeper_bench_memory"

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema) -> DataSourceReader:
        return _MemoryReader(self.options)
