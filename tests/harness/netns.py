"""Hosts simulated by Linux network namespaces: a bridge in the root
namespace, one namespace per host with a veth pair to the bridge and an
address on a private /24, ``lo`` up in each.

What it guarantees:

* Names carry a prefix and this process's pid (``bkmh<pid>-host1``,
  bridge ``bkmh<pid>br``, veths ``bkmh<pid>h<i>``), so parallel runs never
  clash, and ``sweep_leftovers`` can remove what a crashed run left behind
  (names whose pid is no longer alive: their processes are killed, then
  namespaces and links deleted).  The /24 is one no interface of this
  machine uses yet.
* ``Network.close()`` kills every process left in its namespaces (``ip
  netns pids``) and deletes namespaces, veths and bridge; it is idempotent
  and runs from ``with`` blocks also on failure and on KeyboardInterrupt.
* ``partition(host)`` takes the bridge side of the host's veth down: the
  host keeps its address (its own processes still talk to each other) but
  no packet leaves or enters it; ``heal(host)`` brings it back.
  ``delay(ms)`` adds ``tc netem delay`` on every namespace's egress (one-way
  delay ms between any two hosts); kernels without the netem qdisc raise
  ``NetnsError`` saying so.
* ``unavailable_reason()`` says in one line why namespaces cannot be made
  here (not root, no ``ip``, creation refused), or None.

Nothing here sends traffic anywhere but to the namespaces' addresses.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass

PREFIX = "bkmh"
IP_TIMEOUT_S = 30.0  # one `ip`/`tc` command
SUBNET_BASE = "10.213"  # 10.213.X.0/24, X picked free
ROOT_HOST = 1  # the bridge's address in the root namespace: .1
FIRST_HOST = 11  # hosts get .11, .12, ...


class NetnsError(RuntimeError):
    """A namespace, link or qdisc could not be set up."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return _run(["ip", *args], check)


def _run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=IP_TIMEOUT_S)
    if check and done.returncode != 0:
        raise NetnsError(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")
    return done


def unavailable_reason() -> str | None:
    """Why network namespaces cannot be created here (one line), or None."""
    if os.geteuid() != 0:
        return "network namespaces need root (run the multi-host suite as root)"
    if shutil.which("ip") is None:
        return "no `ip` command (install iproute2)"
    probe = f"{PREFIX}{os.getpid()}-probe"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` is refused here: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def _pid_of(name: str) -> int | None:
    """The pid in ``bkmh<pid>...`` (None if the name has none)."""
    rest = name[len(PREFIX):]
    digits = rest[:len(rest) - len(rest.lstrip("0123456789"))]
    return int(digits) if digits else None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _namespaces() -> list[str]:
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _links() -> list[str]:
    out = _ip("-o", "link", "show", check=False).stdout
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines()
            if line.count(":") >= 2]


def kill_namespace_processes(netns: str) -> None:
    """SIGKILL every process running in ``netns``."""
    for pid in _ip("netns", "pids", netns, check=False).stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def sweep_leftovers(prefix: str = PREFIX) -> list[str]:
    """Remove namespaces and links of runs whose process is gone; returns
    what was removed."""
    removed = []
    for ns in _namespaces():
        pid = _pid_of(ns) if ns.startswith(prefix) else None
        if pid is not None and not _pid_alive(pid):
            kill_namespace_processes(ns)
            _ip("netns", "del", ns, check=False)
            removed.append(ns)
    for link in _links():
        pid = _pid_of(link) if link.startswith(prefix) else None
        if pid is not None and not _pid_alive(pid):
            _ip("link", "del", link, check=False)
            removed.append(link)
    return removed


def _free_subnet(pid: int) -> ipaddress.IPv4Network:
    used = _run(["ip", "-4", "-o", "addr", "show"], check=False).stdout
    for step in range(256):
        net = ipaddress.IPv4Network(f"{SUBNET_BASE}.{(pid + step) % 254 + 1}.0/24")
        if f" {net.network_address + ROOT_HOST}/" not in used and not any(
                f" {net.network_address + h}/" in used for h in range(FIRST_HOST, FIRST_HOST + 8)):
            return net
    raise NetnsError(f"no free {SUBNET_BASE}.X.0/24 subnet on this machine")


@dataclass(frozen=True)
class Host:
    name: str  # "host1", "client"
    netns: str  # the namespace's name
    address: str  # its IPv4 address
    veth: str  # the bridge side of its veth pair (in the root namespace)


class Network:
    """A bridge and one namespace per name in ``names``; use as a context
    manager (``close`` always runs)."""

    def __init__(self, names: list[str], *, pid: int | None = None):
        self.pid = pid or os.getpid()
        self.tag = f"{PREFIX}{self.pid}"
        self.bridge = f"{self.tag}br"
        self.subnet: ipaddress.IPv4Network | None = None
        self.names = list(names)
        self.hosts: dict[str, Host] = {}
        self._delayed: list[Host] = []

    def __enter__(self) -> Network:
        try:
            return self.create()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def root_address(self) -> str:
        return str(self.subnet.network_address + ROOT_HOST)

    def create(self) -> Network:
        sweep_leftovers()
        self.subnet = _free_subnet(self.pid)
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.root_address}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, name in enumerate(self.names):
            self.hosts[name] = self._add_host(i, name)
        return self

    def _add_host(self, i: int, name: str) -> Host:
        netns, veth, peer = f"{self.tag}-{name}", f"{self.tag}h{i}", f"{self.tag}p{i}"
        address = str(self.subnet.network_address + FIRST_HOST + i)
        _ip("netns", "add", netns)
        _ip("link", "add", veth, "type", "veth", "peer", "name", peer)
        _ip("link", "set", peer, "netns", netns)
        _ip("link", "set", veth, "master", self.bridge)
        _ip("link", "set", veth, "up")
        for args in (("link", "set", "lo", "up"), ("link", "set", peer, "name", "eth0"),
                     ("addr", "add", f"{address}/24", "dev", "eth0"),
                     ("link", "set", "eth0", "up")):
            _ip("-n", netns, *args)
        return Host(name, netns, address, veth)

    def exec_prefix(self, host: str) -> list[str]:
        """The argv prefix that runs a command inside ``host``."""
        return ["ip", "netns", "exec", self.hosts[host].netns]

    def partition(self, host: str) -> None:
        _ip("link", "set", self.hosts[host].veth, "down")

    def heal(self, host: str) -> None:
        _ip("link", "set", self.hosts[host].veth, "up")

    def delay(self, ms: float) -> None:
        """One-way ``ms`` on every host's egress (``tc netem``); 0 removes it."""
        for host in self.hosts.values():
            if host in self._delayed:
                _run(["ip", "netns", "exec", host.netns, "tc", "qdisc", "del", "dev", "eth0",
                      "root"], check=False)
                self._delayed.remove(host)
            if ms <= 0:
                continue
            done = _run(["ip", "netns", "exec", host.netns, "tc", "qdisc", "add", "dev", "eth0",
                         "root", "netem", "delay", f"{ms}ms"], check=False)
            if done.returncode != 0:
                raise NetnsError(f"tc netem delay on {host.name}: {done.stderr.strip()} (this "
                                 "kernel may lack the sch_netem module; tests.harness.bench_hosts "
                                 "--delay-mode relay delays in user space instead)")
            self._delayed.append(host)

    def close(self) -> None:
        """Kill every process in the namespaces, delete namespaces and links."""
        for name in self.names:
            netns = f"{self.tag}-{name}"
            kill_namespace_processes(netns)
            _ip("netns", "del", netns, check=False)
        for i in range(len(self.names)):
            _ip("link", "del", f"{self.tag}h{i}", check=False)
        _ip("link", "del", self.bridge, check=False)
        self.hosts.clear()
