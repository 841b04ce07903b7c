"""Where a failover's time goes, for ``bkctl bench log --producers N
--kill-owner`` (``appliance.bench.log_failover``): what the registry showed
and what the processes wrote in their logs, as wall-clock times (the
processes are on one host: one clock).

* ``RegistryWatch``: a thread of the bench's process reading the log's
  lease and the killed server's registration every ``poll_s``; its events
  are read once it stopped (the thread alone writes them until then).
* ``supervisor_events``, ``server_log_events``: the supervisor's and the
  log servers' log lines that mark a step (``%(asctime)s``, millisecond
  resolution), from a time on.
* ``timed_take_over``: the steps of a log server's take-over of a log
  (``OwnedLog._open``: ``LogWriter(tagged=True)``, then the duplicate
  filter's rebuild) done one by one in the bench's process and timed each:
  the log servers' logs mark only two of them.  It fences the log's owner:
  for the end of a run.
"""

from __future__ import annotations

import datetime
import re
import threading
import time
from pathlib import Path

from appliance.errors import BKError
from appliance.logs.writer import segment_end
from appliance.logservice.owned import learn_tail
from appliance.meta.logservice import LogServiceRegistry
from appliance.protocol import limits
from appliance.protocol.log_service import DedupTable
from appliance.protocol.logs import complete_segment, take_ownership

_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


class RegistryWatch:
    """The lease of ``log_name`` and the registration of ``server_id``
    (killed, pid ``pid``) as they change: ``events()`` after ``stop()``."""

    def __init__(self, store, log_name: str, server_id: str, pid: int, poll_s: float):
        self._registry = LogServiceRegistry(store)
        self._log, self._server, self._pid, self._poll_s = log_name, server_id, pid, poll_s
        self._stop = threading.Event()
        self._restarted = threading.Event()
        self._events: list[tuple[float, str, str | None]] = []  # the thread's until stop()
        self._thread = threading.Thread(target=self._run, name="failover-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def restarted(self) -> bool:
        """The killed server registered again (another pid)."""
        return self._restarted.is_set()

    def events(self) -> list[tuple[float, str, str | None]]:
        """(time, "lease" | "registration", the lease's server or the
        registration's pid, None when gone), once stopped."""
        if self._thread.is_alive():
            raise RuntimeError("the watch still runs")
        return list(self._events)

    def _run(self) -> None:
        lease = registered = "?"
        while not self._stop.wait(self._poll_s):
            try:
                now_lease = (self._registry.owner(self._log) or {}).get("server")
                now_reg = self._registry.servers().get(self._server, {}).get("pid")
            except BKError:
                continue  # the store busy a moment: look again
            seen = time.time()
            if now_lease != lease:
                lease = now_lease
                self._events.append((seen, "lease", now_lease))
            if now_reg != registered:
                registered = now_reg
                self._events.append((seen, "registration",
                                     None if now_reg is None else str(now_reg)))
                if now_reg not in (None, self._pid):
                    self._restarted.set()


def _stamped(path: Path, since: float):
    """(time, line) of each line of ``path`` stamped at ``since`` or later."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return
    for line in text.splitlines():
        found = _STAMP.match(line)
        if not found:
            continue
        when = datetime.datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if when >= since - 0.001:  # the stamp is cut to the millisecond
            yield when, line


def supervisor_events(path: Path, server_id: str, since: float) -> dict[str, float]:
    """The supervisor's "exited: ... released at once" and "started" lines
    for ``server_id`` (the first of each from ``since``)."""
    marks = {"supervisor_released": f"log server {server_id} exited:",
             "supervisor_restarted": f"started log server {server_id} "}
    out: dict[str, float] = {}
    for when, line in _stamped(path, since):
        for name, text in marks.items():
            if text in line and name not in out:
                out[name] = when
    return out


def server_log_events(path: Path, log_name: str, since: float) -> list[tuple[float, str]]:
    """A log server's lines from ``since`` that mark a take-over step of
    ``log_name`` ("recovered": the previous segment fenced and recovered;
    "owned": a new segment started and the duplicate filter rebuilt;
    "closed"/"handed": the log left) and its start ("serving")."""
    marks = ((f"log {log_name}: recovered segment", "recovered"),
             (f"log {log_name}: owned", "owned"),
             (f"log {log_name}: ", "other"),
             ("serving at", "serving"))
    out = []
    for when, line in _stamped(path, since):
        kind = next((k for text, k in marks if text in line), None)
        if kind == "other":
            kind = "left" if ("closed" in line or "hand" in line or "moved" in line) else None
        if kind is not None:
            out.append((when, kind))
    return out


def timed_take_over(bk, log_name: str) -> dict:
    """ms of each take-over step (see the module docstring): ``ownership``
    (the epoch's CAS), ``recovery`` (the owner's segment fenced, read to its
    end and closed), ``complete`` (its CAS), ``new_ledger`` (a segment's
    ledger created; deleted again), ``rebuild`` (the filter learnt from the
    segments of the last ``LOG_SERVICE_REBUILD_MS``), and ``records_learnt``."""
    marks = [time.perf_counter()]
    md, _ = bk.logs.update_log(log_name, lambda m: take_ownership(m, "bench-take-over"))
    marks.append(time.perf_counter())
    seg = md.in_progress
    if seg is not None:
        end = segment_end(bk, seg.seq, seg.ledger_id, b"")
        marks.append(time.perf_counter())
        bk.logs.update_log(log_name, lambda m: complete_segment(m, md.epoch, seg.seq, end))
    else:
        marks.append(time.perf_counter())
    marks.append(time.perf_counter())
    wh = bk.create_ledger(password=b"", custom={"log": log_name})
    marks.append(time.perf_counter())
    wh.close()
    bk.delete_ledger(wh.id, b"")
    md, _ = bk.logs.read_log(log_name)
    table = DedupTable(limits.LOG_SERVICE_PRODUCERS_MAX, limits.LOG_SERVICE_RECENT_MAX,
                       limits.LOG_SERVICE_PRODUCER_IDLE_MS)
    t0 = time.perf_counter()
    now_wall_ms = int(time.time() * 1000)
    tags = learn_tail(bk, md, now_wall_ms, b"")  # then learnt, as the owner core does (Opened)
    for producer_id, seq, position in tags:
        table.learn(producer_id, seq, tuple(position), now_wall_ms)
    learnt = len(tags)
    steps = [b - a for a, b in zip(marks, marks[1:], strict=False)] + [time.perf_counter() - t0]
    names = ("ownership", "recovery", "complete", "new_ledger", "rebuild")
    return {**{n: round(v * 1000, 1) for n, v in zip(names, steps, strict=True)},
            "records_learnt": learnt}
