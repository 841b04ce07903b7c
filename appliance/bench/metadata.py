"""Compare-and-swap throughput of a metadata store, from several processes.

Each worker process opens its own store and repeats ``get`` + ``set`` with
the version it read (the shape of every metadata change).  On a *shared*
node the workers contend: a conflict is counted and retried, and only
successful swaps count as operations.  On *own* nodes each worker has one
node, which measures the backend's write path without conflicts.

Workers start together (a ready/go handshake), so process start-up and
connection set-up are not timed.  Every worker is stopped before a run
returns, also on failure.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import queue as queue_module
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from appliance.bench.launcher import reap
from appliance.errors import MetadataVersionError
from storage.metadata import open_store

# Bounds: a worker gives up on one swap after this many conflicts, and the
# parent stops waiting for a worker after this long.
CONFLICTS_PER_OP_MAX = 100_000
WORKER_TIMEOUT_S = 600


def _worker(uri: str, path: str, ops: int, ready, go, results) -> None:
    try:
        with open_store(uri, session_timeout_ms=30_000) as store:
            ready.put(True)
            go.wait(120)
            conflicts, started = 0, time.monotonic()
            for _ in range(ops):
                conflicts += _swap_once(store, path)
            results.put(("ok", started, time.monotonic(), conflicts))
    except BaseException as exc:
        results.put(("error", repr(exc), 0.0, 0))


def _swap_once(store, path: str) -> int:
    """One successful CAS increment; returns the conflicts it took."""
    for conflicts in range(CONFLICTS_PER_OP_MAX):
        data, version = store.get(path)
        try:
            store.set(path, str(int(data) + 1).encode(), version)
            return conflicts
        except MetadataVersionError:
            continue
    raise RuntimeError(f"{path}: {CONFLICTS_PER_OP_MAX} conflicts on one swap")


def measure_cas(uri: str, processes: int, ops_per_process: int, shared: bool) -> dict:
    """Run ``processes`` workers; CAS operations per second over the run."""
    tag = f"{'shared' if shared else 'own'}-{processes}-{time.monotonic_ns()}"
    paths = [f"/bench/{tag}" if shared else f"/bench/{tag}-{i}" for i in range(processes)]
    with open_store(uri) as store:
        for path in set(paths):
            store.create(path, b"0", make_parents=True)
        ctx = multiprocessing.get_context("spawn")
        ready, go, results = ctx.Queue(), ctx.Event(), ctx.Queue()
        procs = [ctx.Process(target=_worker, args=(uri, p, ops_per_process, ready, go, results))
                 for p in paths]
        try:
            for proc in procs:
                proc.start()
            for _ in procs:
                ready.get(timeout=120)
            go.set()
            outcomes = [results.get(timeout=WORKER_TIMEOUT_S) for _ in procs]
        except queue_module.Empty as exc:
            raise RuntimeError("a benchmark worker did not report in time") from exc
        finally:
            reap(procs)
        errors = [o[1] for o in outcomes if o[0] != "ok"]
        if errors:
            raise RuntimeError(f"benchmark worker failed: {errors[0]}")
        final = sum(int(store.get(p)[0]) for p in set(paths))
    total = processes * ops_per_process
    if final != total:  # the benchmark checks its own result: no lost update
        raise RuntimeError(f"lost updates: {final} of {total} increments stored")
    seconds = max(o[2] for o in outcomes) - min(o[1] for o in outcomes)
    conflicts = sum(o[3] for o in outcomes)
    return {"processes": processes, "node": "shared" if shared else "own", "ops": total,
            "seconds": round(seconds, 3), "cas_per_s": round(total / seconds),
            "conflicts": conflicts}


@contextlib.contextmanager
def temporary_store_uri(backend: str) -> Iterator[str]:
    """A throw-away store: a SQLite file, or a ZooKeeper server (pyspark's jars)."""
    with tempfile.TemporaryDirectory(prefix="bkbench") as tmp:
        if backend == "sqlite":
            yield f"sqlite:///{Path(tmp) / 'metadata.db'}"
            return
        # only the ZooKeeper runs need kazoo and the server launcher
        from appliance.bench.zk_server import ZooKeeperServer

        with ZooKeeperServer(Path(tmp) / "zk", die_with_parent=True) as server:
            yield server.uri("/bench")


def warm_up(uri: str, ops: int) -> None:
    """Untimed swaps first: a fresh ZooKeeper JVM runs several times slower
    until its JIT has compiled the request path."""
    with open_store(uri) as store:
        path = store.create(f"/bench/warmup-{time.monotonic_ns()}", b"0", make_parents=True)
        for _ in range(ops):
            _swap_once(store, path)


def run_matrix(uri: str, process_counts: list[int], ops_per_process: int,
               warmup_ops: int = 0) -> list[dict]:
    """Shared node for every process count; own nodes too when there are
    several processes (with one they are the same run)."""
    warm_up(uri, warmup_ops)
    rows = []
    for processes in process_counts:
        rows.append(measure_cas(uri, processes, ops_per_process, shared=True))
        if processes > 1:
            rows.append(measure_cas(uri, processes, ops_per_process, shared=False))
    return rows
