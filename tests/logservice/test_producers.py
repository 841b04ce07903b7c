"""The log service with real processes: bookies, log servers, producers."""

from __future__ import annotations

import pytest

import appliance
from tests.logservice.support import LogServers
from tests.support.launch import wait_registered


@pytest.fixture
def service(make_cluster):
    cluster = make_cluster(3, quorums=(3, 3, 2), autorecovery={"enabled": False})
    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 3)
        servers = LogServers(cluster, bk)
        try:
            servers.start("logserver-1")
            servers.start("logserver-2")
            yield bk, servers
        finally:
            servers.kill_all()


def _read_all(bk, name: str, expect: int) -> list:
    out: list = []
    with bk.log(name).reader() as r:
        while len(out) < expect:
            got = r.read(max_records=1000, timeout_s=30)
            assert got, f"stalled after {len(out)} of {expect} records"
            out += got
    return out


def test_one_producer_writes_and_reads_back(service):
    bk, servers = service
    with bk.log("orders").producer() as p:
        first = p.write(b"r0")
        futures = [p.write_async(b"r%d" % i) for i in range(1, 200)]
        p.flush()
        positions = [first] + [f.result(timeout=30) for f in futures]
    assert positions == sorted(positions) and len(set(positions)) == 200
    records = _read_all(bk, "orders", 200)
    assert [r.payload for r in records] == [b"r%d" % i for i in range(200)]
    assert [r.dlsn for r in records] == positions
    assert servers.owner("orders") in ("logserver-1", "logserver-2")
