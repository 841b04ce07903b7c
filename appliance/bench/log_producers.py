"""``bkctl bench log --producers N``: many producer processes writing one log
through the log service, against a durable Redis Stream with as many
clients in the same run (``../shared/peers/redis_stream.sh``).

How it is counted (per mode):

* **sync**: N producer processes, each writing ``records / N`` records of
  ``size`` bytes with ``Producer.write`` (each write waits for its DLSN, so
  the record is on an ack quorum before the next leaves).
* **async**: the same with ``write_async``, at most ``window`` records in
  flight per producer (pipelined).
* Each producer first writes one record that is not counted (it finds the
  owner; the owner takes the log over), then every producer starts at one
  signal.  ``records_per_s``: records stored / seconds from the first
  producer's start to the last producer's last DLSN.
* **latency** of a record: from its *intended* send time to its DLSN.  With
  ``rate`` (records/s offered in total, open loop: each producer sends
  ``rate / N`` records/s on a fixed schedule, whether or not earlier writes
  were answered) the intended time is the schedule's, so a stall counts for
  every record it delayed; without it, the time the write was called.
  p50 / p99 / p99.9 over every record, but for pipelined writes without a
  rate: over every ``LATENCY_SAMPLE_EVERY``-th (a callback per record timed
  cost the loop more than the rest of its work per record, and the
  exclusive writer it is compared with times none).  ``errors``: records
  not stored (every record is counted).
* **cpu_us_per_record**: CPU (user + system) of the producer processes
  (while writing), the log servers and the bookies, over the mode's run
  (from the producers' start signal: the logs' taking over is not in it),
  per record.  With ``rate``, the producers' figure includes the bench's
  own pacing (a sleep and a wake-up per record at a moderate rate):
  **pacing_cpu_us_per_record** is that pacing alone, timed in each
  producer process before the run.
* **logs** (``--logs N``): the producers write N logs instead of one (log
  ``i`` written by producer ``i % producers``, each producer process
  round robin over its logs, ``records`` shared by all), every log owned
  by the appliance's one log server (``[log] servers = 1``, so it writes N
  ledgers at once); the same mode first runs with one log on the same
  appliance, and ``vs_one_log`` = records_per_s / that run's (pipelined
  without a rate: at least ``baseline_records``, see below).
* **records_per_entry**: records the log servers wrote / ledger entries
  they sent over the mode's run (their ``/metrics`` counters): how much
  group commit the owner found.  **records_per_request**: records / write
  requests (a multi-log message's sections count one each);
  **records_per_message**: records / messages the servers received (a
  multi-log message once: what the producers of a process sent together).
  **requests_per_s**: write requests the servers answered per second of
  the run; **server_ms_per_request**: their mean time from arrival to
  answer (``/metrics``' latency histogram): the part of a record's latency
  spent in the log server and below it (the rest: waiting in its producer
  for the reply to the previous request, and the wire both ways).
* **writer**: one exclusive writer (``Log.writer()``, ``write_async``) of
  records of the same size on another log, in the bench's own process: the
  rate the producers are compared with (``vs_writer``).
* **baselines** (the writer; the one-log run of pipelined writes without a
  rate): at least ``baseline_records`` records (``--baseline-records``,
  default ``BASELINE_RECORDS_MIN``), whatever ``records`` is.  At
  200,000-400,000 records/s a run of 30,000 or 100,000 records lasts
  0.1-0.5 s, and its start (the pipeline filling) and end (draining) then
  weigh enough to cut the rate by a third (one writer of 30,000 records
  measured 254,000 records/s, of 400,000 a minute later 408,000).  Their
  record counts are in the output (``writer_records``, ``one_log.records``).
* **peer**: the Redis script with the same records, size and client count,
  PIPELINE 1 for sync (each XADD waits for its reply) and ``window`` for
  async; ``vs_peer`` = records_per_s / the peer's.
"""

from __future__ import annotations

import collections
import contextlib
import multiprocessing
import os
import queue
import re
import subprocess
import time
import urllib.request
from array import array
from pathlib import Path

import numpy as np
import psutil

import appliance
from appliance.bench.launcher import (
    bookie_pids,
    check_free_space,
    reap,
    temporary_appliance,
    wait_for,
)
from appliance.bench.logs import timed_writes
from appliance.client.add_future import outcome
from appliance.config import load_config
from appliance.meta.logservice import LogServiceRegistry

MODES = ("sync", "async")
START_TIMEOUT_S = 120  # every producer connected and its first record stored (--logs: x logs/100)
PEER_TIMEOUT_S = 600
SERVERS_TIMEOUT_S = 60
# without --rate, pipelined records are timed one in this many (a callback
# each): the loop's own cost per record stays near the exclusive writer's,
# whose rate the producers are compared with (vs_writer)
LATENCY_SAMPLE_EVERY = 16
WARM_LOGS_AT_ONCE = 8  # logs each producer process has taken over at a time (--logs)
PACING_CALIBRATION_S = 0.5  # --rate: the pacing alone timed this long before the run
# the writer's and the pipelined one-log run's records at least (1-2 s at
# their rates here): a shorter baseline is mostly its start and end
BASELINE_RECORDS_MIN = 400_000


def run_producers_bench(producers: int, records: int, size: int, modes: list[str],
                        rate: int | None, window: int, peer: str | None,
                        workdir: str | None = None, on_progress=lambda line: None,
                        logs: int = 1, baseline_records: int = 0) -> dict:
    """Every mode's run (see the module's docstring); ``baseline_records``:
    the writer's and the pipelined one-log run's records at least
    (``BASELINE_RECORDS_MIN`` is the command's default)."""
    baseline = max(records, baseline_records)
    check_free_space((records * len(modes) * (2 if logs > 1 else 1) + baseline * 2)
                     * (size + 80) * 3 + (1 << 30), workdir or "/tmp")
    runs = []
    # the servers' /metrics give records per entry; one server owns every log
    log_section = {"metrics_address": "127.0.0.1:0", **({"servers": 1} if logs > 1 else {})}
    with temporary_appliance(3, workdir, client={"ensemble": 3, "write_quorum": 3,
                                                 "ack_quorum": 2},
                             log=log_section) as (config, _):
        servers = load_config(config).log.servers
        if servers < 1:
            raise ValueError("the log service is off ([log] servers = 0)")
        with appliance.connect(str(config)) as bk:
            registry = LogServiceRegistry(bk.logs.store)
            wait_for(lambda: len(registry.servers()) >= servers,
                     SERVERS_TIMEOUT_S, 0.05, "the log servers")
            pids = {"bookies": bookie_pids(str(config)),
                    "log_servers": {sid: doc["pid"] for sid, doc in registry.servers().items()
                                    if doc.get("pid")}}
            urls = [doc["metrics_url"] for doc in registry.servers().values()
                    if doc.get("metrics_url")]
            on_progress(f"one exclusive writer: {baseline:,} records")
            writer_rate = _exclusive_writer(bk, "bench-writer", baseline, size)
        for mode in modes:
            one_log = None
            if logs > 1:  # the same mode with one log first, on the same appliance
                # pipelined without a rate: as long a run as the writer's
                one = baseline if mode == "async" and not rate else records
                on_progress(f"{mode}: {producers} producers, one log, {one:,} records")
                one_log = _measured(pids, str(config), f"bench-{mode}-one", producers,
                                    one, size, mode, rate, window, 1, urls)
                one_log["records"] = one
            on_progress(f"{mode}: {producers} producers, {logs:,} log(s), {records:,} records"
                        + (f" at {rate:,}/s" if rate else ""))
            doc = _measured(pids, str(config), f"bench-{mode}", producers, records, size,
                            mode, rate, window, logs, urls)
            if one_log is not None:
                doc["one_log"] = one_log
                doc["vs_one_log"] = round(doc["records_per_s"] / one_log["records_per_s"], 2)
            doc["vs_writer"] = round(doc["records_per_s"] / writer_rate, 2)
            if peer:
                pipeline = 1 if mode == "sync" else window
                on_progress(f"{mode}: the Redis Stream peer, {producers} clients, "
                            f"pipeline {pipeline}")
                doc["peer"] = run_peer(peer, records, size, pipeline, producers)
                if doc["peer"].get("records_per_s"):
                    doc["vs_peer"] = round(doc["records_per_s"]
                                           / doc["peer"]["records_per_s"], 2)
            runs.append(doc)
    out = {**runs[0], "producers": producers, "logs": logs, "size": size, "records": records,
           "rate": rate, "window": window, "writer_records_per_s": writer_rate,
           "writer_records": baseline, "runs": runs,
           "load_average": [round(x, 2) for x in os.getloadavg()]}
    return out


def _measured(pids: dict, config: str, name: str, producers: int, records: int, size: int,
              mode: str, rate: int | None, window: int, logs: int, urls: list[str]) -> dict:
    """One mode's run, with the CPU per record of every role and the
    records per entry the log servers wrote (their ``/metrics``), both
    counted from the producers' start signal: not the taking over of the
    logs before it (with 1,000 logs a good part of a short run's)."""
    at_start: dict = {}

    def started() -> None:
        at_start["cpu"] = {role: _cpu_s(p) for role, p in pids.items()}
        at_start["written"] = _written(urls)

    doc = _run_mode(config, name, producers, records, size, mode, rate, window, logs,
                    started)
    cpu0, written0 = at_start["cpu"], at_start["written"]
    written = [b - a for a, b in zip(written0, _written(urls), strict=True)]
    doc["records_per_entry"] = round(written[0] / written[1], 2) if written[1] else None
    # requests: single-log requests and sections of multi-log ones; messages:
    # what reached the server (a multi-log message once)
    messages = written[2] - written[3] + written[4]
    doc["records_per_request"] = round(written[0] / written[2], 2) if written[2] else None
    doc["records_per_message"] = round(written[0] / messages, 2) if messages else None
    answered, answer_s = written[5], written[6]
    doc["requests_per_s"] = round(answered / doc["wall_s"]) if doc["wall_s"] else None
    doc["server_ms_per_request"] = round(answer_s / answered * 1000, 3) if answered else None
    doc["cpu_us_per_record"] = {
        "producers": doc.pop("producer_cpu_us_per_record"),
        **{role: round((_cpu_s(p) - cpu0[role]) / records * 1e6, 1)
           for role, p in pids.items()}}
    doc["logs"] = logs
    doc["load_average"] = [round(x, 2) for x in os.getloadavg()]
    return doc


def _log_names(name: str, logs: int, producers: int, index: int) -> list[str]:
    """The logs producer ``index`` writes: ``name`` itself when there is one;
    else log ``i`` is written by producer ``i % producers`` (each by one
    producer when there are more logs than producers)."""
    if logs == 1:
        return [name]
    if logs < producers:
        return [f"{name}-{index % logs}"]
    return [f"{name}-{i}" for i in range(index, logs, producers)]


def _exclusive_writer(bk, name: str, records: int, size: int) -> int:
    write_s, _ = timed_writes(bk, name, records, os.urandom(size))
    return round(records / write_s)


def _run_mode(config: str, name: str, producers: int, records: int, size: int, mode: str,
              rate: int | None, window: int, logs: int = 1,
              started=lambda: None) -> dict:
    """The producers' run; ``started()`` is called once every producer is
    ready (connected, its logs taken over), just before they start."""
    ctx = multiprocessing.get_context("spawn")
    results, go = ctx.Queue(), ctx.Event()
    counts = [records // producers + (1 if i < records % producers else 0)
              for i in range(producers)]
    per_rate = rate / producers if rate else 0.0
    procs = [ctx.Process(target=_producer_main, daemon=True,
                         args=(config, _log_names(name, logs, producers, i), n, size, mode,
                               per_rate, window, results, go))
             for i, n in enumerate(counts)]
    for p in procs:
        p.start()
    try:
        _gather(results, procs, producers, "ready", logs)
        started()
        go.set()
        docs = _gather(results, procs, producers, "done")
    finally:
        go.set()
        reap(procs)
    lat = np.concatenate([np.frombuffer(d["lat"], dtype=np.float64) for d in docs]) * 1000
    stored = sum(d["stored"] for d in docs)
    wall = max(d["end"] for d in docs) - min(d["start"] for d in docs)
    return {"mode": mode, "records_per_s": round(stored / wall), "wall_s": round(wall, 3),
            "p50_ms": _pct(lat, 50), "p99_ms": _pct(lat, 99), "p999_ms": _pct(lat, 99.9),
            "max_ms": round(float(lat.max()), 3) if lat.size else None,
            "errors": records - stored, "error": next((d["error"] for d in docs
                                                       if d["error"]), None),
            "producer_cpu_us_per_record": round(sum(d["cpu_s"] for d in docs) / records * 1e6,
                                                1),
            "pacing_cpu_us_per_record": round(sum(d["pacing_cpu_s"] for d in docs) / records
                                              * 1e6, 1),
            "retries": sum(d["stats"].get("retries", 0) for d in docs),
            "redirects": sum(d["stats"].get("redirects", 0) for d in docs)}


_WRITTEN_COUNTERS = ("records", "entries", "requests", "mux_sections", "mux_requests")
_LATENCY = "bookkeeper_logserver_write_latency_seconds"


def _written(urls: list[str]) -> list[float]:
    """(records, entries, requests, sections of multi-log messages, multi-log
    messages, write requests answered, their seconds from arrival to answer)
    the log servers counted so far (their /metrics)."""
    totals = dict.fromkeys(_WRITTEN_COUNTERS, 0.0)
    answered = answer_s = 0.0
    for url in urls:
        with urllib.request.urlopen(url, timeout=10) as reply:
            for line in reply.read().decode().splitlines():
                name, _, value = line.partition(" ")
                counter = name.removeprefix("bookkeeper_logserver_").removesuffix("_total")
                if counter in totals and name.endswith("_total"):
                    totals[counter] += float(value)
                elif name == _LATENCY + "_count":
                    answered += float(value)
                elif name == _LATENCY + "_sum":
                    answer_s += float(value)
    return [totals[c] for c in _WRITTEN_COUNTERS] + [answered, answer_s]


def _cpu_s(pids: dict[str, int]) -> float:
    """User + system CPU seconds of these processes so far."""
    total = 0.0
    for pid in pids.values():
        try:
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system
        except psutil.Error:
            continue  # a process that died: the producers' errors say so
    return total


def _pct(lat, q: float):
    return round(float(np.percentile(lat, q)), 3) if lat.size else None


def _gather(results, procs, n: int, what: str, n_logs: int = 1) -> list:
    """``n`` messages of kind ``what`` from the producers; a producer that
    dies or reports a failure ends the run."""
    got = []
    start_s = START_TIMEOUT_S * max(1, n_logs // 100)
    deadline = time.monotonic() + start_s if what == "ready" else None
    while len(got) < n:
        try:
            kind, doc = results.get(timeout=0.5)
        except queue.Empty:
            dead = [p.exitcode for p in procs if not p.is_alive() and p.exitcode]
            if dead:
                raise RuntimeError(f"a producer process exited {dead[0]}") from None
            if deadline is not None and time.monotonic() > deadline:
                raise RuntimeError(f"the producers were not ready within "
                                   f"{start_s} s") from None
            continue
        if kind == "failed":
            raise RuntimeError(f"a producer failed: {doc}")
        got.append(doc)
    return got


def _producer_main(config: str, names: list[str], count: int, size: int, mode: str,
                   per_rate: float, window: int, results, go) -> None:
    try:
        with appliance.connect(config) as bk, contextlib.ExitStack() as stack:
            ps = [stack.enter_context(bk.log(name).producer()) for name in names]
            payload = os.urandom(size)
            # not counted: each producer finds its owner, which takes the log (a
            # few logs at a time: a server takes each with metadata round trips)
            for lo in range(0, len(ps), WARM_LOGS_AT_ONCE):
                for p in ps[lo:lo + WARM_LOGS_AT_ONCE]:
                    p.write_async(payload)
                for p in ps[lo:lo + WARM_LOGS_AT_ONCE]:
                    p.flush()
            pacing_s = _pacing_cpu_s(per_rate)
            results.put(("ready", None))
            go.wait()
            cpu0 = time.process_time()
            doc = (_write_sync if mode == "sync" else _write_async)(
                ps[0] if len(ps) == 1 else _RoundRobin(ps), payload, count, per_rate, window)
            stats = collections.Counter()
            for p in ps:
                stats.update(p.stats)
            doc["stats"] = dict(stats)
            doc["cpu_s"] = time.process_time() - cpu0
            doc["pacing_cpu_s"] = pacing_s * count
        results.put(("done", doc))
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        results.put(("failed", f"{type(exc).__name__}: {exc}"))


class _RoundRobin:
    """Several producers (one per log) as one for the write loops: each
    write goes to the next log in turn."""

    def __init__(self, producers: list):
        self._ps, self._next = producers, 0

    def _take(self):
        p = self._ps[self._next]
        self._next = (self._next + 1) % len(self._ps)
        return p

    def write(self, payload):
        return self._take().write(payload)

    def write_async(self, payload):
        return self._take().write_async(payload)

    def flush(self) -> None:
        for p in self._ps:
            p.flush()


def _pacing_cpu_s(per_rate: float) -> float:
    """The CPU seconds per record of the open loop's pacing alone (a sleep
    until each record's time, a callback made and called), measured over
    ``PACING_CALIBRATION_S``: the share of the producers' CPU that is the
    bench's own, not the producer's (0 without a rate)."""
    if not per_rate:
        return 0.0
    n = max(1, int(per_rate * PACING_CALIBRATION_S))
    lat, clock = array("d"), time.monotonic
    cpu0, start = time.process_time(), clock()
    for i in range(n):
        sent = _pace(start, i, per_rate)
        (lambda _f, sent=sent: lat.append(clock() - sent))(None)
    return (time.process_time() - cpu0) / n


def _pace(start: float, i: int, per_rate: float) -> float:
    """The intended send time of record ``i`` (now, without a rate)."""
    if not per_rate:
        return time.monotonic()
    due = start + i / per_rate
    pause = due - time.monotonic()
    if pause > 0:
        time.sleep(pause)  # pacing the open loop, not waiting for a condition
    return due


def _write_sync(p, payload: bytes, count: int, per_rate: float, _window: int) -> dict:
    lat, stored, error = array("d"), 0, None
    clock = time.monotonic
    start = clock()
    for i in range(count):
        sent = _pace(start, i, per_rate)
        try:
            p.write(payload)
        except Exception as exc:  # noqa: BLE001 - counted; errors are sticky
            error = f"{type(exc).__name__}: {exc}"
            break
        lat.append(clock() - sent)
        stored += 1
    return {"start": start, "end": clock(), "lat": lat.tobytes(), "stored": stored,
            "error": error}


def _write_async(p, payload: bytes, count: int, per_rate: float, window: int) -> dict:
    """Pipelined writes, at most ``window`` in flight.  As cheap per record
    as the exclusive writer's loop (``timed_writes``) allows while still
    timing records: without a rate only every ``LATENCY_SAMPLE_EVERY``-th
    record is timed (a callback each), and the window's oldest future is
    looked at without its lock (``outcome``)."""
    lat, failed = array("d"), []
    clock = time.monotonic
    inflight: collections.deque = collections.deque()
    error, issued, bad = None, 0, 0
    every = 1 if per_rate else LATENCY_SAMPLE_EVERY

    def done(fut, sent):
        if fut.exception() is None:
            lat.append(clock() - sent)
        else:
            failed.append(fut.exception())

    write, keep, oldest = p.write_async, inflight.append, inflight.popleft
    start = clock()
    for i in range(count):
        sent = _pace(start, i, per_rate)
        if len(inflight) >= window:
            old = oldest()
            if outcome(old) is None:
                old.exception()  # waits: the window is full
            bad += outcome(old)[1] is not None
        try:
            fut = write(payload)
        except Exception as exc:  # noqa: BLE001 - counted; errors are sticky
            error = f"{type(exc).__name__}: {exc}"
            break
        keep(fut)
        issued += 1
        if not i % every:
            fut.add_done_callback(lambda f, sent=sent: done(f, sent))
    try:
        p.flush()
    except Exception as exc:  # noqa: BLE001 - counted
        error = error or f"{type(exc).__name__}: {exc}"
    timed = len(range(0, issued, every))
    deadline = clock() + 60
    while len(lat) + len(failed) < timed and clock() < deadline:
        time.sleep(0.001)  # the last callbacks run on the producer's thread just after
    end = clock()
    bad += sum(1 for fut in inflight if not fut.done() or fut.exception() is not None)
    if failed and error is None:
        error = f"{type(failed[0]).__name__}: {failed[0]}"
    return {"start": start, "end": end, "lat": lat.tobytes(), "stored": issued - bad,
            "error": error}


def run_peer(script: str, records: int, size: int, pipeline: int, clients: int) -> dict:
    """The Redis Stream peer's rate and latency, or the reason it did not run."""
    if not Path(script).exists():
        return {"error": f"{script} not found"}
    try:
        done = subprocess.run(["bash", script, str(records), str(size), str(pipeline),
                               str(clients)], capture_output=True, text=True,
                              timeout=PEER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {PEER_TIMEOUT_S} s"}
    found = re.search(r"redis_stream (\d+) records/s write (\d+) records/s read"
                      r"(?: p50 ([\d.]+) p99 ([\d.]+))?", done.stdout)
    if done.returncode != 0 or not found:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"error": f"exit {done.returncode}: {tail[0]}"}
    doc = {"name": "redis_stream (AOF, appendfsync always)", "clients": clients,
           "pipeline": pipeline, "records_per_s": int(found.group(1))}
    if found.group(3):
        doc.update(p50_ms=float(found.group(3)), p99_ms=float(found.group(4)))
    return doc
