"""A real appliance for tests: format and spawn bookie processes on ipc://
endpoints under a short temp dir; every process is killed by ``stop``.

Used as a context manager (or through the ``cluster`` fixture) so a failing
test still stops everything it started.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.helpers import wait_for

READY_TIMEOUT_S = 30.0


def write_config(root: Path, n_bookies: int, metadata_uri: str = "sqlite:///meta.db",
                 extra: str = "", client: tuple[int, int, int] = (3, 3, 2),
                 client_extra: str = "") -> Path:
    e, w, a = client
    parts = [f'[metadata]\nuri = "{metadata_uri}"\nsession_timeout_ms = 2000\n']
    for i in range(1, n_bookies + 1):
        parts.append(textwrap.dedent(f"""
            [[bookies]]
            id = "bookie-{i}"
            journal_dir = "b{i}/journal"
            ledger_dir = "b{i}/ledgers"
            endpoint = "ipc://b{i}.sock"
            """))
    parts.append(f"\n[client]\nensemble = {e}\nwrite_quorum = {w}\nack_quorum = {a}\n"
                 "add_timeout_ms = 5000\nread_timeout_ms = 5000\n" + client_extra + "\n")
    parts.append(extra)
    path = root / "appliance.toml"
    path.write_text("".join(parts))
    return path


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
        ready = self.root / f"{bookie_id}.ready"
        ready.unlink(missing_ok=True)
        log = open(self.root / f"{bookie_id}.log", "ab")
        proc = subprocess.Popen(
            [sys.executable, "-m", "appliance.bookie", "--config",
             str(config_path or self.config_path), "--id", bookie_id, "--ready-file", str(ready)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.procs[bookie_id] = proc
        if wait:
            wait_for(lambda: ready.exists() or proc.poll() is not None, READY_TIMEOUT_S,
                     what=f"{bookie_id} ready")
            if proc.poll() is not None:
                raise RuntimeError(f"{bookie_id} exited {proc.returncode}: {self.log(bookie_id)}")
        return proc

    def start(self) -> Cluster:
        self.format()
        for b in self.config.bookies:
            self.start_bookie(b.id, wait=False)
        for b in self.config.bookies:
            ready = self.root / f"{b.id}.ready"
            proc = self.procs[b.id]
            wait_for(lambda r=ready, p=proc: r.exists() or p.poll() is not None,
                     READY_TIMEOUT_S, what=f"{b.id} ready")
            if proc.poll() is not None:
                raise RuntimeError(f"{b.id} exited {proc.returncode}: {self.log(b.id)}")
        return self

    def log(self, bookie_id: str) -> str:
        path = self.root / f"{bookie_id}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def kill(self, bookie_id: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs.get(bookie_id)
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, sig)
            proc.wait(timeout=30)

    def stop_bookie(self, bookie_id: str) -> int | None:
        """SIGTERM and wait; returns the exit code."""
        proc = self.procs.get(bookie_id)
        if proc is None:
            return None
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc.returncode

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


def now_s() -> float:
    return time.monotonic()
