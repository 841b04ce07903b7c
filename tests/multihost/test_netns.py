"""The namespace harness cleans up after itself: every process left in its
namespaces is killed and namespaces, veths and bridge are deleted, also when
the body raises; leftovers of a crashed run (a dead pid in the name) are
swept at the next start."""

from __future__ import annotations

import subprocess

import pytest

from tests.harness.netns import PREFIX, Network, sweep_leftovers
from tests.support.launch import wait_for


def _namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def _pids(netns: str) -> list[str]:
    return subprocess.run(["ip", "netns", "pids", netns], capture_output=True,
                          text=True).stdout.split()


def _links() -> str:
    return subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_close_kills_processes_and_removes_everything_also_on_failure():
    net = Network(["a", "b"], pid=_dead_pid())  # a tag of its own: not the shared cluster's
    sleeper = None
    with pytest.raises(RuntimeError, match="boom"):
        with net:
            sleeper = subprocess.Popen([*net.exec_prefix("a"), "sleep", "600"])
            # `ip netns exec` joins the namespace, then execs: close() kills
            # what is in the namespace when it looks, so wait for it to join
            wait_for(lambda: str(sleeper.pid) in _pids(f"{net.tag}-a"), 30,
                     what="the sleeper to join namespace a")
            assert net.tag in _namespaces() and net.bridge in _links()
            raise RuntimeError("boom")
    assert sleeper.wait(30) == -9
    assert net.tag not in _namespaces() and net.tag not in _links()


def test_partition_and_heal_cut_and_restore_traffic():
    with Network(["a", "b"], pid=_dead_pid()) as net:
        probe = [*net.exec_prefix("a"), "python3", "-c",
                 "import socket,sys; s=socket.socket(); s.settimeout(1.0);"
                 f"sys.exit(s.connect_ex(({net.hosts['b'].address!r}, 9)))"]
        refused = subprocess.run(probe).returncode  # nothing listens: refused at once
        net.partition("b")
        cut = subprocess.run(probe).returncode  # no answer at all
        net.heal("b")
        assert subprocess.run(probe).returncode == refused != cut


def test_leftovers_of_a_dead_run_are_swept():
    stale = f"{PREFIX}{_dead_pid()}"
    subprocess.run(["ip", "netns", "add", f"{stale}-host1"], check=True)
    subprocess.run(["ip", "link", "add", f"{stale}br", "type", "bridge"], check=True)
    try:
        removed = sweep_leftovers()
        assert {f"{stale}-host1", f"{stale}br"} <= set(removed)
        assert stale not in _namespaces() and stale not in _links()
    finally:
        subprocess.run(["ip", "netns", "del", f"{stale}-host1"], capture_output=True)
        subprocess.run(["ip", "link", "del", f"{stale}br"], capture_output=True)
