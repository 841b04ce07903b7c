"""``bkctl bench log --producers N --kill-owner``: how long producers stall
when the log server owning their log is killed -9 (issue 46's failover aim:
the longest stall <= 1.5 s).

How it is counted:

* A temporary appliance (3 bookies, E3/W3/A2, ``[log] servers = 2``, its
  supervisor restarting what dies), N producer processes writing one log
  synchronously (``Producer.write``: each write waits for its DLSN), each
  record ``"<producer>:<i>:"`` padded to ``size`` bytes.  Every producer
  takes note of the time each write returned.
* ``kill_after_s`` (``--kill-after-seconds``, default ``KILL_AFTER_S``)
  after the producers start, the log's owner (its lease
  in the registry, its pid in its registration) is sent SIGKILL.  The run
  goes on until every producer wrote again, the killed server was
  restarted and registered, and ``SETTLE_S`` more passed (a hand-back of
  the log to the restarted server, if the hashing names it, falls in
  there), at most ``AFTER_KILL_MAX_S``.
* **longest_stall_ms**: the largest gap between two consecutive
  acknowledged writes of one producer, over the gaps that end after the
  kill (the one the kill falls in included), the largest of any producer;
  **stall_ms_per_producer** the same per producer.  **usual_gap_p99_ms**:
  the 99th percentile of the gaps before the kill (a write's usual time).
* **first_ack_after_kill_ms**: from the kill to the first write sent
  after it (its producer's previous write returned after the kill: a write
  whose reply was on its way at the kill does not count) that any producer
  got acknowledged; **all_resumed_ms**: to the time the last producer did.
* **lost** / **duplicated**: the log read back from its start: records
  whose write returned that are not in it, and records in it more than
  once (both must be 0); **out_of_order**: producers whose records are not
  in the order they wrote them.
* **timeline** (ms from the kill, ``None``: not seen): the supervisor saw
  the exit and released the leases (its log), the dead server's
  registration and the log's lease gone and every new lease (the bench
  polls the registry every ``WATCH_POLL_S``), the restarted server
  registered, each take-over's steps from the new owner's log (the
  previous segment recovered: fence and recovery; owned: a new segment
  started and the duplicate filter rebuilt), the producers' first "no
  answer", "moved" or "is gone" (their log), the first acknowledged write.
* **take_over_ms**: after the run, a take-over of the log (what a new
  owner does) done step by step in the bench's process, each step timed:
  the epoch's CAS, the owner's segment fenced and recovered, its
  completion's CAS, a new segment's ledger created, the duplicate filter
  rebuilt (``appliance.bench.failover_timeline.timed_take_over``), on the
  log as it is at the end of the run (a little longer than at the kill).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import signal
import time
from array import array
from pathlib import Path

import appliance
from appliance.bench.failover_timeline import (
    RegistryWatch,
    server_log_events,
    supervisor_events,
    timed_take_over,
)
from appliance.bench.launcher import reap, temporary_appliance, wait_for
from appliance.config import load_config
from appliance.meta.logservice import LogServiceRegistry

LOG_NAME = "bench-failover"
KILL_AFTER_S = 2.0  # the producers write this long before the kill
SETTLE_S = 3.0  # after every producer resumed and the restart registered
AFTER_KILL_MAX_S = 45.0  # the run ends this long after the kill whatever happened
START_TIMEOUT_S = 120.0  # every producer connected and its first record stored
SERVERS_TIMEOUT_S = 60.0
READ_TIMEOUT_S = 30.0  # a read of the log back that returns nothing this long: the end
WATCH_POLL_S = 0.005


def run_failover_bench(producers: int, size: int, workdir: str | None = None,
                       on_progress=lambda line: None,
                       kill_after_s: float = KILL_AFTER_S) -> dict:
    """See the module docstring."""
    with temporary_appliance(3, workdir, client={"ensemble": 3, "write_quorum": 3,
                                                 "ack_quorum": 2},
                             log={"servers": 2}) as (config, root):
        run_path = root / load_config(config).run_path  # absolute stays as it is
        with appliance.connect(str(config)) as bk:
            registry = LogServiceRegistry(bk.logs.store)
            wait_for(lambda: len(registry.servers()) >= 2, SERVERS_TIMEOUT_S, 0.05,
                     "the log servers")
            on_progress(f"{producers} producers writing log {LOG_NAME}; the owner is "
                        f"killed -9 after {kill_after_s} s")
            run = _run(str(config), registry, producers, size, kill_after_s)
            on_progress("reading the log back")
            check = _read_back(bk, run["acked"])
            on_progress("a take-over of the log, timed step by step")
            take_over = timed_take_over(bk, LOG_NAME)
        doc = _figures(run, check, producers, size)
        doc["kill_after_s"] = kill_after_s
        doc["timeline"] = _timeline(run, root / "supervisor.log", run_path, doc)
        doc["take_over_ms"] = take_over
    doc["load_average"] = [round(x, 2) for x in os.getloadavg()]
    return doc


def _run(config: str, registry, producers: int, size: int, kill_after_s: float) -> dict:
    """The producers' run with one kill of the owner; what each producer
    acknowledged (index, time), the kill's time and what the registry showed."""
    ctx = multiprocessing.get_context("spawn")
    results, go, killed, stop = ctx.Queue(), ctx.Event(), ctx.Event(), ctx.Event()
    procs = [ctx.Process(target=_producer_main, daemon=True,
                         args=(config, k, size, results, go, killed, stop))
             for k in range(producers)]
    for p in procs:
        p.start()
    watch = None
    try:
        _gather(results, procs, producers, "ready", START_TIMEOUT_S)
        go.set()
        time.sleep(kill_after_s)  # the producers write meanwhile: the run's length, not a wait
        owner = registry.owner(LOG_NAME)
        pid = registry.servers()[owner["server"]]["pid"]
        watch = RegistryWatch(registry.store, LOG_NAME, owner["server"], pid, WATCH_POLL_S)
        watch.start()
        killed_at = time.time()
        os.kill(pid, signal.SIGKILL)
        killed.set()
        _wait_recovered(results, procs, watch, killed_at)
        stop.set()
        docs = _gather(results, procs, producers, "done", AFTER_KILL_MAX_S)
    finally:
        go.set()
        stop.set()
        if watch is not None:
            watch.stop()
        reap(procs)
    return {"killed_at": killed_at, "owner": owner["server"], "pid": pid,
            "acked": {d["k"]: _floats(d["acked"]) for d in docs},
            "notices": [d["notices"] for d in docs], "errors": [d["error"] for d in docs
                                                                  if d["error"]],
            "registry": watch.events()}


def _floats(data: bytes) -> array:
    out = array("d")
    out.frombytes(data)
    return out


def _wait_recovered(results, procs, watch: RegistryWatch, killed_at: float) -> None:
    """Until every producer wrote after the kill and the killed server is
    registered again, then ``SETTLE_S`` more (at most ``AFTER_KILL_MAX_S``
    from the kill)."""
    resumed: set[int] = set()
    end = killed_at + AFTER_KILL_MAX_S
    settled_at = None
    while time.time() < end:
        try:
            kind, doc = results.get(timeout=0.05)
        except queue.Empty:
            _check_alive(procs)
        else:
            if kind == "failed":
                raise RuntimeError(f"a producer failed: {doc}")
            resumed.add(doc)
        if settled_at is None and len(resumed) == len(procs) and watch.restarted():
            settled_at = time.time()
            end = min(end, settled_at + SETTLE_S)


def _check_alive(procs) -> None:
    dead = [p.exitcode for p in procs if not p.is_alive() and p.exitcode]
    if dead:
        raise RuntimeError(f"a producer process exited {dead[0]}")


def _gather(results, procs, n: int, what: str, timeout_s: float) -> list:
    """``n`` messages of kind ``what`` (others, "resumed", are dropped)."""
    got, deadline = [], time.monotonic() + timeout_s
    while len(got) < n:
        try:
            kind, doc = results.get(timeout=0.5)
        except queue.Empty:
            _check_alive(procs)
            if time.monotonic() > deadline:
                raise RuntimeError(f"the producers were not {what} within {timeout_s} s") \
                    from None
            continue
        if kind == "failed":
            raise RuntimeError(f"a producer failed: {doc}")
        if kind == what:
            got.append(doc)
    return got


class _Notices(logging.Handler):
    """The producer's own words about finding the owner again, with their time."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.seen: list[tuple[float, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append((record.created, record.getMessage()))


def payload_of(k: int, i: int, size: int) -> bytes:
    head = f"{k}:{i}:".encode()
    return head + b"x" * max(0, size - len(head))


def _producer_main(config: str, k: int, size: int, results, go, killed, stop) -> None:
    """Write record after record until ``stop``; report ``("resumed", k)``
    once a write returned after ``killed`` was set."""
    notices = _Notices()
    logging.getLogger("appliance.logs").addHandler(notices)
    logging.getLogger("appliance.logs").setLevel(logging.INFO)
    try:
        with appliance.connect(config) as bk, bk.log(LOG_NAME).producer() as p:
            p.write(payload_of(k, 0, size))  # finds the owner, which takes the log
            acked, error, resumed = array("d", [time.time()]), None, False
            results.put(("ready", None))
            go.wait()
            while not stop.is_set():
                try:
                    p.write(payload_of(k, len(acked), size))
                except Exception as exc:  # noqa: BLE001 - reported; errors are sticky
                    error = f"{type(exc).__name__}: {exc}"
                    break
                acked.append(time.time())
                if not resumed and killed.is_set():
                    resumed = True
                    results.put(("resumed", k))
        results.put(("done", {"k": k, "acked": acked.tobytes(), "error": error,
                              "notices": notices.seen}))
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        results.put(("failed", f"{type(exc).__name__}: {exc}"))


# -- the figures ---------------------------------------------------------------------------
def _read_back(bk, acked: dict[int, array]) -> dict:
    """The log from its start: lost, duplicated, out of order (see the
    module docstring)."""
    expected = sum(len(a) for a in acked.values())
    seen: dict[int, list[int]] = {k: [] for k in acked}
    stored = 0
    with bk.log(LOG_NAME).reader() as r:
        while True:
            more = r.read(max_records=10_000,
                          timeout_s=READ_TIMEOUT_S if stored < expected else 0)
            if not more:
                break
            stored += len(more)
            for rec in more:
                k, i, _ = bytes(rec.payload).split(b":", 2)
                seen.setdefault(int(k), []).append(int(i))
    lost = duplicated = 0
    out_of_order = []
    for k, got in seen.items():
        distinct = set(got)
        duplicated += len(got) - len(distinct)
        lost += sum(1 for i in range(len(acked.get(k, ()))) if i not in distinct)
        if got != sorted(distinct):
            out_of_order.append(k)
    return {"stored": stored, "acknowledged": expected, "lost": lost,
            "duplicated": duplicated, "out_of_order": out_of_order}


def _gaps_ms(times: array, since: float) -> tuple[float, list[float]]:
    """(the largest gap ending after ``since``, the gaps before it), in ms."""
    longest, before = 0.0, []
    for a, b in zip(times, times[1:], strict=False):
        gap = (b - a) * 1000
        if b > since:
            longest = max(longest, gap)
        else:
            before.append(gap)
    return longest, before


def _figures(run: dict, check: dict, producers: int, size: int) -> dict:
    killed_at = run["killed_at"]
    stalls, before, firsts = {}, [], []
    for k, acked in sorted(run["acked"].items()):
        times = acked[1:]  # not the first record's (before the start signal)
        stalls[k], usual = _gaps_ms(times, killed_at)
        before += usual
        after = [b for a, b in zip(times, times[1:], strict=False) if a >= killed_at]
        firsts.append(after[0] if after else None)
    resumed = [t for t in firsts if t is not None]
    before.sort()
    return {"producers": producers, "size": size, "owner_killed": run["owner"],
            "longest_stall_ms": round(max(stalls.values()), 1),
            "stall_ms_per_producer": [round(v, 1) for v in stalls.values()],
            "usual_gap_p99_ms": round(before[int(len(before) * 0.99)], 2) if before else None,
            "first_ack_after_kill_ms": _ms(min(resumed), killed_at) if resumed else None,
            "all_resumed_ms": _ms(max(resumed), killed_at) if len(resumed) == producers
            else None,
            "records_acknowledged": check["acknowledged"], "records_stored": check["stored"],
            "lost": check["lost"], "duplicated": check["duplicated"],
            "out_of_order": check["out_of_order"], "errors": run["errors"]}


def _ms(when: float | None, zero: float) -> float | None:
    return None if when is None else round((when - zero) * 1000, 1)


def _timeline(run: dict, supervisor_log: Path, run_path: Path, doc: dict) -> dict:
    """The steps in ms from the kill (see the module docstring)."""
    zero, owner = run["killed_at"], run["owner"]
    sup = supervisor_events(supervisor_log, owner, zero)
    out = {name: _ms(when, zero) for name, when in sup.items()}
    out["registry"] = [[_ms(t, zero), what, value] for t, what, value in run["registry"]]
    for sid in ("logserver-1", "logserver-2"):
        out[sid] = [[_ms(t, zero), what] for t, what in
                    server_log_events(Path(run_path) / f"{sid}.log", LOG_NAME, zero)]
    noticed = [t for notices in run["notices"] for t, text in notices
               if t >= zero and any(w in text for w in ("no answer", "moved", "is gone"))]
    out["producers_noticed_first"] = _ms(min(noticed), zero) if noticed else None
    out["producers_noticed_last"] = _ms(max(noticed), zero) if noticed else None
    out["first_ack"] = doc["first_ack_after_kill_ms"]
    out["all_resumed"] = doc["all_resumed_ms"]
    return out
