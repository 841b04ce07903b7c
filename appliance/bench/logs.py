"""``bkctl bench log``: the log layer's write rate, catch-up read rate and
the write-to-read latency of a tailing reader, against a durable Redis
Stream measured in the same run (``../shared/peers/redis_stream.sh``).

How it is counted (per record size):

* **write**: one writer, ``records`` records through ``write_async`` (the
  DLSN futures), then ``flush()``: records / seconds from the first write to
  the last record durable (``records_per_s``); the same through
  ``write_many_async``, 1,000 records a call (``batched_records_per_s``).
* **catch-up read**: one reader from ``DLSN.FIRST`` over the records just
  written (completed segment): records / seconds until the last one.
* **tail latency**: a writer at a fixed ``rate`` for ``tail_s`` seconds, each
  record carrying its send time (``time.monotonic_ns``, one clock for every
  process of the host); a reader in a process of its own tails the log and
  notes, per record, receive time - send time.  p50 / p99 / max over every
  record (``write()`` is asynchronous: the writer does not wait for acks).
* **peer**: the Redis script with the same record count and size (AOF,
  ``appendfsync always``, pipelined XADD, XRANGE catch-up).
"""

from __future__ import annotations

import multiprocessing
import os
import re
import struct
import subprocess
import time
from pathlib import Path

import numpy as np

import appliance
from appliance import DLSN
from appliance.bench.launcher import check_free_space, temporary_appliance

SEND_TIME = struct.Struct("!q")
BATCH = 1000  # records per write_many_async call in the batched run
PEER_TIMEOUT_S = 600
TAIL_READY_TIMEOUT_S = 60


def default_peer() -> Path:
    """../shared/peers/redis_stream.sh beside the repository."""
    return Path(__file__).resolve().parents[3] / "shared" / "peers" / "redis_stream.sh"


def run_log_bench(sizes: list[int], records: int, rate: int, tail_s: float,
                  peer: str | None, workdir: str | None = None,
                  on_progress=lambda line: None) -> dict:
    check_free_space(sum(records * (s + 64) * 6 for s in sizes) + (1 << 30),
                     workdir or "/tmp")
    runs = []
    with temporary_appliance(3, workdir, client={"ensemble": 3, "write_quorum": 3,
                                                 "ack_quorum": 2}) as (config, _):
        for size in sizes:
            with appliance.connect(str(config)) as bk:
                doc = {"size": size, "records": records}
                on_progress(f"{size} B: writing {records:,} records")
                doc.update(_write_and_read(bk, f"bench-{size}", records, size))
                on_progress(f"{size} B: tailing at {rate:,} records/s for {tail_s:g} s")
                doc.update(_tail_latency(bk, str(config), f"tail-{size}", size, rate, tail_s))
            if peer:
                on_progress(f"{size} B: the Redis Stream peer")
                doc["peer"] = run_peer(peer, records, size)
                if doc["peer"].get("records_per_s"):
                    doc["write_vs_peer"] = round(doc["records_per_s"]
                                                 / doc["peer"]["records_per_s"], 2)
                    doc["read_vs_peer"] = round(doc["read_records_per_s"]
                                                / doc["peer"]["read_records_per_s"], 2)
            runs.append(doc)
    out = dict(runs[0])
    out["runs"] = runs
    out["load_average"] = [round(x, 2) for x in os.getloadavg()]
    return out


def timed_writes(bk, name: str, records: int, payload: bytes) -> tuple[float, dict]:
    """``records`` copies of ``payload`` written to log ``name`` by one
    writer (write_async, one flush at the end): the seconds until the last
    is acknowledged, and the writer's stats."""
    with bk.log(name).writer() as w:
        start = time.perf_counter()
        write = w.write_async
        for _ in range(records - 1):
            write(payload)
        last = write(payload)
        w.flush()
        last.result()
        return time.perf_counter() - start, dict(w.stats)


def _write_and_read(bk, name: str, records: int, size: int) -> dict:
    payload = os.urandom(size)
    write_s, stats = timed_writes(bk, name, records, payload)
    with bk.log(name).reader(start=DLSN.FIRST) as r:
        start = time.perf_counter()
        got = 0
        while got < records:
            batch = r.read(max_records=100_000, timeout_s=10)
            if not batch:
                raise RuntimeError(f"catch-up read stalled at {got} of {records} records")
            got += len(batch)
        read_s = time.perf_counter() - start
    with bk.log(name + "-batched").writer() as w:  # the same through write_many_async
        start = time.perf_counter()
        chunk = [payload] * BATCH
        for first in range(0, records, BATCH):
            futures = w.write_many_async(chunk[:min(BATCH, records - first)])
        w.flush()
        futures[-1].result()
        batched_s = time.perf_counter() - start
    return {"records_per_s": round(records / write_s), "mb_per_s": round(
        records * size / write_s / 1e6, 1), "write_s": round(write_s, 3),
        "entries": stats["entries"], "records_per_entry": round(records / stats["entries"], 1),
        "batched_records_per_s": round(records / batched_s),
        "read_records_per_s": round(records / read_s), "read_s": round(read_s, 3)}


def _tail_latency(bk, config: str, name: str, size: int, rate: int, seconds: float) -> dict:
    total = max(1, int(rate * seconds))
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    ready = ctx.Event()
    writer = bk.log(name).writer()
    reader = ctx.Process(target=_tail_main, args=(config, name, total, ready, results),
                         daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + TAIL_READY_TIMEOUT_S
        while not ready.wait(0.1):  # poll: a reader that died says so at once
            if not reader.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the tailing reader did not start (exit code "
                                   f"{reader.exitcode})")
        filler = os.urandom(max(0, size - SEND_TIME.size))
        start = time.monotonic()
        for i in range(total):
            due = start + i / rate
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)  # pacing the writer, not waiting for a condition
            writer.write_async(SEND_TIME.pack(time.monotonic_ns()) + filler)
        writer.flush()
        latencies = results.get(timeout=max(60.0, seconds * 4))
    finally:
        writer.close()
        reader.join(timeout=30)
        if reader.is_alive():
            reader.kill()
            reader.join()
    if isinstance(latencies, str):
        raise RuntimeError(f"tailing reader failed: {latencies}")
    lat = np.asarray(latencies, dtype=np.float64) / 1e6
    return {"tail_rate": rate, "tail_records": total,
            "p50_ms": round(float(np.percentile(lat, 50)), 3),
            "p99_ms": round(float(np.percentile(lat, 99)), 3),
            "max_ms": round(float(lat.max()), 3)}


def _tail_main(config: str, name: str, total: int, ready, results) -> None:
    try:
        with appliance.connect(config) as bk:
            latencies = []
            with bk.log(name).reader() as r:  # the writer made the log before we started
                ready.set()
                while len(latencies) < total:
                    for rec in r.read(max_records=10_000, timeout_s=5):
                        latencies.append(time.monotonic_ns() - SEND_TIME.unpack_from(
                            rec.payload)[0])
            results.put(latencies)
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        results.put(f"{type(exc).__name__}: {exc}")
        ready.set()


def run_peer(script: str, records: int, size: int) -> dict:
    """The Redis Stream peer's rates, or the reason it did not run."""
    if not Path(script).exists():
        return {"error": f"{script} not found"}
    try:
        done = subprocess.run(["bash", script, str(records), str(size)], capture_output=True,
                              text=True, timeout=PEER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {PEER_TIMEOUT_S} s"}
    found = re.search(r"redis_stream (\d+) records/s write (\d+) records/s read", done.stdout)
    if done.returncode != 0 or not found:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"error": f"exit {done.returncode}: {tail[0]}"}
    return {"name": "redis_stream (AOF, appendfsync always)",
            "records_per_s": int(found.group(1)), "read_records_per_s": int(found.group(2))}
