"""Log servers for tests: started as ``python -m appliance.logservice`` beside
a ``Cluster``'s bookies, waited for until registered, stopped by the test."""

from __future__ import annotations

import signal
import subprocess
import sys
import urllib.request
from contextlib import contextmanager

from appliance.bench import launcher
from appliance.meta.logservice import LogServiceRegistry
from tests.support.launch import stop_process, wait_for

READY_TIMEOUT_S = 30.0


class LogServers:
    def __init__(self, cluster, client):
        self.cluster = cluster
        self.registry = LogServiceRegistry(client.logs.store)
        self.procs: dict[str, subprocess.Popen] = {}

    def metrics(self, server_id: str) -> dict:
        """The server's ``bookkeeper_logserver*`` samples from its /metrics."""
        url = self.registry.servers()[server_id]["metrics_url"]
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        return {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
                if line.startswith("bookkeeper_logserver")}

    def log_path(self, server_id: str):
        return self.cluster.root / f"{server_id}.log"

    def start(self, server_id: str, wait: bool = True) -> subprocess.Popen:
        proc = launcher.spawn([sys.executable, "-m", "appliance.logservice", "--config",
                               str(self.cluster.config_path), "--id", server_id],
                              self.log_path(server_id))
        self.procs[server_id] = proc
        if wait:
            self.wait_registered(server_id, proc.pid)
        return proc

    def wait_registered(self, server_id: str, pid: int) -> None:
        launcher.wait_started(self.procs[server_id],
                              lambda: self.registry.servers().get(server_id, {}).get("pid") == pid,
                              server_id, self.log_path(server_id), READY_TIMEOUT_S)

    def owner(self, log_name: str, timeout_s: float = 30.0) -> str:
        lease = wait_for(lambda: self.registry.owner(log_name), timeout_s,
                         what=f"an owner of log {log_name}")
        return lease["server"]

    def kill(self, server_id: str) -> None:
        stop_process(self.procs[server_id], 30.0, signal.SIGKILL)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                stop_process(proc, 20.0)

    def kill_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                stop_process(proc, 30.0, signal.SIGKILL)


@contextmanager
def log_servers_running(cluster, client, *server_ids: str):
    """``LogServers`` with ``server_ids`` started (each waited for until
    registered); every one killed on the way out, also on failure."""
    servers = LogServers(cluster, client)
    try:
        for server_id in server_ids:
            servers.start(server_id)
        yield servers
    finally:
        servers.kill_all()


@contextmanager
def log_service(make_cluster, servers: tuple[str, ...] = ("logserver-1", "logserver-2"),
                **config):
    """(cluster, client, LogServers): 3 bookies (E3/W3/A2, no autorecovery)
    and log servers ``servers`` serving metrics on ports of their own, plus
    ``config`` sections; the log servers are killed at the end, also on failure."""
    import appliance
    from tests.support.launch import wait_registered

    log_config = {"metrics_address": "127.0.0.1:0", **config.pop("log", {})}
    cluster = make_cluster(3, quorums=(3, 3, 2), autorecovery={"enabled": False},
                           log=log_config, **config)
    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 3)
        with log_servers_running(cluster, bk, *servers) as running:
            yield cluster, bk, running


def read_all(bk, log_name: str, expect: int, nothing_more: bool = False) -> list:
    """The first ``expect`` records of a log, read from the start (fails if
    the reader stalls); ``nothing_more``: and none after them (a 1 s look)."""
    out: list = []
    with bk.log(log_name).reader() as r:
        while len(out) < expect:
            got = r.read(max_records=5000, timeout_s=60)
            assert got, f"stalled after {len(out)} of {expect} records"
            out += got
        if nothing_more:
            assert r.read(max_records=10, timeout_s=1) == []
    return out


@contextmanager
def appliance_with_log_servers(folder, **sections):
    """``bkctl up --detach`` of 3 bookies (E3/W3/A2, no autorecovery) and 2
    log servers, plus ``sections``: (config, client, registry, pids seen),
    the registry showing both log servers; ``bkctl down`` and every pid the
    test adds to the set killed on the way out, also on failure."""
    import appliance
    from tests.support.bkctl import bkctl
    from tests.support.launch import kill_pids, supervisor_pids, write_config

    config = write_config(folder, 3, quorums=(3, 3, 2), autorecovery={"enabled": False},
                          log={"servers": 2}, **sections)
    seen: set[int] = set()
    try:
        up = bkctl("up", "--detach", config=config, text=True)
        seen.update(supervisor_pids(config))
        assert up.returncode == 0, up.stderr
        with appliance.connect(str(config)) as bk:
            registry = LogServiceRegistry(bk.logs.store)
            wait_for(lambda: len(registry.servers()) == 2, 60, what="2 log servers registered")
            yield config, bk, registry, seen
    finally:
        seen.update(supervisor_pids(config))
        bkctl("down", config=config)
        kill_pids(seen)
