"""What only the ZooKeeper backend has: an unreachable or dying server must
give a clear, bounded error, never a hang; chroots isolate namespaces."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest

from appliance.errors import MetadataUnavailableError
from storage.metadata import open_store, parse_uri
from tests.support.launch import free_tcp_port, stop_process, wait_for

HANG_GUARD_S = 30  # far above the timeouts used below: exceeding it means a hang


def _bounded(fn):
    """Run ``fn`` in a thread; fail (instead of hanging) if it never returns."""
    outcome: dict = {}

    def run():
        try:
            outcome["value"] = fn()
        except BaseException as exc:  # reported to the caller
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG_GUARD_S)
    assert not thread.is_alive(), f"{fn} hung for {HANG_GUARD_S} s"
    return outcome


def test_zk_uri_forms():
    assert parse_uri("zk://127.0.0.1:2181/appliance") == (
        "zk", {"hosts": "127.0.0.1:2181", "chroot": "/appliance"})
    assert parse_uri("zk://a:1,b:2/x/y/") == ("zk", {"hosts": "a:1,b:2", "chroot": "/x/y"})
    assert parse_uri("zk://a:1") == ("zk", {"hosts": "a:1", "chroot": ""})


def test_unreachable_zookeeper_is_a_clear_timeout_error():
    port = free_tcp_port()  # nothing listens there
    outcome = _bounded(lambda: open_store(f"zk://127.0.0.1:{port}/x", connect_timeout_ms=500))
    error = outcome.get("error")
    assert isinstance(error, MetadataUnavailableError), outcome
    assert f"127.0.0.1:{port}" in str(error) and "500 ms" in str(error)


def test_server_dying_mid_session_gives_unavailable_not_a_hang(zookeeper_factory):
    server = zookeeper_factory()
    store = open_store(server.uri("/app"), session_timeout_ms=2_000, op_timeout_ms=1_000)
    try:
        store.create("/n", b"1")
        server.stop()
        for op in (lambda: store.get("/n"), lambda: store.set("/n", b"2", 0),
                   lambda: store.wait_for_change("/n", 0, 5.0)):
            error = _bounded(op).get("error")
            assert isinstance(error, MetadataUnavailableError), error
            assert server.hosts in str(error)
    finally:
        assert "error" not in _bounded(store.close)


def test_chroots_isolate_namespaces_and_are_created(zookeeper):
    with open_store(zookeeper.new_uri("iso")) as a, open_store(zookeeper.new_uri("iso")) as b:
        a.create("/only-in-a", b"")
        assert not b.exists("/only-in-a")
        assert b.children("/") == []


def test_store_survives_a_server_restart_on_the_same_port(zookeeper_factory):
    server = zookeeper_factory()
    store = open_store(server.uri("/app"), session_timeout_ms=10_000, op_timeout_ms=20_000)
    try:
        store.create("/persistent", b"kept")
        port = server.port
        server.stop()
        server.start(port=port)
        assert store.get("/persistent") == (b"kept", 0)
    finally:
        store.close()


@pytest.mark.parametrize("bad", ["zk://127.0.0.1:notaport/x", "zk://:2181/x"])
def test_malformed_hosts_are_refused(bad):
    from appliance.errors import ConfigError

    with pytest.raises(ConfigError, match="host:port"):
        open_store(bad)


SERVER_OWNER_SCRIPT = """
import sys
from appliance.bench.zk_server import ZooKeeperServer
server = ZooKeeperServer(sys.argv[1], die_with_parent=True).start()
print(server.pid, flush=True)
sys.stdin.read()
"""


def test_server_dies_with_a_killed_parent(tmp_path):
    repo = Path(__file__).resolve().parents[2]
    parent = subprocess.Popen([sys.executable, "-c", SERVER_OWNER_SCRIPT, str(tmp_path / "zk")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=repo,
                              env={**os.environ, "PYTHONPATH": str(repo)})
    jvm_pid = None
    try:
        jvm_pid = int(parent.stdout.readline())  # the child exits (EOF) if start fails
        assert psutil.pid_exists(jvm_pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
        wait_for(lambda: not _running(jvm_pid), timeout_s=30, what="the JVM to die")
    finally:
        stop_process(parent, 30, signal.SIGKILL)
        if jvm_pid is not None and _running(jvm_pid):
            os.kill(jvm_pid, signal.SIGKILL)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
