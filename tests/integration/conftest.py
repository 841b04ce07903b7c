"""Fixtures for tests against real bookie processes (see cluster.py)."""

from __future__ import annotations

import pytest

from tests.integration.cluster import Cluster, wait_registered


@pytest.fixture
def make_cluster(short_tmp):
    """Factory: ``make_cluster(n_bookies=4, **config)`` -> a started Cluster.
    Every cluster is stopped after the test, also on failure."""
    started: list[Cluster] = []

    def make(n_bookies: int = 4, start: bool = True, **kwargs) -> Cluster:
        root = short_tmp / f"c{len(started)}"
        root.mkdir()
        c = Cluster(root, n_bookies, **kwargs)
        started.append(c)
        return c.start() if start else c

    yield make
    for c in started:
        c.kill_all()


@pytest.fixture
def cluster(make_cluster):
    return make_cluster(4)


@pytest.fixture
def client(cluster):
    import appliance

    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 4)
        yield bk
