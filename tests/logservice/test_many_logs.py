"""Many logs through one log server, with real processes: a few threads
whatever the number of logs, and an idle owned log's last records visible
to readers of the bookies (its control entry, driven by the server)."""

from __future__ import annotations

import os
import threading

import pytest

import appliance
from tests.logservice.support import LogServers
from tests.support.launch import wait_registered

LOGS = 120
CONTROL_MS = 200


@pytest.fixture
def service(make_cluster):
    # no explicit LAC: only the owner's control entry tells the bookies an
    # idle log's last entry is there
    cluster = make_cluster(3, quorums=(3, 3, 2), autorecovery={"enabled": False},
                           client={"explicit_lac_interval_ms": 0},
                           log={"service_control_interval_ms": CONTROL_MS})
    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 3)
        servers = LogServers(cluster, bk)
        try:
            servers.start("logserver-1")
            yield bk, servers
        finally:
            servers.kill_all()


def _threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def test_a_server_owning_many_logs_and_their_producers_take_a_few_threads(service):
    bk, servers = service
    server_pid = servers.procs["logserver-1"].pid
    server_before = _threads_of(server_pid)
    ours_before = threading.active_count()
    names = [f"many-{i}" for i in range(LOGS)]
    producers = [bk.log(name).producer() for name in names]
    try:
        futures = [(p.write_async(b"first " + name.encode()), p.write_async(b"second"))
                   for p, name in zip(producers, names, strict=True)]
        for p in producers:
            p.flush()
        positions = [(a.result(timeout=60), b.result(timeout=60)) for a, b in futures]
        # one I/O thread for all of this process's producers (not one each)
        assert threading.active_count() - ours_before <= 2
        # the server owns them all with no thread per log (nor per opening)
        assert len(servers.registry.servers()) == 1
        assert _threads_of(server_pid) - server_before <= 12
    finally:
        for p in producers:
            p.close()
    for name, (first, second) in zip(names[:5], positions[:5], strict=True):
        with bk.log(name).reader(via_service=False) as r:
            got = r.read(max_records=10, timeout_s=30)
            while len(got) < 2:
                more = r.read(max_records=10, timeout_s=30)
                assert more, f"{name}: stalled after {len(got)} records"
                got += more
        assert [(x.dlsn, x.payload) for x in got] == \
            [(first, b"first " + name.encode()), (second, b"second")]


def test_a_reader_of_the_bookies_sees_an_idle_owned_logs_last_record(service):
    bk, servers = service
    with bk.log("idle").producer() as p:
        positions = [p.write(b"r%d" % i) for i in range(5)]
    # the last entry's records are visible only once the server's control
    # entry after it told the bookies it is there (no explicit LAC here)
    with bk.log("idle").reader(via_service=False) as r:
        got = []
        while len(got) < 5:
            more = r.read(max_records=10, timeout_s=30)
            assert more, f"stalled after {len(got)} records: no control entry?"
            got += more
    assert [(x.dlsn, x.payload) for x in got] == [(pos, b"r%d" % i)
                                                  for i, pos in enumerate(positions)]
