"""CURVE across hosts: every host has its own key pair and authorizes the
other hosts' keys and the ``good`` client's; bookies talk tcp + CURVE.
A client in the client namespace with the authorized key round trips; one
whose key no host authorized is refused with UnauthorizedError naming the
bookie, at once, without disturbing the cluster.  A cluster of its own
(module scope), stopped and removed at the end, also on failure."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from appliance.meta.logservice import LogServiceRegistry
from appliance.protocol.log_service import owner_of
from tests.harness.hosts import CLIENT, HostCluster, HostsOptions, curve_security
from tests.support.launch import wait_for

ENTRIES = 50


@pytest.fixture(scope="module")
def curve_hosts():
    root = Path(tempfile.mkdtemp(prefix="bkmc"))
    security = curve_security(root, clients=("good",), strangers=("bad",))
    try:
        with HostCluster(root / "cluster", HostsOptions(security=security)) as cluster:
            yield cluster, root / "keys"
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _client_config(cluster: HostCluster, keys: Path, key: str) -> str:
    return str(cluster.client_config(keys / f"{key}.key_secret"))


def test_an_authorized_client_round_trips_over_curve(curve_hosts):
    cluster, keys = curve_hosts
    writer = cluster.worker(CLIENT, "write", "--entries", str(ENTRIES),
                            config=_client_config(cluster, keys, "good"))
    closed = writer.wait_event("closed", timeout_s=120)
    assert closed["last"] == ENTRIES - 1 and not writer.of("error")
    read = cluster.worker("host2", "read", "--ledger", str(closed["ledger"])) \
        .wait_event("read", timeout_s=120)
    assert (read["last"], read["count"], read["bad"]) == (ENTRIES - 1, ENTRIES, [])


def test_an_unauthorized_client_is_refused(curve_hosts):
    cluster, keys = curve_hosts
    writer = cluster.worker(CLIENT, "write", "--entries", "1",
                            config=_client_config(cluster, keys, "bad"))
    error = writer.wait_event("error", timeout_s=60)
    assert error["error"] == "UnauthorizedError", error
    assert "refused this client's CURVE key" in error["message"], error["message"]
    assert not writer.acked()
    good = cluster.worker(CLIENT, "write", "--entries", "5",
                          config=_client_config(cluster, keys, "good"))
    assert good.wait_event("closed", timeout_s=120)["last"] == 4


# -- the log service across hosts (last: it cuts a host off, and heals it) -------------------
PRODUCED_BEFORE = 20  # writes each producer has acknowledged before host1 is cut off
PRODUCED_AFTER = 20  # ... and after, through the log's new owner


def _log_servers(cluster: HostCluster) -> dict[str, dict]:
    store = cluster.open_store()
    try:
        return LogServiceRegistry(store).servers()
    finally:
        store.close()


def _log_owner(cluster: HostCluster, name: str, avoid: tuple[str, ...] = ()) -> str | None:
    store = cluster.open_store(avoid)
    try:
        lease = LogServiceRegistry(store).owner(name)
    finally:
        store.close()
    return None if lease is None else lease["server"]


def test_producers_on_two_hosts_write_over_curve_through_a_host_cut_off(curve_hosts):
    """Producers on host2 and host3 write a log owned on host1 over tcp and
    CURVE; host1 is cut off, the log moves to another host's log server,
    and every acknowledged write is in the log once, at its DLSN, in each
    producer's order."""
    cluster, _keys = curve_hosts
    first = cluster.names[0]
    wait_for(lambda: len(_log_servers(cluster)) == 2 * len(cluster.names), timeout_s=120,
             interval_s=0.5,
             what="every host's log servers registered")
    servers = _log_servers(cluster)
    assert all(info["endpoint"].startswith("tcp://") for info in servers.values()), servers
    name = next(f"mh-orders-{k}" for k in range(1000)
                if owner_of(f"mh-orders-{k}", servers).startswith(first + "-"))
    producers = [cluster.worker(host, "produce", "--log", name, "--producer", host)
                 for host in cluster.names[1:]]
    for p in producers:
        wait_for(lambda p=p: len(p.of("acked")) >= PRODUCED_BEFORE or p.of("error"),
                 timeout_s=120, what="writes through host1's log server")
        assert not p.of("error"), p.of("error")
    assert _log_owner(cluster, name).startswith(first + "-")
    try:
        cluster.partition(first)
        before = [len(p.of("acked")) for p in producers]
        for p, n in zip(producers, before, strict=True):
            wait_for(lambda p=p, n=n: len(p.of("acked")) >= n + PRODUCED_AFTER or
                     p.of("error"), timeout_s=180, what="writes after host1 was cut off")
            assert not p.of("error"), p.of("error")
        owner = _log_owner(cluster, name, avoid=(first,))
        assert owner is not None and not owner.startswith(first + "-"), owner
        for p in producers:
            p.stop()
    finally:
        cluster.heal(first)
    read = cluster.worker(cluster.names[1], "read-log", "--log", name) \
        .wait_event("log", timeout_s=180)
    stored = [tuple(r) for r in read["records"]]
    payloads = [payload for payload, _ in stored]
    assert len(payloads) == len(set(payloads)), "a record stored twice"
    where = {payload: dlsn for payload, dlsn in stored}
    for p, host in zip(producers, cluster.names[1:], strict=True):
        acked = p.of("acked")
        for event in acked:
            assert where.get(f"{host}:{event['record']}") == event["dlsn"], event
        mine = [int(payload.split(":")[1]) for payload in payloads if payload.startswith(host)]
        assert mine == sorted(mine), f"{host}'s records out of its order"


def test_a_producer_the_cluster_does_not_authorize_is_refused_naming_the_log_server(
        curve_hosts):
    cluster, keys = curve_hosts
    producer = cluster.worker(CLIENT, "produce", "--log", "mh-refused", "--producer", "bad",
                              "--records", "1", config=_client_config(cluster, keys, "bad"))
    error = producer.wait_event("error", timeout_s=60)
    assert error["error"] == "UnauthorizedError", error
    assert "log server" in error["message"], error["message"]
    assert not producer.of("acked")
