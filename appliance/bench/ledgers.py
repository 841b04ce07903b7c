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

Where it lives: this module is the parent (options, the temporary
appliance, starting and collecting the client processes);
``ledgers_client`` is a client process's body and loops, ``ledgers_results``
the results document and the plot.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil

from appliance.bench.compact_during import (
    CompactionDuring,
    drop_ledgers,
    during_figures,
    make_garbage,
)
from appliance.bench.launcher import (
    START_TIMEOUT_S,
    bookie_pids,
    check_free_space,
    reap,
    temporary_appliance,
)
from appliance.bench.ledgers_client import CLIENT_TIMEOUT_S, WARMUP_ADDS, client_main
from appliance.bench.ledgers_results import check_plot_path, plot, summarise
from appliance.errors import NotEnoughBookiesError
from appliance.protocol.metadata import check_quorums


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
    compact_during_mb: int = 0  # write: garbage made first, compacted during the run (0: off)
    compact_after_s: float = 2.0  # seconds into the run the major compaction is asked for
    compaction_rate: int | None = None  # temporary appliance: compaction_rate_bytes_per_s

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
        for name in ("compact_during_mb", "compact_after_s", "compaction_rate"):
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
    return (records * (options.size + 64) + options.compact_during_mb * 1_000_000) * copies \
        + options.bookies * SEGMENT_ROOM_BYTES


@contextmanager
def bench_appliance(options: BenchOptions, config_path: str | None, workdir: str | None):
    """Yield (config path, data dir or None): the given appliance, or a
    temporary one started here and stopped and removed at exit."""
    if config_path is not None:
        yield str(Path(config_path).resolve()), None
        return
    check_free_space(needed_bytes(options), workdir or tempfile.gettempdir())
    storage = {"journal_write_data": options.journal}
    if options.compaction_rate is not None:
        storage["compaction_rate_bytes_per_s"] = options.compaction_rate
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
    document (see the module docstring; keys in
    ``ledgers_results.RESULT_KEYS``)."""
    if kind not in ("write", "read"):
        raise ValueError(f"kind must be 'write' or 'read', got {kind!r}")
    options.validate()
    if plot_path is not None:
        check_plot_path(plot_path)
    with bench_appliance(options, config_path, workdir) as (config, root):
        baseline = _baseline(root, options.baseline_s)
        pids = bookie_pids(config)
        if len(pids) < options.ensemble:
            raise NotEnoughBookiesError(f"ensemble {options.ensemble} needs {options.ensemble} "
                                        f"live bookies; {len(pids)} are registered")
        garbage, kept, watch = 0, [], None
        if options.compact_during_mb and kind == "write":
            garbage, kept = make_garbage(config, options.compact_during_mb, options)
            watch = CompactionDuring(config, options.compact_after_s)
        results, bookie_cpu_s = _run_clients(kind, config, options, pids, during=watch)
        peak_rss_mb = _peak_rss_mb(pids)
        if kept:
            drop_ledgers(config, kept)
    doc = summarise(kind, options, results, bookie_cpu_s, peak_rss_mb)
    if watch is not None:
        doc.update(during_figures(results, watch, garbage))
    doc.update(baseline, appliance=config_path or f"temporary ({options.bookies} bookies)",
               bookies_measured=len(pids))
    if plot_path is not None:
        plot(kind, results, plot_path, doc)
        doc["plot"] = str(plot_path)
    return doc


def _baseline(root: Path | None, seconds: float) -> dict:
    if root is None or seconds <= 0:
        return {"disk_fdatasync_per_s": None, "disk_direct_mb_per_s": None}
    # on use: the bench's client processes import this module (BenchOptions), and
    # storage.bench is 72 modules (0.14 s) they never use (measured 2026-11-27)
    from storage.bench import disk_direct_mb_per_s, disk_fdatasync_per_s

    return {"disk_fdatasync_per_s": disk_fdatasync_per_s(str(root), seconds),
            "disk_direct_mb_per_s": disk_direct_mb_per_s(str(root), seconds)}


def _run_clients(kind: str, config: str, options: BenchOptions,
                 pids: dict[str, int], target=None, during=None) -> tuple[list[dict], float]:
    """Start the client processes, release them together, collect results;
    the bookies' CPU counts from the release until every client's loop
    ended (not its ledgers' close and delete after it).  ``target``: the
    client processes' body (``client_main``); ``during``: started with the
    clients, stopped once their loops ended (``compact_during.CompactionDuring``)."""
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
        if during is not None:
            during.start()
        _collect(ready, procs, CLIENT_TIMEOUT_S, "looped")
        if during is not None:
            during.stop()
        bookie_cpu_s = _cpu_s(pids) - cpu_before
        return _collect(done, procs, CLIENT_TIMEOUT_S, "done"), bookie_cpu_s
    except BaseException:
        for proc in procs:  # a failed run: the others may be waiting for "go"
            if proc.is_alive():
                proc.kill()
        raise
    finally:
        if during is not None:
            during.stop()
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
