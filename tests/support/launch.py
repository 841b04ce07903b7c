"""pytest plugin and helpers: real processes for tests, over the one launcher
(``appliance.bench.launcher``: config writer, start, poll-until-ready, stop).

Kinds of process, each started, waited for and stopped the same way:

* ``Cluster``: bookie processes of one config (no supervisor), formatted and
  started under a short temp dir, ready once each wrote its ready file;
* a whole appliance as users run it (``bkctl up --detach``, see
  ``appliance_config``): its pids come from the supervisor's state file;
* ``fork_child``: a child forked from the test process itself (the kill -9
  crash test), ``Popen``-like so ``stop_process`` stops it too;
* ``tests.ipc.support.ServerProcess``: an in-memory bookie (``ipc.memserver``).

Fixtures: ``make_cluster`` / ``cluster`` / ``client`` and ``appliance_config``.
Every process a fixture started is killed after the test, also when it
fails.  No fixed TCP port (ipc:// under the temp dir), no blind sleep.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

import pytest

from appliance.bench import launcher
from appliance.bench.launcher import free_tcp_port, reap, stop_process, wait_for, wait_started

__all__ = ["Cluster", "ForkedChild", "fork_child", "free_tcp_port", "kill_pids", "reap",
           "stop_process", "swap_disks",
           "supervisor_pids", "wait_for", "wait_registered", "wait_started", "write_config"]

READY_TIMEOUT_S = 30.0  # a bookie: serving by then
STOP_TIMEOUT_S = 20.0  # a bookie: SIGTERM, then SIGKILL after this long
KILL_TIMEOUT_S = 30.0
TEST_METADATA = {"session_timeout_ms": 2000}  # a dead bookie leaves the registry quickly
TEST_CLIENT = {"add_timeout_ms": 5000, "read_timeout_ms": 5000}


def write_config(root: Path, n_bookies: int, metadata_uri: str = launcher.SQLITE_URI,
                 quorums: tuple[int, int, int] = (3, 3, 2), client: dict | None = None,
                 metadata: dict | None = None, **sections: dict) -> Path:
    """``root/appliance.toml``: ``n_bookies`` bookies, short metadata sessions,
    the client's ``quorums`` (ensemble, write, ack) and test timeouts, plus
    ``client`` and ``metadata`` knobs and other ``sections`` (``server={...}``, ...)."""
    e, w, a = quorums
    return launcher.write_config(
        root / "appliance.toml", n_bookies,
        metadata={"uri": metadata_uri, **TEST_METADATA, **(metadata or {})},
        client={"ensemble": e, "write_quorum": w, "ack_quorum": a, **TEST_CLIENT,
                **(client or {})}, **sections)


class Cluster:
    """Bookie processes of one config, started without the supervisor."""

    def __init__(self, root: Path, n_bookies: int = 4, **config_kwargs):
        from appliance.config import load_config

        self.root = Path(root)
        self.config_path = write_config(self.root, n_bookies, **config_kwargs)
        self.config = load_config(self.config_path)
        self.procs: dict[str, subprocess.Popen] = {}

    def format(self) -> None:
        from storage import LedgerStorage

        for b in self.config.bookies:
            if not (Path(b.journal_dir) / "COOKIE").exists():
                Path(b.journal_dir).mkdir(parents=True, exist_ok=True)
                Path(b.ledger_dir).mkdir(parents=True, exist_ok=True)
                LedgerStorage.format(b.id, b.journal_dir, b.ledger_dir,
                                     self.config.storage.to_options())

    def start_bookie(self, bookie_id: str, wait: bool = True,
                     config_path: Path | None = None) -> subprocess.Popen:
        """Start one bookie (with another config file if ``config_path``)."""
        ready = self._ready_file(bookie_id)
        ready.unlink(missing_ok=True)
        proc = launcher.spawn(
            [sys.executable, "-m", "appliance.bookie", "--config",
             str(config_path or self.config_path), "--id", bookie_id, "--ready-file", str(ready)],
            self._log_path(bookie_id))
        self.procs[bookie_id] = proc
        if wait:
            self._wait_ready(bookie_id)
        return proc

    def start(self) -> Cluster:
        self.format()
        for b in self.config.bookies:
            self.start_bookie(b.id, wait=False)
        for b in self.config.bookies:
            self._wait_ready(b.id)
        return self

    def _wait_ready(self, bookie_id: str) -> None:
        wait_started(self.procs[bookie_id], self._ready_file(bookie_id).exists, bookie_id,
                     self._log_path(bookie_id), READY_TIMEOUT_S)

    def _ready_file(self, bookie_id: str) -> Path:
        return self.root / f"{bookie_id}.ready"

    def _log_path(self, bookie_id: str) -> Path:
        return self.root / f"{bookie_id}.log"

    def log(self, bookie_id: str) -> str:
        return launcher.log_tail(self._log_path(bookie_id))

    def kill(self, bookie_id: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs.get(bookie_id)
        if proc is not None and proc.poll() is None:
            stop_process(proc, KILL_TIMEOUT_S, sig)

    def stop_bookie(self, bookie_id: str) -> int | None:
        """SIGTERM and wait; returns the exit code."""
        proc = self.procs.get(bookie_id)
        return None if proc is None else stop_process(proc, STOP_TIMEOUT_S)

    def stop(self) -> None:
        for bookie_id in list(self.procs):
            self.stop_bookie(bookie_id)

    def kill_all(self) -> None:
        for bookie_id in list(self.procs):
            self.kill(bookie_id)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def wait_registered(client, count: int, timeout_s: float = 15.0) -> None:
    wait_for(lambda: len(client.registry.available()) >= count, timeout_s,
             what=f"{count} bookies registered")


# -- a child forked from the test process -------------------------------------------------
class ForkedChild:
    """A forked child with Popen's ``pid``/``poll``/``send_signal``/``wait``.
    ``poll`` does not reap (``WNOWAIT``): until ``wait`` the pid stays this
    child's, so a late signal can never reach a process that reused it."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            return None if info is None else info.si_status
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)  # a zombie too: it is not reaped before wait()

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG if deadline else 0)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
            elif time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
            else:
                time.sleep(0.001)
        return self.returncode


def fork_child(body, *args) -> ForkedChild:
    """Run ``body(*args)`` in a forked child that never returns into pytest
    (exit code 0, or 3 with the traceback on stderr if it raised)."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            body(*args)
        except BaseException:
            code = 3
            traceback.print_exc()
        finally:
            os._exit(code)
    return ForkedChild(pid)


# -- fixtures -------------------------------------------------------------------------------
@pytest.fixture
def make_cluster(short_tmp):
    """Factory: ``make_cluster(n_bookies=4, start=True, **config)`` -> a
    Cluster (started).  Every cluster is killed after the test, also on failure."""
    started: list[Cluster] = []

    def make(n_bookies: int = 4, start: bool = True, **kwargs) -> Cluster:
        root = short_tmp / f"c{len(started)}"
        root.mkdir()
        c = Cluster(root, n_bookies, **kwargs)
        started.append(c)
        return c.start() if start else c

    yield make
    for c in started:
        c.kill_all()


@pytest.fixture
def cluster(make_cluster):
    return make_cluster(4)


@pytest.fixture
def client(cluster):
    import appliance

    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 4)
        yield bk


def supervisor_pids(config: Path) -> list[int]:
    """The supervisor's, its bookies' and its log servers' pids, from its
    state file ([] if none)."""
    from appliance.config import load_config

    path = load_config(config).run_path / "supervisor.json"
    if not path.exists():
        return []
    doc = json.loads(path.read_text())
    return [doc["pid"], *doc["bookies"].values(), *doc.get("log_servers", {}).values()]


@pytest.fixture
def appliance_config(short_tmp):
    """(config of 4 bookies, set of pids): for an appliance the test starts
    with ``bkctl up --detach``; every pid in the set or in the supervisor's
    state file is SIGKILLed after the test."""
    config = write_config(short_tmp, 4)
    seen: set[int] = set()
    yield config, seen
    seen.update(supervisor_pids(config))
    kill_pids(seen)


def swap_disks(bookie_row: dict) -> None:
    """A disk swap under a live bookie (a `bkctl status --json` row): frozen
    (SIGSTOP), both its directories replaced by new empty ones, then
    SIGKILLed; its supervisor finds it gone and restarts it."""
    os.kill(bookie_row["pid"], signal.SIGSTOP)
    for key in ("journal_dir", "ledger_dir"):
        shutil.rmtree(bookie_row[key])
        Path(bookie_row[key]).mkdir()
    os.kill(bookie_row["pid"], signal.SIGKILL)


def kill_pids(pids) -> None:
    """SIGKILL every pid that still exists."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
