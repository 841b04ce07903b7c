"""A standalone ZooKeeper server run from the jars pyspark already ships.

For ``bkctl bench metadata`` and ``bkctl bench scale`` (``--backend zk``),
tests, and trying the ``zk://`` backend on one machine; a production
ensemble is run and configured by its operators (an ensemble of test
members: ``tests/harness/zk_ensemble.py``).  The server listens on
127.0.0.1 only, with the admin HTTP server off (it would take a fixed
port), and keeps its data and log in ``data_dir``.

``start()`` returns once a client session can be opened (never a fixed
sleep), or raises with the tail of the server's log; ``stop()`` kills the
JVM and waits for it.  Used as a context manager it always stops.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
from pathlib import Path

from kazoo.client import KazooClient

from appliance.bench.launcher import free_tcp_port, spawn, stop_process, wait_started

log = logging.getLogger(__name__)
# The readiness probe expects refused connections while the JVM starts.
_probe_log = logging.getLogger(f"{__name__}.probe")
_probe_log.setLevel(logging.CRITICAL)

MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"
# ZooKeeper's session timeouts are bounded to 2..20 ticks: a short tick lets
# tests use short sessions; a longer one costs less CPU on the server.
TICK_TIME_MS_DEFAULT = 500
JVM_HEAP_MB = 256
START_TRIES_MAX = 3  # a free port can be taken between choosing and binding


def pyspark_jars_dir() -> Path:
    try:
        import pyspark
    except ImportError as exc:
        raise RuntimeError("the ZooKeeper jars come with pyspark: install the 'spark' "
                           "extra (pip install -e '.[spark]')") from exc
    jars = Path(pyspark.__file__).parent / "jars"
    if not any(jars.glob("zookeeper-*.jar")):
        raise RuntimeError(f"no zookeeper-*.jar in {jars}")
    return jars


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the parent (thread) dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL)


class ZooKeeperServer:
    def __init__(self, data_dir: str | Path, *, tick_time_ms: int = TICK_TIME_MS_DEFAULT,
                 java: str = "java", die_with_parent: bool = False):
        """``die_with_parent``: the kernel kills the JVM if the thread that
        started it dies (even by SIGKILL), so no server outlives a killed
        test run; only for servers started from a long-lived thread."""
        self.data_dir = Path(data_dir)
        self.die_with_parent = die_with_parent
        self.tick_time_ms = tick_time_ms
        self.java = java
        self.port: int | None = None
        self._proc: subprocess.Popen | None = None
        self._log_path = self.data_dir / "zookeeper.log"

    @property
    def hosts(self) -> str:
        if self.port is None:
            raise RuntimeError("the ZooKeeper server is not started")
        return f"127.0.0.1:{self.port}"

    def uri(self, chroot: str = "/") -> str:
        return f"zk://{self.hosts}{chroot if chroot.startswith('/') else '/' + chroot}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self, timeout_s: float = 60.0, *, port: int | None = None) -> ZooKeeperServer:
        """Start on ``port`` (e.g. to restart on the previous one), else on a
        free port; return once a client session opens."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        last_error = ""
        for _ in range(START_TRIES_MAX):
            self.port = port or free_tcp_port()
            self._spawn()
            try:
                self._wait_until_serving(timeout_s)
                return self
            except RuntimeError as exc:
                last_error = str(exc)
                self.stop()
        raise RuntimeError(f"ZooKeeper did not start after {START_TRIES_MAX} tries: {last_error}")

    def _config_text(self) -> str:
        return (f"tickTime={self.tick_time_ms}\n"
                f"dataDir={self.data_dir / 'data'}\n"
                f"clientPort={self.port}\nclientPortAddress=127.0.0.1\n"
                "admin.enableServer=false\n"
                "maxClientCnxns=0\n")

    def _command(self, cfg: Path) -> list[str]:
        return [self.java, f"-Xmx{JVM_HEAP_MB}m", "-cp", f"{pyspark_jars_dir()}/*",
                MAIN_CLASS, str(cfg)]

    def _spawn(self) -> None:
        cfg = self.data_dir / "zoo.cfg"
        cfg.write_text(self._config_text())
        cmd = self._command(cfg)
        self._proc = spawn(cmd, self._log_path, cwd=self.data_dir, start_new_session=False,
                           env={**os.environ, "ZOO_LOG_DIR": str(self.data_dir)},
                           preexec_fn=_die_with_parent if self.die_with_parent else None)

    def _wait_until_serving(self, timeout_s: float) -> None:
        wait_started(self._proc, self._serving, f"ZooKeeper on {self.hosts}", self._log_path,
                     timeout_s, interval_s=0.1)

    def _serving(self) -> bool:
        client = KazooClient(hosts=self.hosts, timeout=2.0, logger=_probe_log)
        try:
            client.start(timeout=0.5)
            client.get("/")
            return True
        except Exception:  # noqa: BLE001 - not listening yet: polled again until the deadline
            return False
        finally:
            client.stop()
            client.close()

    def stop(self) -> None:
        """Kill the JVM (like a crash: ZooKeeper's log makes that safe) and wait."""
        if self._proc is None:
            return
        stop_process(self._proc, timeout_s=30, sig=signal.SIGKILL)
        self._proc = None

    def __enter__(self) -> ZooKeeperServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
