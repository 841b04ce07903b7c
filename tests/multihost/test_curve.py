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

from tests.harness.hosts import CLIENT, HostCluster, HostsOptions, curve_security

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
