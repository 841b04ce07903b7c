"""The one launcher of temporary appliances and the one config writer, used
by the benchmarks (``bkctl bench write|read|spark``) and, through
``tests/support/launch.py``, by the tests.

What it guarantees:

* **one config writer**: ``config_text`` lays out ``bookies`` bookies
  (``bookie-<i>``, journal ``b<i>/journal``, ledgers ``b<i>/ledgers``,
  endpoint ``ipc://b<i>.sock``, all relative to the config's folder, so no
  TCP port is ever fixed) and any knobs of the other sections;
* **one way to start a process and wait for it**: ``spawn`` starts it in a
  session of its own with its output in a log; ``wait_started`` polls a
  readiness check with a deadline (never a blind sleep) and raises, naming
  the tail of the log, if the process exits first or the deadline passes;
* **one way to stop it**: ``stop_process`` sends SIGTERM (or the signal
  given), waits a bounded time, then SIGKILLs (the whole process group when
  asked) and reaps; ``reap`` does the same for ``multiprocessing`` workers;
* **a temporary appliance** (``temporary_appliance``): a folder, a config, a
  supervisor with every bookie registered; at exit the supervisor is stopped
  and the folder removed, also on failure or Ctrl-C.

Bounds: every wait has a deadline (``START_TIMEOUT_S``, ``STOP_TIMEOUT_S`` or
the caller's).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import contextmanager
from pathlib import Path

import appliance

START_TIMEOUT_S = 60.0  # a temporary appliance: every bookie registered by then
STOP_TIMEOUT_S = 60.0  # SIGTERM, then SIGKILL after this long
REAP_TIMEOUT_S = 30.0  # a multiprocessing worker: joined, then killed after this long
POLL_INTERVAL_S = 0.05
LOG_TAIL_CHARS = 4000
SQLITE_URI = "sqlite:///meta.db"  # beside the config


# -- the config writer --------------------------------------------------------------
def config_text(bookies: int, **sections: Mapping[str, object]) -> str:
    """A config for ``bookies`` bookies in the config's folder, with the keys
    of ``sections`` (e.g. ``client={"ensemble": 3}``, ``server={...}``);
    ``[metadata] uri`` defaults to a SQLite file beside the config;
    ``every_bookie={...}`` adds keys to every ``[[bookies]]`` table,
    ``per_bookie=[{...}, ...]`` keys to the first ones, one dict each."""
    every_bookie = dict(sections.pop("every_bookie", {}))
    per_bookie = list(sections.pop("per_bookie", ()))
    sections = {"metadata": {"uri": SQLITE_URI, **sections.pop("metadata", {})}, **sections}
    parts = [_table("metadata", sections.pop("metadata"))]
    for i in range(1, bookies + 1):
        parts.append(_table("[bookies]", {"id": f"bookie-{i}", "journal_dir": f"b{i}/journal",
                                          "ledger_dir": f"b{i}/ledgers",
                                          "endpoint": f"ipc://b{i}.sock", **every_bookie,
                                          **(per_bookie[i - 1] if i <= len(per_bookie) else {})}))
    parts += [_table(name, keys) for name, keys in sections.items() if keys]
    return "\n".join(parts)


def write_config(path: Path, bookies: int, **sections: Mapping[str, object]) -> Path:
    """``config_text`` written to ``path``; returns ``path``."""
    path = Path(path)
    path.write_text(config_text(bookies, **sections))
    return path


def _table(name: str, keys: Mapping[str, object]) -> str:
    return f"[{name}]\n" + "".join(f"{key} = {_toml(value)}\n" for key, value in keys.items())


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str | Path):
        return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


# -- processes: start, wait until ready, stop ---------------------------------------
def wait_for(predicate: Callable[[], object], timeout_s: float = 10.0,
             interval_s: float = 0.01, what: str = ""):
    """Poll ``predicate`` until it returns a truthy value (returned) or the
    deadline passes (TimeoutError)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s}s waiting for {what or predicate}")
        time.sleep(interval_s)


def free_tcp_port() -> int:
    """A port the kernel just handed out (bind to 0), for servers that need a number."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log_tail(path: Path | None, chars: int = LOG_TAIL_CHARS) -> str:
    """The end of a log file ('no log' when there is none)."""
    try:
        return Path(path).read_text(errors="replace")[-chars:].strip() or "empty log"
    except (OSError, TypeError):
        return "no log"


def spawn(argv: list[str], log_path: Path | None = None, **popen_kwargs) -> subprocess.Popen:
    """Start ``argv`` in a session of its own, stdin closed, its output
    appended to ``log_path`` (when given; else as ``popen_kwargs`` say)."""
    popen_kwargs = {"stdin": subprocess.DEVNULL, "start_new_session": True, **popen_kwargs}
    if log_path is None:
        return subprocess.Popen(argv, **popen_kwargs)
    with open(log_path, "ab") as log:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, **popen_kwargs)


def wait_started(proc, ready: Callable[[], object], what: str, log_path: Path | None = None,
                 timeout_s: float = START_TIMEOUT_S, interval_s: float = 0.01) -> None:
    """Poll ``ready()`` until true; RuntimeError naming the log's tail if
    ``proc`` exits first or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited {proc.returncode}: {log_tail(log_path)}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start within {timeout_s:.0f}s: "
                               f"{log_tail(log_path)}")
        time.sleep(interval_s)


def stop_process(proc, timeout_s: float = STOP_TIMEOUT_S, sig: int = signal.SIGTERM,
                 group: bool = False) -> int | None:
    """Send ``sig`` if ``proc`` still runs, wait up to ``timeout_s``, then
    SIGKILL it (its whole process group if ``group``) and reap it; returns
    the exit code.  Works on anything with Popen's poll/send_signal/wait/pid."""
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        if group:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.send_signal(signal.SIGKILL)
        return proc.wait()


def reap(procs: Iterable, timeout_s: float = REAP_TIMEOUT_S) -> None:
    """Join every ``multiprocessing`` process; kill the ones still alive after
    ``timeout_s`` each."""
    for proc in procs:
        proc.join(timeout=timeout_s)
        if proc.is_alive():
            proc.kill()
            proc.join()


# -- a temporary appliance ----------------------------------------------------------
@contextmanager
def supervisor_running(config: Path, bookies: int, timeout_s: float = START_TIMEOUT_S):
    """A supervisor started on ``config``, yielded once ``bookies`` bookies
    registered; stopped with SIGTERM (its group killed after
    ``STOP_TIMEOUT_S``) at exit.  Its log: ``supervisor.log`` beside the config."""
    log = Path(config).parent / "supervisor.log"
    proc = spawn([sys.executable, "-m", "appliance.supervisor", "--config", str(config)], log)
    try:
        with appliance.connect(str(config)) as client:
            wait_started(proc, lambda: len(client.registry.available()) >= bookies,
                         "the temporary appliance", log, timeout_s, POLL_INTERVAL_S)
        yield proc
    finally:
        stop_process(proc, group=True)


@contextmanager
def temporary_appliance(bookies: int, workdir: str | os.PathLike | None = None,
                        prefix: str = "bkb", **sections: Mapping[str, object]):
    """Yield (config path, folder): a folder made under ``workdir`` (the temp
    dir by default), a config of ``bookies`` bookies and ``sections`` (the
    supervisor's run dir inside the folder) and its supervisor running; the
    folder is removed at exit, also on failure."""
    root = Path(tempfile.mkdtemp(prefix=prefix, dir=workdir))
    try:
        supervisor = {"run_dir": "run", **sections.pop("supervisor", {})}
        config = write_config(root / "bench.toml", bookies, **sections, supervisor=supervisor)
        with supervisor_running(config, bookies):
            yield config, root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def check_free_space(need_bytes: int, directory: str) -> None:
    """Refuse to start a run that would fill the disk (a full disk fails the
    bookies, and other users of the machine with them)."""
    free = shutil.disk_usage(directory).free
    if need_bytes * 1.2 > free:
        raise ValueError(f"this run needs about {need_bytes / 1e9:.1f} GB in {directory} and "
                         f"only {free / 1e9:.1f} GB are free: use fewer --entries or a smaller "
                         "--size, or --dir on a bigger disk")


def bookie_pids(config: str) -> dict[str, int]:
    """Live bookies of the appliance and their pids (from the registry)."""
    with appliance.connect(config) as client:
        live = client.registry.available()
    pids = {b: (doc.get("info") or {}).get("pid") for b, doc in live.items()}
    return {b: int(pid) for b, pid in pids.items() if pid}
