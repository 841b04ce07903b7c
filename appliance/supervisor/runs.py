"""What the supervisor knows about each bookie's runs, as ``bkctl status``
and ``bkctl bookie info`` show it: how often it was restarted since ``bkctl
up``, since when its current process runs, and how its last process ended.

The supervisor keeps one record per bookie in its state file
(``supervisor.json``, key ``runs``)::

    {"pid": 4242, "started_at": 1796371200.5, "restarts": 1, "given_up": false,
     "last_exit": {"code": null, "signal": "SIGKILL", "at": "2026-11-27T08:00:00+00:00"}}

``last_exit`` of a bookie that refused to start (exit code 78) also has
``reason``, its refusal line; ``given_up`` is then true: it is left down.
A process stopped by the operator (``bkctl bookie stop ID``) has
``stopped_by_operator`` true while it is left down, and its ``last_exit``
has ``by_operator`` true: not a failure.

Pure functions over those records and the clock the caller passes; the one
look at the host (``process_started_at``) is for a bookie no supervisor
watches.
"""

from __future__ import annotations

import signal
from datetime import UTC, datetime

import psutil


def iso_time(epoch_s: float) -> str:
    """``epoch_s`` as an ISO 8601 UTC time, to the second."""
    return datetime.fromtimestamp(epoch_s, UTC).isoformat(timespec="seconds")


def exit_record(returncode: int | None, at_s: float) -> dict:
    """How a process ended: its exit ``code``, or the ``signal`` that killed
    it (a negative Popen return code), and ``at`` (when it was seen).  Both
    are None for a process the supervisor adopted (not its child)."""
    code = sig = None
    if returncode is not None and returncode < 0:
        try:
            sig = signal.Signals(-returncode).name
        except ValueError:
            sig = f"signal {-returncode}"
    else:
        code = returncode
    return {"code": code, "signal": sig, "at": iso_time(at_s)}


def describe_exit(last_exit: dict | None) -> str:
    """One phrase for people: ``SIGKILL at 2026-...``, ``code 3 at ...``, ``-``."""
    if not last_exit:
        return "-"
    if last_exit.get("signal"):
        how = last_exit["signal"]
    elif last_exit.get("code") is not None:
        how = f"code {last_exit['code']}"
    else:
        how = "exited (not a child of this supervisor: code unknown)"
    if last_exit.get("by_operator"):
        how = f"stopped by the operator ({how})"
    reason = last_exit.get("reason")
    return f"{how} at {last_exit['at']}" + (f": left down: {reason}" if reason else "")


def process_started_at(pid: int | None, marker: str) -> float | None:
    """When the local process ``pid`` started (epoch seconds), if it is one
    whose command line holds ``marker``; None otherwise."""
    if not pid:
        return None
    try:
        proc = psutil.Process(pid)
        if marker not in " ".join(proc.cmdline()):
            return None
        return proc.create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def supervision(state: dict | None, bookie_id: str, live_pid: int | None,
                now_s: float) -> dict:
    """``restarts``, ``uptime_s`` and ``last_exit`` of one bookie of this
    host.  ``live_pid``: the pid the bookie answered with (None: down).
    ``restarts`` and ``last_exit`` are None when no supervisor records the
    bookie (started by hand or by tests); ``uptime_s`` is then taken from
    the process itself."""
    run = ((state or {}).get("runs") or {}).get(bookie_id)
    out = {"restarts": None, "uptime_s": None, "last_exit": None, "left_down": None,
           "stopped_by_operator": None}
    if run is not None:
        out.update(restarts=run.get("restarts", 0), last_exit=run.get("last_exit"),
                   left_down=bool(run.get("given_up")),
                   stopped_by_operator=bool(run.get("stopped_by_operator")))
    if live_pid is None:
        return out
    started = run.get("started_at") if run and run.get("pid") == live_pid else None
    if started is None:
        started = process_started_at(live_pid, bookie_id)
    if started is not None:
        out["uptime_s"] = round(max(0.0, now_s - started), 1)
    return out
