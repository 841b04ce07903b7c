"""A multi-host appliance on one machine: hosts simulated by network
namespaces (``tests.harness.netns``), a 3-node ZooKeeper ensemble (one
member per host), one supervisor per host with its own config and bookies
on tcp endpoints of its host's address, all on one ``zk://`` URI with
digest auth; and a client namespace that holds no bookie.  Used by the
multi-host test suite (``tests/multihost``) and its write bench (``bench_hosts``).

What it guarantees:

* ``HostCluster`` is a context manager: at exit (also on failure or
  Ctrl-C) every process it started is killed (supervisors, bookies,
  ZooKeeper members, workers: everything still running in its namespaces)
  and the namespaces, veths and bridge are deleted; a previous crashed
  run's leftovers are swept at start.
* ``start()`` returns once every member of the ensemble serves and every
  bookie of every host is registered (polled, with deadlines), or raises
  naming what did not come up and the tail of its log.
* Configs are the ones a user would write (``config_text``): each host's
  lists only its bookies; ``security(host)`` may add a ``[security]``
  table per host (e.g. CURVE keys).
* Client work runs in a namespace as a subprocess
  (``tests.harness.host_worker``) whose JSON lines are collected by
  ``Worker``.

Bounds: ``START_TIMEOUT_S`` for the cluster, ``STOP_TIMEOUT_S`` per process.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from appliance.bench.launcher import _table as toml_table
from appliance.bench.launcher import log_tail, spawn, stop_process, wait_for
from appliance.config import load_config
from appliance.curve import generate_keys
from appliance.errors import MetadataError
from appliance.meta.bookies import BookieRegistry
from storage.metadata import open_store
from tests.harness import module_env
from tests.harness.netns import NetnsError, Network, unavailable_reason
from tests.harness.zk_ensemble import CLIENT_PORT, EnsembleMember

START_TIMEOUT_S = 120.0  # the ensemble serving and every bookie registered
STOP_TIMEOUT_S = 20.0
BOOKIE_PORT_BASE = 3181  # bookie i of a host listens on its address at 3181 + i - 1
RELAY_PORT = 4181  # the delay relay of a host (``delay(mode="relay")``)
CHROOT = "/appliance"
AUTH_USER = "appliance"
CLIENT = "client"
WORKER_EVENTS_MAX = 1_000_000  # JSON lines kept per worker


def host_names(hosts: int) -> list[str]:
    return [f"host{i}" for i in range(1, hosts + 1)]


@dataclass
class HostsOptions:
    hosts: int = 3
    bookies_per_host: int = 2
    # Bookie registrations of a partitioned host vanish after this long: well
    # below the add timeout (docs/DEPLOYMENT.md, step 4).
    session_timeout_ms: int = 2_000
    client: Mapping[str, object] = field(default_factory=lambda: {
        "ensemble": 3, "write_quorum": 3, "ack_quorum": 2,
        "add_timeout_ms": 5_000, "read_timeout_ms": 5_000,
        # a bookie on a host that stops answering is replaced after one add
        # timeout (not resent to first): an unreachable host is the usual
        # cause across hosts, a stalled disk the usual one on one host
        "add_retries_max": 0})
    autorecovery: Mapping[str, object] = field(default_factory=lambda: {"enabled": False})
    # host name -> keys of its [security] table (None: no such table)
    security: Callable[[str], Mapping[str, object]] | None = None
    zk_tick_time_ms: int = 500


class HostCluster:
    def __init__(self, root: str | os.PathLike, options: HostsOptions | None = None):
        self.root = Path(root)
        self.options = options or HostsOptions()
        self.names = host_names(self.options.hosts)
        self.net = Network([*self.names, CLIENT])
        self.zk: list[EnsembleMember] = []
        self.supervisors: dict[str, subprocess.Popen] = {}
        self.workers: list[Worker] = []
        self.relays: list[subprocess.Popen] = []  # delay relays (delay(mode="relay"))
        self.auth_file = self.root / "zk-auth"

    # -- life cycle -------------------------------------------------------------------
    def __enter__(self) -> HostCluster:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> HostCluster:
        self.root.mkdir(parents=True, exist_ok=True)
        self.net.create()
        self._start_ensemble()
        self._write_auth_file()
        for name in self.names:
            self.config_path(name).write_text(self.config_text(name))
        for name in self.names:
            self.start_supervisor(name)
        self.wait_registered(self.bookie_ids(), START_TIMEOUT_S)
        return self

    def close(self) -> None:
        """Stop workers, supervisors and ZooKeeper; remove the network."""
        try:
            for worker in self.workers:
                worker.kill()
            for name in list(self.supervisors):
                self.stop_supervisor(name)
            for member in self.zk:
                member.stop()
            for proc in self.relays:
                stop_process(proc)
        finally:
            self.net.close()  # SIGKILLs whatever is left in the namespaces

    # -- ZooKeeper ---------------------------------------------------------------------
    def _start_ensemble(self) -> None:
        addresses = [self.address(name) for name in self.names]
        self.zk = [EnsembleMember(self.root / f"zk{i}", i, addresses,
                                  netns=self.net.hosts[name].netns,
                                  tick_time_ms=self.options.zk_tick_time_ms)
                   for i, name in enumerate(self.names, start=1)]
        for member in self.zk:
            member.launch()
        for member in self.zk:
            member.wait_until_serving(START_TIMEOUT_S)

    @property
    def zk_hosts(self) -> str:
        return ",".join(f"{self.address(name)}:{CLIENT_PORT}" for name in self.names)

    @property
    def metadata_uri(self) -> str:
        return f"zk://{self.zk_hosts}{CHROOT}"

    def stop_zk(self, index: int) -> None:
        """Kill ZooKeeper member ``index`` (1-based) like a crash."""
        self.zk[index - 1].stop()

    def start_zk(self, index: int) -> None:
        """Restart member ``index``; returns at once (it serves once in a quorum)."""
        self.zk[index - 1].launch()

    def _write_auth_file(self) -> None:
        fd = os.open(self.auth_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(f"{AUTH_USER}:{os.urandom(16).hex()}\n")

    # -- configs and supervisors ---------------------------------------------------------
    def address(self, name: str) -> str:
        return self.net.hosts[name].address

    def config_path(self, name: str) -> Path:
        return self.root / f"{name}.toml"

    def bookie_ids(self, name: str | None = None) -> list[str]:
        names = [name] if name else self.names
        return [f"{n}-b{i}" for n in names for i in range(1, self.options.bookies_per_host + 1)]

    def config_text(self, name: str) -> str:
        """Host ``name``'s config: its bookies only, the shared metadata."""
        o = self.options
        parts = [toml_table("metadata", {"uri": self.metadata_uri,
                                         "session_timeout_ms": o.session_timeout_ms,
                                         "auth_file": str(self.auth_file)})]
        for i, bookie_id in enumerate(self.bookie_ids(name)):
            parts.append(toml_table("[bookies]", {
                "id": bookie_id, "journal_dir": f"{name}/{bookie_id}/journal",
                "ledger_dir": f"{name}/{bookie_id}/ledgers",
                "endpoint": f"tcp://{self.address(name)}:{BOOKIE_PORT_BASE + i}",
                "host": name}))  # placement label: one machine, three "hosts"
        parts += [toml_table("client", o.client), toml_table("autorecovery", o.autorecovery),
                  toml_table("supervisor", {"run_dir": f"{name}/run"})]
        if o.security is not None:
            parts.append(toml_table("security", o.security(name)))
        return "\n".join(parts)

    def _bkctl(self) -> str:
        return str(Path(sys.executable).with_name("bkctl"))

    def start_supervisor(self, name: str) -> subprocess.Popen:
        """``bkctl up --config <name>.toml`` inside host ``name``."""
        log = self.root / f"{name}-supervisor.log"
        proc = spawn([*self.net.exec_prefix(name), self._bkctl(), "up", "--config",
                      str(self.config_path(name))], log, cwd=self.root)
        self.supervisors[name] = proc
        return proc

    def stop_supervisor(self, name: str) -> None:
        proc = self.supervisors.pop(name, None)
        if proc is not None:
            stop_process(proc, STOP_TIMEOUT_S, group=True)

    def bkctl(self, name: str, *args: str, timeout_s: float = 60.0,
              config: str | os.PathLike | None = None) -> subprocess.CompletedProcess:
        """Run ``bkctl ARGS --config <name>.toml`` (or ``config``) inside host ``name``."""
        config = config or self.config_path(self.names[0] if name == CLIENT else name)
        return subprocess.run([*self.net.exec_prefix(name), self._bkctl(), *args, "--config",
                               str(config)], capture_output=True, text=True,
                              timeout=timeout_s, cwd=self.root)

    # -- the metadata, seen from the root namespace ------------------------------------------
    def open_store(self, avoid: tuple[str, ...] = ()):
        """A metadata store with the appliance's credentials, on the ensemble
        members of every host but ``avoid`` (e.g. a partitioned one)."""
        config = load_config(self.config_path(self.names[0]))
        members = ",".join(f"{self.address(n)}:{CLIENT_PORT}" for n in self.names
                           if n not in avoid)
        return open_store(f"zk://{members}{CHROOT}", **config.metadata.store_options())

    def registered(self) -> dict[str, dict]:
        """Live bookies in the registry ({} while the metadata cannot answer)."""
        try:
            with self.open_store() as store:
                return BookieRegistry(store).available()
        except MetadataError:
            return {}

    def wait_registered(self, bookie_ids: list[str], timeout_s: float = 60.0) -> None:
        def ready() -> bool:
            for name, proc in self.supervisors.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"the supervisor of {name} exited {proc.returncode}: "
                                       f"{log_tail(self.root / f'{name}-supervisor.log')}")
            return set(bookie_ids) <= set(self.registered())

        wait_for(ready, timeout_s, interval_s=0.2, what=f"bookies {bookie_ids} registered")

    def bookie_pid(self, bookie_id: str) -> int:
        return int(self.registered()[bookie_id]["info"]["pid"])

    # -- faults ----------------------------------------------------------------------------
    def partition(self, name: str) -> None:
        self.net.partition(name)

    def heal(self, name: str) -> None:
        self.net.heal(name)

    def delay(self, ms: float, mode: str = "netem") -> str:
        """One-way ``ms`` between hosts; returns how it was made.  ``netem``:
        ``tc netem`` on every host's link (all traffic); ``relay``: a
        userspace relay in each host namespace in front of its bookie ports
        (``tests.harness.delay_relay``; client-to-bookie traffic only, for
        kernels without netem; ``ms`` may be 0, the relay's own baseline);
        ``auto``: netem if this kernel has it, else the relay."""
        if mode not in ("netem", "relay", "auto"):
            raise ValueError(f"mode must be netem, relay or auto, got {mode!r}")
        if mode != "relay":
            try:
                self.net.delay(ms)
                return "netem"
            except NetnsError:
                if mode == "netem":
                    raise
        self._relay_delay(ms)
        return "relay"

    def _relay_delay(self, ms: float) -> None:
        if shutil.which("iptables") is None:
            raise NetnsError("a relay delay needs iptables (apt-get install iptables)")
        ports = f"{BOOKIE_PORT_BASE}:{BOOKIE_PORT_BASE + self.options.bookies_per_host - 1}"
        for name in self.names:
            ready = self.root / f"{name}-relay.ready"
            ready.unlink(missing_ok=True)
            proc = spawn([*self.net.exec_prefix(name), sys.executable, "-m",
                          "tests.harness.delay_relay", "--port", str(RELAY_PORT),
                          "--delay-ms", str(ms), "--ready-file", str(ready)],
                         self.root / f"{name}-relay.log", cwd=self.root, env=module_env())
            self.relays.append(proc)
            wait_for(ready.exists, 30.0, what=f"the delay relay on {name}")
            done = subprocess.run([*self.net.exec_prefix(name), "iptables", "-t", "nat", "-A",
                                   "PREROUTING", "-p", "tcp", "-d", self.address(name),
                                   "--dport", ports, "-j", "REDIRECT", "--to-ports",
                                   str(RELAY_PORT)], capture_output=True, text=True)
            if done.returncode != 0:
                raise NetnsError(f"iptables REDIRECT on {name}: {done.stderr.strip()}")

    # -- client work -------------------------------------------------------------------------
    def client_config(self, key_file: str | os.PathLike) -> Path:
        """A client's config: the first host's, with ``key_file`` as its
        CURVE key pair instead of the host's."""
        text = self.config_text(self.names[0])
        if self.options.security is not None:
            own = str(self.options.security(self.names[0])["key_file"])
            text = text.replace(own, str(key_file))
        path = self.root / f"client-{Path(key_file).name.split('.')[0]}.toml"
        path.write_text(text)
        return path

    def worker(self, name: str, command: str, *args: str, config: str | None = None) -> Worker:
        """Start ``host_worker COMMAND ARGS`` inside ``name`` (the client
        namespace uses the first host's config unless ``config`` is given)."""
        config = config or str(self.config_path(self.names[0] if name == CLIENT else name))
        index = len(self.workers)
        argv = [*self.net.exec_prefix(name), sys.executable, "-m", "tests.harness.host_worker",
                command, "--config", config, *args]
        worker = Worker(argv, self.root / f"worker{index}-{name}-{command}", cwd=self.root)
        self.workers.append(worker)
        return worker


class Worker:
    """A worker subprocess and the JSON events it printed so far."""

    def __init__(self, argv: list[str], base: Path, cwd: Path):
        self.log_path = base.with_suffix(".log")
        self.stop_file = base.with_suffix(".stop")
        self.stop_file.unlink(missing_ok=True)
        argv = [*argv, "--stop-file", str(self.stop_file)]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=log, cwd=cwd, start_new_session=True,
                                         env=module_env())
        self.events: list[dict] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            with self._lock:
                if len(self.events) < WORKER_EVENTS_MAX:
                    self.events.append(event)

    def of(self, kind: str) -> list[dict]:
        with self._lock:
            return [e for e in self.events if e.get("event") == kind]

    def wait_event(self, kind: str, predicate: Callable[[dict], bool] = lambda e: True,
                   timeout_s: float = 60.0) -> dict:
        """The first ``kind`` event matching ``predicate``, polled until the deadline."""
        def found():
            hits = [e for e in self.of(kind) if predicate(e)]
            if not hits and self.proc.poll() is not None and not self._reader.is_alive():
                raise RuntimeError(f"worker exited {self.proc.returncode} without a {kind} "
                                   f"event; its last events {self.events[-3:]}; its log: "
                                   f"{log_tail(self.log_path)}")
            return hits[0] if hits else None

        return wait_for(found, timeout_s, interval_s=0.05, what=f"a {kind} event")

    def acked(self) -> list[int]:
        return [e["entry"] for e in self.of("acked")]

    def stop(self, timeout_s: float = 60.0) -> int:
        """Ask the worker to finish (stop file) and wait for it."""
        self.stop_file.touch()
        rc = self.proc.wait(timeout_s)
        self._reader.join(timeout_s)
        return rc

    def wait(self, timeout_s: float = 60.0) -> int:
        rc = self.proc.wait(timeout_s)
        self._reader.join(timeout_s)
        return rc

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        self.proc.wait(STOP_TIMEOUT_S)
        self._reader.join(STOP_TIMEOUT_S)


def curve_security(root: Path, hosts: int = 3, clients: tuple[str, ...] = ("client",),
                   strangers: tuple[str, ...] = ()) -> Callable[[str], dict]:
    """CURVE keys as docs/DEPLOYMENT.md (step 5) lays them out, under
    ``root/keys``: a key pair per host and per client; each host's
    ``authorized-<host>`` directory holds the other hosts' and the clients'
    public keys (not the ``strangers'``).  Returns the ``HostsOptions.security``
    callable; a client's key file is ``root/keys/<client>.key_secret``."""
    keys, names = Path(root) / "keys", host_names(hosts)
    for name in [*names, *clients, *strangers]:
        generate_keys(name, keys)
    for name in names:
        authorized = Path(root) / f"authorized-{name}"
        authorized.mkdir(mode=0o700)
        for peer in [*names, *clients]:
            shutil.copy(keys / f"{peer}.key", authorized / f"{peer}.key")

    def security(name: str) -> dict:
        return {"curve": True, "key_file": str(keys / f"{name}.key_secret"),
                "authorized_keys_dir": str(Path(root) / f"authorized-{name}")}

    return security


def netns_unavailable_reason() -> str | None:
    """Why the multi-host cluster cannot run here (one line), or None."""
    reason = unavailable_reason()
    if reason is None and shutil.which("java") is None:
        reason = "no java (the ZooKeeper ensemble runs from pyspark's jars)"
    return reason


__all__ = ["HostCluster", "HostsOptions", "Worker", "netns_unavailable_reason"]
