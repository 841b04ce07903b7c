"""The supervisor: starts, pins, watches, restarts and stops the bookies and
the log servers (``[log] servers``, ``appliance.logservice``) of one config.

    python -m appliance.supervisor --config configs/local.toml   # = bkctl up

Guarantees:

* Nothing starts unless the whole config is valid and the host can run it
  (``load_config`` + ``check_host``: one line naming the key and the fix).
* New bookie directories are formatted (cookies) before their bookie
  starts; formatted ones are never touched.
* One process per ``[[bookies]]`` table, in its own session (so a Ctrl-C on
  the terminal or the supervisor's death does not take bookies down with
  it), pinned to its ``cpus`` when the config lists some (default: not pinned), its
  output appended to ``<run_dir>/<id>.log``.
* Watch: a bookie that exits is restarted after a backoff that doubles
  from ``restart_backoff_min_ms`` to ``restart_backoff_max_ms``.  A starting
  bookie (journal replay, BP-46 phase one) is given ``start_timeout_ms`` to
  answer INFO for the first time; only once it has answered does
  ``ping_timeout_ms`` apply: one that then stops answering for that long is
  killed and restarted.  Replay time never counts as a hang; more
  than ``restarts_max`` restarts within ``restart_window_ms`` and it stays
  down (logged), so a broken disk does not spin.  A bookie that exits with
  ``EXIT_REFUSED`` (``appliance.bookie.exit_codes``: its cookies do not
  match, the config is wrong for it) is not restarted at all: a restart
  cannot change that.  Its refusal line (the last line of its log) is kept
  in ``last_exit.reason``, which ``bkctl status`` shows.
* Log servers (``logserver-1`` .. ``logserver-N``, endpoints ipc:// in the
  run folder) are watched and restarted by the same rules, judged by their
  PING answer (``appliance.logservice.probe``) instead of INFO; they are
  started after the bookies and stopped before them (their logs close
  cleanly while the bookies still run).
* Operator requests (``control.py``: ``bkctl bookie start|stop|restart
  ID``, ``bkctl log-server ...``, ``bkctl bookie fix-cookie ID``) act on
  one process; the others are not touched.  ``stop``: SIGTERM, SIGKILL
  after ``stop_timeout_ms``; the process is then *stopped by the operator*:
  not restarted, not counted as a failure (``last_exit.by_operator``).
  ``start``: a process that is down (stopped, left down after a refusal or
  too many restarts) is started at once, its restart window and backoff
  cleared.  ``restart``: ``stop``, then ``start`` once it has exited.
  Operator restarts are not counted in ``restarts`` (failures only).
* A log server whose process exits (SIGCHLD wakes the watch at once) is
  dead, not silent: its registration and the leases of the logs it owned
  are deleted from the metadata store then (only its session's nodes), so
  its logs move to a live server and its restart registers without
  waiting for its session to expire (``session_timeout_ms``, which stays
  the rule for a server that is only silent or on another host).
* SIGTERM / SIGINT: every log server, then every bookie, gets SIGTERM (clean shutdown: checkpoint
  and marker), then SIGKILL after ``stop_timeout_ms``.
* One thread owns the process table (every ``_Bookie`` and the state
  file) and the metadata store it opens for dead log servers: the thread
  in ``run()``, which watches, answers operator requests between watches,
  and stops everything.  ``stop()`` and ``child_exited()`` (signal
  handlers, or another thread) only set an event and wake it.
* ``<run_dir>/supervisor.json`` (owner-only, replaced atomically) names the
  supervisor and bookie pids, for ``bkctl down`` / ``status``, and each
  bookie's runs (``runs.py``: restarts since ``bkctl up``, when its process
  started, how the last one ended); a second supervisor on the same config is
  refused while the first lives, and bookies left running by a supervisor
  that died are adopted, not started twice.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from appliance.bookie.exit_codes import EXIT_REFUSED
from appliance.config import load_config
from appliance.config.host_checks import check_host
from appliance.errors import BKError, ConfigError
from appliance.logservice.probe import log_server_info
from appliance.meta.logservice import LogServiceRegistry
from appliance.protocol import limits
from appliance.supervisor.control import ControlSocket
from appliance.supervisor.probe import bookie_info, probe_curve
from appliance.supervisor.runs import exit_record
from storage import LedgerStorage
from storage.aligned_io import make_dirs, write_file_atomic
from storage.metadata import open_store

log = logging.getLogger("appliance.supervisor")

STATE_FILE = "supervisor.json"
START_TIME_SLACK_S = 1.0  # a recycled pid started at another time is not ours


def state_path(config) -> Path:
    return config.run_path / STATE_FILE


def read_state(config) -> dict | None:
    try:
        return json.loads(state_path(config).read_text())
    except (OSError, ValueError):
        return None


def pid_alive(pid: int | None, marker: str | None = None) -> bool:
    """Is ``pid`` a live process (and, with ``marker``, one whose command
    line contains it: a recycled pid is not ours)?"""
    if not pid:
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return marker is None or marker in " ".join(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def supervisor_alive(state: dict | None) -> bool:
    """Does the supervisor a state file names still run?  Judged by its pid
    and its start time, whatever its command line: ``bkctl up`` runs it in
    its own process, ``bkctl up --detach`` as ``python -m
    appliance.supervisor``.  A state without a start time (written before
    it was recorded) falls back to the command line."""
    if not state or not state.get("pid"):
        return False
    started = state.get("started")
    if started is None:
        return pid_alive(state["pid"], "appliance.supervisor")
    try:
        proc = psutil.Process(state["pid"])
        return proc.status() != psutil.STATUS_ZOMBIE and \
            abs(proc.create_time() - started) < START_TIME_SLACK_S
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def format_new_bookies(config) -> list[str]:
    """Format every bookie whose directories hold no cookie yet."""
    formatted = []
    for b in config.bookies:
        journal, ledgers = Path(b.journal_dir), Path(b.ledger_dir)
        if (journal / "COOKIE").exists() or (ledgers / "COOKIE").exists():
            continue  # formatted before: open() verifies both cookies
        make_dirs(journal)
        make_dirs(ledgers)
        LedgerStorage.format(b.id, journal, ledgers, config.storage.to_options())
        formatted.append(b.id)
    return formatted


class _LogServerSpec:
    """What the supervisor needs of a log server: like a bookie's table."""

    def __init__(self, server_id: str, endpoint: str):
        self.id, self.endpoint, self.cpus = server_id, endpoint, ()


class _Bookie:
    """One supervised process (a bookie, or a log server: ``kind``): its
    process (a child, or adopted) and its restart bookkeeping."""

    def __init__(self, spec, index: int, kind: str = "bookie"):
        self.spec = spec
        self.kind = kind
        self.cpus = list(spec.cpus)  # empty: not pinned (may use any allowed CPU)
        self.popen: subprocess.Popen | None = None
        self.pid: int | None = None
        self.restarts: list[float] = []  # restart times within restart_window_ms
        self.restart_count = 0  # every restart since this supervisor started
        self.started_at: float | None = None  # wall clock (epoch s) of the current process
        self.last_exit: dict | None = None  # runs.exit_record of the last process
        self.next_start_s = 0.0
        self.backoff_ms = 0
        self.last_answer_s = 0.0
        self.started_s = 0.0  # spawn (or adoption) time
        self.serving = False  # answered INFO since that: liveness pings apply from then
        self.given_up = False
        self.held = False  # stopped by the operator: left down until an operator start
        self.start_when_stopped = False  # an operator restart: start once it has exited
        self.stop_deadline_s = 0.0  # an operator stop: SIGKILL after this

    def alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        return pid_alive(self.pid, self.spec.id)


class Supervisor:
    """See the module docstring.  ``run()`` blocks until ``stop()``."""

    def __init__(self, config, *, clock=time.monotonic, wall_clock=time.time):
        self.config = config
        self.clock = clock
        self.wall_clock = wall_clock  # epoch seconds: start and exit times users see
        self.sup = config.supervisor
        self.bookies = [_Bookie(b, i) for i, b in enumerate(config.bookies)]
        self.log_servers = [
            _Bookie(_LogServerSpec(sid, config.log_server_endpoint(sid)), i, "log server")
            for i, sid in enumerate(config.log_server_ids())]
        self._stop = threading.Event()
        self._control: ControlSocket | None = None  # bound in run()
        self._child_exited = threading.Event()  # set by SIGCHLD (child_exited)
        self._store = None  # the metadata store, opened when a log server first exits
        self._probe_curve = probe_curve(config)  # CURVE pings to tcp bookies (or None)

    # -- start ------------------------------------------------------------------
    def prepare(self) -> None:
        check_host(self.config)
        state = read_state(self.config)
        if supervisor_alive(state) and state.get("pid") != os.getpid():
            raise ConfigError(f"{self.config.path}: an appliance supervisor (pid {state['pid']}) "
                              "already runs this config; stop it with `bkctl down`")
        make_dirs(self.config.run_path)
        for bookie_id in format_new_bookies(self.config):
            log.info("formatted new bookie %s", bookie_id)
        old = {**(state or {}).get("bookies", {}), **(state or {}).get("log_servers", {})}
        for b in self._processes():
            pid = old.get(b.spec.id)
            if pid_alive(pid, b.spec.id):
                b.pid = pid  # left running by a supervisor that died: adopt it
                b.started_s = b.last_answer_s = self.clock()
                b.started_at = _create_time(pid) or self.wall_clock()
                log.info("adopted running %s %s (pid %d)", b.kind, b.spec.id, pid)

    def _processes(self) -> list[_Bookie]:
        return self.bookies + self.log_servers

    def start_all(self) -> None:
        for b in self._processes():
            if not b.alive():
                self._spawn(b)
        self._write_state()

    def _spawn(self, b: _Bookie) -> None:
        module = "appliance.bookie" if b.kind == "bookie" else "appliance.logservice"
        cmd = [sys.executable, "-m", module, "--config", str(self.config.path),
               "--id", b.spec.id]
        with open(self.config.run_path / f"{b.spec.id}.log", "ab") as out:
            b.popen = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out,
                                       stderr=subprocess.STDOUT, start_new_session=True)
        b.pid = b.popen.pid
        b.started_s = b.last_answer_s = self.clock()
        b.started_at = self.wall_clock()
        b.serving = False  # judged by start_timeout_ms until it answers
        if b.cpus:
            try:
                psutil.Process(b.pid).cpu_affinity(b.cpus)
            except (psutil.Error, ValueError) as exc:
                log.warning("could not pin %s to CPUs %s: %s", b.spec.id, b.cpus, exc)
        log.info("started %s %s (pid %d, cpus %s)", b.kind, b.spec.id, b.pid, b.cpus or "any")

    def _write_state(self) -> None:
        doc = {"pid": os.getpid(), "started": psutil.Process().create_time(),
               "config": str(self.config.path),
               "bookies": {b.spec.id: b.pid for b in self.bookies if b.pid},
               "log_servers": {b.spec.id: b.pid for b in self.log_servers if b.pid},
               "runs": {b.spec.id: {"pid": b.pid, "started_at": b.started_at,
                                    "restarts": b.restart_count, "last_exit": b.last_exit,
                                    "given_up": b.given_up, "stopped_by_operator": b.held}
                        for b in self._processes()}}
        write_file_atomic(str(state_path(self.config)),
                          [json.dumps(doc, sort_keys=True).encode()], fsync_parent=False)

    # -- watch ------------------------------------------------------------------
    def run(self) -> None:
        self.prepare()
        self._control = ControlSocket(self.config)
        if self._control.unavailable:
            log.warning("no operator requests (bkctl bookie stop|start|restart): %s",
                        self._control.unavailable)
        try:
            self.start_all()
            next_watch_s = self.clock() + self.sup.ping_interval_ms / 1000.0
            while not self._stop.is_set():
                self._control.wait(int((next_watch_s - self.clock()) * 1000), self.control)
                if self._handle_exits():
                    next_watch_s = self._next_watch(next_watch_s)
                if self.clock() >= next_watch_s and not self._stop.is_set():
                    self.watch_once()
                    next_watch_s = self._next_watch(
                        self.clock() + self.sup.ping_interval_ms / 1000.0)
        finally:
            try:
                self.stop_all()
            finally:
                self._control.close()
                if self._store is not None:
                    self._store.close()

    def watch_once(self) -> None:
        """One look at every process.  A change of one process's run (an
        exit seen, a new process) is written to the state file at once,
        before the next process is pinged: a ping can take up to a second,
        and a restarted bookie that answers ``bkctl status`` before its run
        record is written would show its new pid with the old restart
        count.  Exits and due restarts are seen before any live process is
        pinged, and an exit signalled during the pings before the next one:
        neither a restart nor the release of a dead log server's leases
        waits behind the pings of the others (each can take up to a second
        from a busy process; a failover run saw the release 1,030 ms after
        the kill)."""
        now = self.clock()
        live = []
        for b in self._processes():  # exits and due restarts first: no ping delays them
            if b.held:
                if self._watch_held(b, now):
                    self._write_state()
            elif b.given_up:
                continue
            elif b.alive():
                live.append(b)
            elif self._maybe_restart(b, now):
                self._write_state()
        for b in live:
            self._handle_exits()  # an exit signalled meanwhile: not behind the pings
            self._check_alive(b, now)

    def _handle_exits(self) -> bool:
        """The exits signalled (SIGCHLD) since the last look, recorded now (a
        dead log server's leases released at once); True if there were."""
        if not self._child_exited.is_set() or self._stop.is_set():
            return False
        self._child_exited.clear()
        if self._see_exits():
            self._write_state()
        return True

    def _next_watch(self, at_s: float) -> float:
        """The next watch: at ``at_s``, or when a restart is due before it."""
        return min([at_s] + [b.next_start_s for b in self._processes()
                             if b.next_start_s and not b.held and not b.given_up])

    def _check_alive(self, b: _Bookie, now: float) -> None:
        """A starting bookie (replaying its journal, BP-46 phase one) is
        judged by ``start_timeout_ms`` until it first answers; only a serving
        one is judged by ``ping_timeout_ms``."""
        if self._answers(b):
            if not b.serving:
                b.serving = True
                log.info("%s %s (pid %s) serving after %d ms", b.kind, b.spec.id, b.pid,
                         (now - b.started_s) * 1000)
            b.last_answer_s = now
            b.backoff_ms = 0
        elif b.serving and now - b.last_answer_s > self.sup.ping_timeout_ms / 1000.0:
            log.warning("%s %s (pid %s) stopped answering for %d ms: killing it",
                        b.kind, b.spec.id, b.pid, self.sup.ping_timeout_ms)
            self._kill(b)
        elif not b.serving and now - b.started_s > self.sup.start_timeout_ms / 1000.0:
            log.warning("%s %s (pid %s) did not start serving within start_timeout_ms "
                        "(%d ms): killing it", b.kind, b.spec.id, b.pid, self.sup.start_timeout_ms)
            self._kill(b)

    def _answers(self, b: _Bookie) -> bool:
        timeout_ms = min(self.sup.ping_timeout_ms, 1000)
        if b.kind == "bookie":
            return bookie_info(b.spec.endpoint, timeout_ms, curve=self._probe_curve) is not None
        return log_server_info(b.spec.endpoint, timeout_ms, curve=self._probe_curve) is not None

    def _maybe_restart(self, b: _Bookie, now: float) -> bool:
        """Restart a bookie that exited, after its backoff; True when the
        state file needs writing (an exit seen, or a new process)."""
        changed = False
        if b.next_start_s == 0.0:
            code = self._record_exit(b)
            changed = True
            b.restarts = [t for t in b.restarts if now - t < self.sup.restart_window_ms / 1000]
            if code == EXIT_REFUSED:
                b.given_up = True
                b.last_exit["reason"] = _last_line(self.config.run_path / f"{b.spec.id}.log")
                log.error("bookie %s refused to start (%s); a restart cannot change that: "
                          "leaving it down", b.spec.id, b.last_exit["reason"])
                return True
            if len(b.restarts) >= self.sup.restarts_max:
                b.given_up = True
                log.error("%s %s exited (code %s) %d times within %d ms: leaving it down; "
                          "see %s", b.kind, b.spec.id, code, len(b.restarts),
                          self.sup.restart_window_ms, self.config.run_path / f"{b.spec.id}.log")
                return True
            b.backoff_ms = min(max(b.backoff_ms * 2, self.sup.restart_backoff_min_ms),
                               self.sup.restart_backoff_max_ms)
            b.next_start_s = now + b.backoff_ms / 1000.0
            log.warning("%s %s exited (code %s); restarting in %d ms", b.kind, b.spec.id, code,
                        b.backoff_ms)
        if now < b.next_start_s:
            return changed
        b.next_start_s = 0.0
        b.restarts.append(now)
        b.restart_count += 1
        self._spawn(b)
        return True

    def _record_exit(self, b: _Bookie) -> int | None:
        """The exit of ``b``'s process, seen now: its run record; its code.
        A log server's registration and leases go at once
        (``_forget_dead_log_server``)."""
        code = b.popen.returncode if b.popen is not None else None
        b.last_exit, b.pid, b.started_at = exit_record(code, self.wall_clock()), None, None
        if b.kind == "log server":
            self._forget_dead_log_server(b)
        return code

    def _forget_dead_log_server(self, b: _Bookie) -> None:
        """Its process exited (dead, not silent): its logs' leases and its
        registration go now, not when its metadata session expires
        (``session_timeout_ms``), so the logs move to a live server at once
        and its restart registers at once.  A failure leaves it to the
        session's expiry, as before."""
        try:
            if self._store is None:
                md = self.config.metadata
                self._store = open_store(md.uri, base_dir=self.config.base_dir,
                                         **md.store_options())
            released = LogServiceRegistry(self._store).forget_dead_server(b.spec.id)
        except (BKError, OSError) as exc:
            log.warning("log server %s exited; its leases end with its session "
                        "(session_timeout_ms): %s", b.spec.id, exc)
            return
        log.info("log server %s exited: its registration and the leases of %d log(s) "
                 "released at once", b.spec.id, len(released))

    def _see_exits(self) -> bool:
        """After SIGCHLD: record the exit of every process that exited (no
        ping of the live ones); restarts follow their backoff as usual.
        True when the state file needs writing."""
        changed = False
        now = self.clock()
        for b in self._processes():
            if not b.held and not b.given_up and b.pid is not None and not b.alive():
                changed = self._maybe_restart(b, now) or changed
        return changed

    def child_exited(self) -> None:
        """Signal-safe (SIGCHLD): ``run`` looks at the exits now, not at its
        next watch."""
        self._child_exited.set()
        if self._control is not None:
            self._control.wake()

    # -- operator requests (control.py) -------------------------------------------
    def control(self, op: str, process_id: str) -> dict:
        """One operator request: ``start``, ``stop`` or ``restart`` the process
        ``process_id``; the reply document (``control.py``)."""
        b = next((p for p in self._processes() if p.spec.id == process_id), None)
        if b is None:
            known = ", ".join(p.spec.id for p in self._processes())
            return {"ok": False, "error": f"{self.config.path} has no bookie or log server "
                                          f"{process_id!r} (it has {known})"}
        was_pid = b.pid
        if op in ("stop", "restart"):
            self._operator_stop(b)
        if op == "restart":
            b.start_when_stopped = True
        if op == "start" or (op == "restart" and not b.alive()):
            note = self._operator_start(b)
        elif op == "restart":
            note = "stopping; started again once its process has exited"
        else:
            note = "stopping" if b.alive() else "stopped"
        self._write_state()
        log.info("operator %s of %s %s: %s", op, b.kind, b.spec.id, note)
        return {"ok": True, "id": b.spec.id, "kind": b.kind, "pid": b.pid,
                "was_pid": was_pid, "note": note}

    def _operator_stop(self, b: _Bookie) -> None:
        """SIGTERM now, SIGKILL after ``stop_timeout_ms`` (``_watch_held``);
        left down until an operator start."""
        b.start_when_stopped = False
        if b.alive() and not b.held:
            _signal(b.pid, signal.SIGTERM)
            b.stop_deadline_s = self.clock() + self.sup.stop_timeout_ms / 1000.0
        b.held = True

    def _operator_start(self, b: _Bookie) -> str:
        """Start ``b`` now if it is down, whatever left it down."""
        if b.alive():
            if b.held:  # still stopping: started once it has exited
                b.start_when_stopped = True
                return "starting once its process has exited"
            return "already running"
        if b.pid is not None:  # its exit not seen by a watch yet
            self._record_exit(b)
            if b.held:
                b.last_exit["by_operator"] = True
        b.held = b.given_up = b.start_when_stopped = False
        b.restarts, b.backoff_ms, b.next_start_s = [], 0, 0.0
        self._spawn(b)
        return "started"

    def _watch_held(self, b: _Bookie, now: float) -> bool:
        """A process the operator stopped: killed past its stop deadline, its
        exit recorded once, started again if a restart asked for it.  True
        when the state file needs writing."""
        if b.alive():
            if now <= b.stop_deadline_s:
                return False
            log.warning("%s %s did not stop in %d ms: killing it", b.kind, b.spec.id,
                        self.sup.stop_timeout_ms)
            self._kill(b)
            if b.alive():  # not our child: gone by a later watch
                return False
        if b.start_when_stopped:
            self._operator_start(b)
            return True
        if b.pid is None:
            return False
        self._record_exit(b)
        b.last_exit["by_operator"] = True
        log.info("%s %s stopped by the operator: left down", b.kind, b.spec.id)
        return True

    # -- stop -------------------------------------------------------------------
    def stop(self) -> None:
        """Thread- and signal-safe: ``run`` stops its bookies and returns."""
        self._stop.set()
        if self._control is not None:
            self._control.wake()

    def stop_all(self) -> None:
        self._stop_group(self.log_servers)  # first: they close their logs on the bookies
        self._stop_group(self.bookies)
        state_path(self.config).unlink(missing_ok=True)
        log.info("appliance stopped")

    def _stop_group(self, group: list[_Bookie]) -> None:
        live = [b for b in group if b.alive()]
        for b in live:
            _signal(b.pid, signal.SIGTERM)
        deadline = self.clock() + self.sup.stop_timeout_ms / 1000.0
        while any(b.alive() for b in live) and self.clock() < deadline:
            time.sleep(0.05)
        for b in live:
            if b.alive():
                log.warning("%s %s did not stop in %d ms: killing it", b.kind, b.spec.id,
                            self.sup.stop_timeout_ms)
                self._kill(b)

    def _kill(self, b: _Bookie) -> None:
        _signal(b.pid, signal.SIGKILL)
        if b.popen is not None:
            b.popen.wait()


def _last_line(path: Path) -> str | None:
    """The last non-empty line of a bookie's log (its refusal), or None."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - limits.SUPERVISOR_REFUSAL_TAIL_BYTES_MAX))
            lines = f.read().decode(errors="replace").strip().splitlines()
    except OSError:
        return None
    return lines[-1].strip() if lines else None


def _create_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def _signal(pid: int | None, sig: int) -> None:
    if pid:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def main(argv: list[str] | None = None) -> int:
    os.umask(0o077)  # owner-only files and directories (docs/SECURITY.md); bookies inherit it
    parser = argparse.ArgumentParser(description="Run an appliance's bookies.")
    parser.add_argument("--config", required=True)
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    try:
        supervisor = Supervisor(load_config(args.config))
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: supervisor.stop())
        signal.signal(signal.SIGCHLD, lambda *_: supervisor.child_exited())
        supervisor.run()
    except BKError as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    return 0

