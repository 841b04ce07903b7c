"""End-to-end benchmark of the appliance (``bkctl bench write|read``).

What it measures: durable adds (or catch-up reads of a CLOSED ledger)
through the public client binding, from ``clients`` client processes, each
with a ledger of its own, against either a temporary appliance it starts
itself (``bookies`` bookies under a temp dir, supervisor included, removed
afterwards, also on failure or Ctrl-C) or a running one (``config_path``).

How it counts:

* **write, closed loop** (``rate == 0``): each client keeps ``inflight``
  adds in flight (the handle's ``inflight_adds_max``); an add's latency runs
  from the return of ``add_async`` (it blocks while the window is full) to
  the moment its future completed (acknowledged by an ack quorum, each bookie
  having fdatasync'ed it when the journal is on).  Every ``sample_every``-th
  add is timed; the run checks that every add succeeded (acks are in order,
  so the last future's success covers all).
* **write, open loop** (``rate > 0``): adds are *scheduled* at
  ``rate / clients`` per second per client and latency runs from the
  scheduled send time, so a client that falls behind shows it (no
  coordinated omission).  The loop sleeps at least ``OPEN_LOOP_WAKE_S``
  (200 us) when it is ahead and then sends every add that has come due:
  above 5,000 adds/s it sends small bursts rather than waking once per
  add (three alternated pairs each: client CPU per add 53-55 against
  58-59 us at 10,000/s and 12.3-12.6 against 13.1-13.3 at 50,000/s on the
  2-core test machine: CPU the bookies share); an add sent late by the
  wake-up counts that delay in its latency.  ``inflight`` still bounds
  memory.
* **read**: each client writes ``entries`` entries to a ledger, closes it,
  opens it again and reads it back with ``ReadHandle.read`` calls of
  ``read_batch`` entries (latency per call), or with one
  ``ReadHandle.read_chunks`` (``read_chunks``: the bulk API; latency per
  chunk).  Payloads are checked.
* adds_per_s / reads_per_s = entries completed over the wall time from the
  first client's start to the last client's end; MB are 10**6 payload bytes.
* CPU: ``process_time`` of the client processes and the CPU the bookie
  processes used during the measured phase (psutil), per 1,000 entries.
  ``bookie_peak_rss_mb``: the largest VmHWM (peak resident set) of any bookie.
* ``disk_fdatasync_per_s`` / ``disk_direct_mb_per_s``: the raw disk of the
  appliance's directory measured in the same run (``baseline_s > 0``, temp
  appliance only), so figures read as ratios on a noisy machine.

Faults it survives: a client that fails reports its error (the run fails
with that line); the temporary appliance is stopped and its directory
removed whatever happens.  Bounds: ``inflight`` adds per client, one
result message per client, timeouts on every wait.
"""

from __future__ import annotations

import dataclasses
import gc
import multiprocessing as mp
import queue
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil

import appliance
from appliance.bench.launcher import (
    START_TIMEOUT_S,
    bookie_pids,
    check_free_space,
    reap,
    temporary_appliance,
)
from appliance.client.client import raise_process_settings
from appliance.errors import NotEnoughBookiesError
from appliance.protocol.metadata import check_quorums

CLIENT_TIMEOUT_S = 3600.0  # the longest a client may take (a bound, not a target)
WARMUP_ADDS = 2000  # untimed adds per client before the measured phase
OPEN_LOOP_WAKE_S = 200e-6  # the open loop sleeps at least this long; then sends what is due
PASSWORD = b"bench"
CHUNK_BITS = 16  # latency arrays grow in chunks of 65,536 entries
PLOT_POINTS_MAX = 200_000


@dataclass(frozen=True)
class BenchOptions:
    """One run.  ``inflight``: adds in flight per client (throughput vs
    latency and memory); ``rate``: open-loop adds/s over all clients (0 =
    closed loop); ``duration_s``: stop adding after this long (``entries``
    is then an upper bound); ``read_batch``: entries per ``read`` call;
    ``sample_every``: the latency of every n-th add is recorded (a done
    callback on every add costs the client ~25% more CPU)."""

    entries: int = 100_000
    size: int = 1024
    ensemble: int = 3
    write_quorum: int = 3
    ack_quorum: int = 2
    inflight: int = 10_000
    clients: int = 1
    journal: bool = True
    duration_s: float | None = None
    rate: float = 0.0
    read_batch: int = 1000
    read_chunks: bool = False
    add_batch: int = 1
    sample_every: int = 16
    bookies: int = 4
    baseline_s: float = 0.5
    ledgers: int = 1  # per client, written round robin (BP-32 comparisons)
    entry_log_per_ledger: bool = False  # temporary appliance's storage mode
    metrics: bool = False  # temporary appliance: every bookie serves /metrics
    gc_threshold: int = 0  # client processes: [client] gc_threshold (0: Python's own)
    switch_interval_us: int = 0  # client processes: [client] switch_interval_us (0: Python's)
    add_messages_inflight: int | None = None  # clients: [client] add_messages_inflight or None

    def validate(self) -> BenchOptions:
        check_quorums(self.ensemble, self.write_quorum, self.ack_quorum)
        for name in ("entries", "inflight", "clients", "read_batch", "sample_every", "bookies",
                     "ledgers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.size < 0 or self.rate < 0 or self.baseline_s < 0:
            raise ValueError("size, rate and baseline_s must be >= 0")
        if self.add_batch < 1 or (self.add_batch > 1 and self.rate > 0):
            raise ValueError(f"add_batch must be >= 1, and 1 with --rate (open loop), got "
                             f"{self.add_batch}")
        for name in ("gc_threshold", "switch_interval_us", "add_messages_inflight"):
            if (getattr(self, name) or 0) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.duration_s is not None and self.duration_s <= 0:
            raise ValueError(f"duration_s must be > 0, got {self.duration_s}")
        return self


# -- the temporary appliance ----------------------------------------------------------
SEGMENT_ROOM_BYTES = 4 * 64 * 1024 * 1024  # preallocated journal segments per bookie, about


def needed_bytes(options: BenchOptions) -> int:
    """Disk a temporary appliance will take, about: every payload (plus its
    headers) on write_quorum bookies, twice with the journal, and each
    bookie's preallocated journal segments."""
    records = options.entries * options.clients + WARMUP_ADDS * options.clients
    copies = options.write_quorum * (2 if options.journal else 1)
    return records * (options.size + 64) * copies + options.bookies * SEGMENT_ROOM_BYTES


@contextmanager
def bench_appliance(options: BenchOptions, config_path: str | None, workdir: str | None):
    """Yield (config path, data dir or None): the given appliance, or a
    temporary one started here and stopped and removed at exit."""
    if config_path is not None:
        yield str(Path(config_path).resolve()), None
        return
    check_free_space(needed_bytes(options), workdir or tempfile.gettempdir())
    storage = {"journal_write_data": options.journal}
    if options.entry_log_per_ledger:  # an open log per written ledger: no LRU churn
        storage.update(entry_log_per_ledger=True,
                       entry_logs_open_max=max(64, options.clients * options.ledgers))
    every_bookie = {"metrics_address": "127.0.0.1:0"} if options.metrics else {}
    with temporary_appliance(options.bookies, workdir, storage=storage, client={
            "inflight_adds_max": options.inflight}, every_bookie=every_bookie) as (config, root):
        yield str(config), root


# -- bookie processes: CPU and memory ------------------------------------------------
def _cpu_s(pids: dict[str, int]) -> float:
    total = 0.0
    for pid in pids.values():
        try:
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system
        except psutil.Error:
            continue  # a bookie that died is reported by the clients' errors
    return total


def _peak_rss_mb(pids: dict[str, int]) -> float | None:
    """Largest VmHWM (peak resident set, Linux) or current RSS of the bookies."""
    peak = None
    for pid in pids.values():
        value = None
        try:
            with open(f"/proc/{pid}/status") as fh:
                for line in fh:
                    if line.startswith("VmHWM:"):
                        value = int(line.split()[1]) * 1024
            if value is None:
                value = psutil.Process(pid).memory_info().rss
        except (OSError, psutil.Error):
            continue
        peak = value if peak is None else max(peak, value)
    return None if peak is None else peak / 1e6


# -- the run (parent process) ---------------------------------------------------------
def run_bench(kind: str, options: BenchOptions, config_path: str | None = None,
              workdir: str | None = None, plot_path: str | None = None) -> dict:
    """Run the ``kind`` ("write" or "read") benchmark; returns the results
    document (see the module docstring; keys in ``RESULT_KEYS``)."""
    if kind not in ("write", "read"):
        raise ValueError(f"kind must be 'write' or 'read', got {kind!r}")
    options.validate()
    if plot_path is not None:
        _check_plot_path(plot_path)
    with bench_appliance(options, config_path, workdir) as (config, root):
        baseline = _baseline(root, options.baseline_s)
        pids = bookie_pids(config)
        if len(pids) < options.ensemble:
            raise NotEnoughBookiesError(f"ensemble {options.ensemble} needs {options.ensemble} "
                                        f"live bookies; {len(pids)} are registered")
        results, bookie_cpu_s = _run_clients(kind, config, options, pids)
        peak_rss_mb = _peak_rss_mb(pids)
    doc = summarise(kind, options, results, bookie_cpu_s, peak_rss_mb)
    doc.update(baseline, appliance=config_path or f"temporary ({options.bookies} bookies)",
               bookies_measured=len(pids))
    if plot_path is not None:
        plot(kind, results, plot_path, doc)
        doc["plot"] = str(plot_path)
    return doc


def _baseline(root: Path | None, seconds: float) -> dict:
    if root is None or seconds <= 0:
        return {"disk_fdatasync_per_s": None, "disk_direct_mb_per_s": None}
    # on use: the bench's client processes import this module, and
    # storage.bench is 72 modules (0.14 s) they never use (measured 2026-11-27)
    from storage.bench import disk_direct_mb_per_s, disk_fdatasync_per_s

    return {"disk_fdatasync_per_s": disk_fdatasync_per_s(str(root), seconds),
            "disk_direct_mb_per_s": disk_direct_mb_per_s(str(root), seconds)}


def _run_clients(kind: str, config: str, options: BenchOptions,
                 pids: dict[str, int], target=None) -> tuple[list[dict], float]:
    """Start the client processes, release them together, collect results;
    the bookies' CPU counts from the release until every client's loop
    ended (not its ledgers' close and delete after it).  ``target``: the
    client processes' body (``client_main``)."""
    ctx = mp.get_context("spawn")
    ready, done, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=target or client_main,
                         args=(kind, config, options, i, ready, done, go),
                         name=f"bench-client-{i}", daemon=True)
             for i in range(options.clients)]
    try:
        for proc in procs:
            proc.start()
        _collect(ready, procs, START_TIMEOUT_S + 60.0, "ready")
        cpu_before = _cpu_s(pids)
        go.set()
        _collect(ready, procs, CLIENT_TIMEOUT_S, "looped")
        bookie_cpu_s = _cpu_s(pids) - cpu_before
        return _collect(done, procs, CLIENT_TIMEOUT_S, "done"), bookie_cpu_s
    except BaseException:
        for proc in procs:  # a failed run: the others may be waiting for "go"
            if proc.is_alive():
                proc.kill()
        raise
    finally:
        reap(procs)


def _collect(q, procs, timeout_s: float, what: str) -> list:
    """One message per client; an error message or a dead client fails the run."""
    out, deadline = [], time.monotonic() + timeout_s
    while len(out) < len(procs):
        try:
            tag, index, payload = q.get(timeout=0.2)
        except queue.Empty:
            dead = [p.name for p in procs if p.exitcode not in (None, 0)]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"bench clients {dead or 'timed out'} before '{what}'") \
                    from None
            continue
        if tag == "error":
            raise RuntimeError(f"bench client {index}: {payload}")
        out.append(payload)
    return out


# -- a client process -----------------------------------------------------------------
def client_main(kind: str, config: str, options: BenchOptions, index: int, ready, done,
                go) -> None:
    """Body of one client process: connect, prepare, wait for ``go``, run."""
    try:
        with appliance.connect(config) as bk:
            raise_process_settings(options.gc_threshold, options.switch_interval_us)
            if options.add_messages_inflight is not None:  # the driver reads it each turn
                bk.driver.call(setattr, bk.driver.outbound, "add_messages_inflight",
                               options.add_messages_inflight).result(START_TIMEOUT_S)
            inflight = max(1, options.inflight // options.ledgers)  # shared by the ledgers
            bk.config = dataclasses.replace(bk.config, inflight_adds_max=inflight)
            payloads = _payloads(options.size, index)
            handles = [bk.create_ledger(options.ensemble, options.write_quorum,
                                        options.ack_quorum, password=PASSWORD)
                       for _ in range(options.ledgers)]
            lh = handles[0] if len(handles) == 1 else RoundRobin(handles)
            try:
                result = _prepare_and_run(kind, bk, lh, options, payloads, ready, go, index)
                result["add_messages_inflight"] = bk.driver.outbound.add_messages_inflight
                ready.put(("looped", index, None))  # the bookies' CPU stops counting here
            finally:
                for handle in handles:
                    _cleanup(bk, handle)
        done.put(("done", index, result))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which fails the run
        done.put(("error", index, f"{type(exc).__name__}: {exc}"))
        ready.put(("error", index, f"{type(exc).__name__}: {exc}"))


def _prepare_and_run(kind, bk, lh, options, payloads, ready, go, index) -> dict:
    warmup = min(WARMUP_ADDS, options.entries)
    if kind == "write":
        write_loop(lh, payloads, warmup, 0.0, None)  # untimed
        ready.put(("ready", index, None))
        _wait_go(go)
        rate = options.rate / options.clients
        if options.add_batch > 1:
            return write_batches_loop(lh, payloads, options.entries, options.add_batch,
                                      options.duration_s, options.sample_every)
        return write_loop(lh, payloads, options.entries, rate, options.duration_s,
                          options.sample_every)
    write_loop(lh, payloads, options.entries, 0.0, None, sample_every=1024)
    lh.close()
    rh = bk.open_ledger(lh.id, password=PASSWORD)
    ready.put(("ready", index, None))
    _wait_go(go)
    if options.read_chunks:
        return read_chunks_loop(rh, payloads, options.entries, options.duration_s)
    return read_loop(rh, payloads, options.entries, options.read_batch, options.duration_s)


class RoundRobin:
    """Several write handles as one for the write loops: each add (or
    batch of adds) goes to the next ledger in turn."""

    def __init__(self, handles):
        self.handles, self._next = handles, 0
        self._last: dict[int, object] = {}  # handle index -> its last future

    def _take(self) -> int:
        index = self._next
        self._next = (self._next + 1) % len(self.handles)
        return index

    def add_async(self, payload):
        index = self._take()
        fut = self._last[index] = self.handles[index].add_async(payload)
        return fut

    def add_many_async(self, payloads):
        index = self._take()
        futs = self.handles[index].add_many_async(payloads)
        self._last[index] = futs[-1]
        return futs

    def last_futures(self) -> list:
        """Each ledger's last add: acks are in order per ledger only."""
        return list(self._last.values())


def _wait_go(go) -> None:
    if not go.wait(START_TIMEOUT_S + 60.0):
        raise TimeoutError("the parent never released the clients")


def _cleanup(bk, lh) -> None:
    try:
        lh.close()
        bk.delete_ledger(lh.id)
    except Exception:  # noqa: BLE001 - a failed run already reported its own error
        pass


def _payloads(size: int, salt: int) -> list[bytes]:
    """64 distinct payloads (entry i carries payloads[i % 64]): reads can be
    checked, and nothing is built per add."""
    rng = np.random.default_rng(1000 + salt)
    return [rng.integers(0, 256, size, dtype=np.uint8).tobytes() for _ in range(64)]


class _Times:
    """A float64 array that grows in chunks (its index is the entry number)."""

    def __init__(self):
        self.chunks: list[np.ndarray] = []

    def set(self, i: int, value: float) -> None:
        c = i >> CHUNK_BITS
        while c >= len(self.chunks):
            self.chunks.append(np.full(1 << CHUNK_BITS, np.nan))
        self.chunks[c][i & ((1 << CHUNK_BITS) - 1)] = value

    def array(self, n: int) -> np.ndarray:
        return np.concatenate(self.chunks)[:n] if self.chunks else np.empty(0)


def _wait_all(lh, last) -> None:
    """``_wait_last`` of every ledger the loop wrote (``RoundRobin``)."""
    for fut in (lh.last_futures() if isinstance(lh, RoundRobin) else [last]):
        _wait_last(fut)


def _wait_last(last) -> None:
    """Wait for the last add: acks are in order, so its callbacks run after
    every earlier one's, and it fails if any add failed."""
    if last is None:
        return
    all_done = threading.Event()
    last.add_done_callback(lambda _: all_done.set())
    all_done.wait(CLIENT_TIMEOUT_S)
    error = last.exception()
    if error is not None:
        raise RuntimeError(f"adds failed: {type(error).__name__}: {error}")


def _result(start: float, count: int, size: int, cpu0: float, sent, done) -> dict:
    """One client's raw figures, the loop just ended."""
    return {"start": start, "end": time.perf_counter(), "count": count,
            "bytes": count * size, "cpu_s": time.process_time() - cpu0,
            "sent": np.asarray(sent), "done": np.asarray(done),
            "gc_threshold0": gc.get_threshold()[0],
            "switch_interval_us": round(sys.getswitchinterval() * 1e6)}


def _done_recorder(done: _Times):
    """The one callback every timed add of a loop shares, and the map it
    reads: ``samples[id(future)] = k`` before the callback is attached, and
    the callback records sample ``k``'s completion time.  Nothing is made
    per add (a ``functools.partial`` per timed add was an object in flight
    per add, for the client's collector to promote and scan: timing every
    add made the client's full collections, and the latency spikes they
    cause, several times as frequent as the library alone makes them).  A
    future is alive until its callbacks ran, so its id is not reused before
    its entry is popped.  Failed adds are recorded too; the last future's
    check fails the run."""
    samples: dict[int, int] = {}

    def on_done(fut) -> None:
        done.set(samples.pop(id(fut)), time.perf_counter())

    return on_done, samples


def write_loop(lh, payloads: list[bytes], entries: int, rate: float, duration_s: float | None,
               sample_every: int = 1) -> dict:
    """Adds, at most the handle's ``inflight_adds_max`` in flight (its
    ``add_async`` blocks beyond); open loop at ``rate``/s if > 0.  The
    latency of every ``sample_every``-th add is recorded."""
    sent, done = _Times(), _Times()
    on_done, samples = _done_recorder(done)

    cpu0, start = time.process_time(), time.perf_counter()
    stop_at = start + duration_s if duration_s else float("inf")
    interval = 1.0 / rate if rate > 0 else 0.0
    n = k = 0
    last = None
    while n < entries:
        now = time.perf_counter()
        if now >= stop_at:
            break
        due = start + n * interval
        if due > now:
            time.sleep(max(due - now, OPEN_LOOP_WAKE_S))
        last = lh.add_async(payloads[n & 63])
        if n % sample_every == 0:
            sent.set(k, due if interval else time.perf_counter())
            samples[id(last)] = k
            last.add_done_callback(on_done)
            k += 1
        n += 1
    _wait_all(lh, last)
    return _result(start, n, len(payloads[0]), cpu0, sent.array(k), done.array(k))


def write_batches_loop(lh, payloads: list[bytes], entries: int, batch: int,
                       duration_s: float | None, sample_every: int = 1) -> dict:
    """Closed loop with ``WriteHandle.add_many_async`` calls of ``batch``
    payloads (it blocks while the handle's in-flight limits are reached);
    latency of every ``sample_every``-th add, from the call that queued it."""
    sent, done = _Times(), _Times()
    on_done, samples = _done_recorder(done)

    cpu0, start = time.process_time(), time.perf_counter()
    stop_at = start + duration_s if duration_s else float("inf")
    n = k = 0
    last = None
    while n < entries and time.perf_counter() < stop_at:
        count = min(batch, entries - n)
        t0 = time.perf_counter()
        futs = lh.add_many_async([payloads[(n + i) & 63] for i in range(count)])
        for i in range(-n % sample_every, count, sample_every):
            sent.set(k, t0)
            samples[id(futs[i])] = k
            futs[i].add_done_callback(on_done)
            k += 1
        last = futs[-1]
        n += count
    _wait_all(lh, last)
    return _result(start, n, len(payloads[0]), cpu0, sent.array(k), done.array(k))


def read_loop(rh, payloads: list[bytes], entries: int, batch: int,
              duration_s: float | None) -> dict:
    """Read entries 0..entries-1 back in calls of ``batch``; spot-check them."""
    last_entry = min(entries, rh.last_add_confirmed + 1) - 1
    sent, done = [], []
    cpu0, start = time.process_time(), time.perf_counter()
    stop_at = start + duration_s if duration_s else float("inf")
    count = 0
    for first in range(0, last_entry + 1, batch):
        if time.perf_counter() >= stop_at:
            break
        last = min(first + batch - 1, last_entry)
        t0 = time.perf_counter()
        got = rh.read(first, last)
        done.append(time.perf_counter())
        sent.append(t0)
        _check_read(got, first, last, payloads)
        count += len(got)
    return _result(start, count, len(payloads[0]), cpu0, sent, done)


def read_chunks_loop(rh, payloads: list[bytes], entries: int, duration_s: float | None) -> dict:
    """Read entries 0..entries-1 back with ``ReadHandle.read_chunks`` (one
    call, chunks of one buffer each); latency is per chunk (time since the
    previous one); order, count and sampled bytes are checked."""
    last_entry = min(entries, rh.last_add_confirmed + 1) - 1
    sent, done = [], []
    cpu0, start = time.process_time(), time.perf_counter()
    stop_at = start + duration_s if duration_s else float("inf")
    count, prev = 0, start
    for chunk in rh.read_chunks(0, last_entry):
        now = time.perf_counter()
        sent.append(prev)
        done.append(now)
        prev = now
        if chunk.first_entry_id != count:
            raise RuntimeError(f"chunk starts at {chunk.first_entry_id}, expected {count}")
        data = bytes(chunk.payloads)
        for i in (0, chunk.count // 2, chunk.count - 1):
            entry = chunk.first_entry_id + i
            if data[chunk.offsets[i]:chunk.offsets[i + 1]] != payloads[entry & 63]:
                raise RuntimeError(f"entry {entry} came back with other bytes")
        count += chunk.count
        if now >= stop_at:
            break
    return _result(start, count, len(payloads[0]), cpu0, sent, done)


def _check_read(got, first: int, last: int, payloads: list[bytes]) -> None:
    if len(got) != last - first + 1 or got[0].entry_id != first or got[-1].entry_id != last:
        raise RuntimeError(f"read {first}..{last} returned {len(got)} entries "
                           f"({got[0].entry_id if got else None}..)")
    for e in (got[0], got[len(got) // 2], got[-1]):
        if e.payload != payloads[e.entry_id & 63]:
            raise RuntimeError(f"entry {e.entry_id} came back with other bytes")


# -- results ---------------------------------------------------------------------------
RESULT_KEYS = ("mb_per_s", "p50_ms", "p95_ms", "p99_ms", "p999_ms",
               "client_cpu_s_per_1000_entries", "bookie_cpu_s_per_1000_entries",
               "bookie_peak_rss_mb")


def summarise(kind: str, options: BenchOptions, results: list[dict], bookie_cpu_s: float,
              peak_rss_mb: float | None) -> dict:
    """The results document from the clients' raw timings."""
    count = sum(r["count"] for r in results)
    wall_s = max(r["end"] for r in results) - min(r["start"] for r in results)
    latency_ms = np.concatenate([(r["done"] - r["sent"]) * 1000.0 for r in results])
    p50, p95, p99, p999 = (np.percentile(latency_ms, [50, 95, 99, 99.9]).tolist()
                           if len(latency_ms) else [None] * 4)
    per_1000 = 1000.0 / count if count else float("nan")
    rate_key = "adds_per_s" if kind == "write" else "reads_per_s"
    return {
        rate_key: count / wall_s, "mb_per_s": sum(r["bytes"] for r in results) / wall_s / 1e6,
        "p50_ms": p50, "p95_ms": p95, "p99_ms": p99, "p999_ms": p999,
        "client_cpu_s_per_1000_entries": sum(r["cpu_s"] for r in results) * per_1000,
        "bookie_cpu_s_per_1000_entries": bookie_cpu_s * per_1000,
        "bookie_peak_rss_mb": peak_rss_mb,
        # Python's youngest-generation GC threshold in the clients (700 unless raised)
        "client_gc_threshold0": min(r["gc_threshold0"] for r in results),
        # Python's thread switch interval in the clients (5,000 us unless raised)
        "client_switch_interval_us": min(r["switch_interval_us"] for r in results),
        # the client driver's hold of fresh adds per bookie ([client] add_messages_inflight)
        "client_add_messages_inflight": min(r["add_messages_inflight"] for r in results),
        "kind": kind, "entries": count, "wall_s": wall_s, "latency_samples": len(latency_ms),
        "latency_unit": "add" if kind == "write" else (
            "read_chunks() chunk" if options.read_chunks
            else f"read() call of {options.read_batch}"),
        "loop": "open" if options.rate > 0 else "closed",
        **{k: v for k, v in dataclasses.asdict(options).items() if k != "entries"},
    }


# -- plots -------------------------------------------------------------------------------
def _check_plot_path(path: str) -> None:
    if not str(path).lower().endswith(".png"):
        raise ValueError(f"--plot needs a .png file name, got {path!r}")
    parent = Path(path).resolve().parent
    if not parent.is_dir():
        raise ValueError(f"--plot: folder {parent} does not exist")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ValueError("--plot needs matplotlib (pip install -e '.[dev]')") from None


def plot(kind: str, results: list[dict], path: str, doc: dict) -> None:
    """Latency over time and a latency histogram, side by side, in one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = min(r["start"] for r in results)
    when = np.concatenate([r["done"] - t0 for r in results])
    latency_ms = np.concatenate([(r["done"] - r["sent"]) * 1000.0 for r in results])
    step = max(1, len(when) // PLOT_POINTS_MAX)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    left.scatter(when[::step], latency_ms[::step], s=1, alpha=0.4)
    left.set(xlabel="time since start (s)", ylabel="latency (ms)", yscale="log",
             title=f"{kind} latency over time")
    positive = latency_ms[latency_ms > 0]
    if len(positive):
        bins = np.logspace(np.log10(positive.min()), np.log10(positive.max()) + 1e-9, 60)
        right.hist(positive, bins=bins)
    right.set(xscale="log", xlabel="latency (ms)", ylabel="count", title="latency histogram")
    for q in ("p50_ms", "p99_ms", "p999_ms"):
        if doc.get(q):
            right.axvline(doc[q], linestyle="--", color="grey")
            right.text(doc[q], right.get_ylim()[1] * 0.9, q[:-3], rotation=90, fontsize=8)
    rate_key = "adds_per_s" if kind == "write" else "reads_per_s"
    fig.suptitle(f"bkctl bench {kind}: {doc[rate_key]:,.0f}/s, {doc['size']} B, "
                 f"E{doc['ensemble']}/W{doc['write_quorum']}/A{doc['ack_quorum']}, "
                 f"{doc['clients']} client(s), {doc['loop']} loop")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
