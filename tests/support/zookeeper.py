"""pytest plugin: a real ZooKeeper (from pyspark's jars) for the test session.

Fixtures:

* ``zookeeper`` (session scope): one server for the whole run (the JVM takes
  seconds to start).  ``.hosts`` is "127.0.0.1:PORT"; ``.new_uri()`` gives a
  ``zk://`` URI with a fresh chroot, so tests never see each other's nodes.
  The server is killed, and waited for, at the end of the session.
* ``zookeeper_factory``: starts private servers a test may kill; every one is
  stopped when the test ends, also on failure.

Nothing here is skipped: without Java or pyspark the fixture errors out.
"""

from __future__ import annotations

import itertools
import os

import pytest

from appliance.bench.zk_server import ZooKeeperServer

_chroots = itertools.count()


class ZooKeeperFixture:
    def __init__(self, server: ZooKeeperServer):
        self.server = server

    @property
    def hosts(self) -> str:
        return self.server.hosts

    def new_uri(self, prefix: str = "t") -> str:
        """A zk:// URI with a chroot no other test uses."""
        return self.server.uri(f"/tests/{prefix}-{os.getpid()}-{next(_chroots)}")


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory):
    server = ZooKeeperServer(tmp_path_factory.mktemp("zookeeper"), die_with_parent=True)
    server.start()
    try:
        yield ZooKeeperFixture(server)
    finally:
        server.stop()


@pytest.fixture
def zookeeper_factory(tmp_path):
    servers: list[ZooKeeperServer] = []

    def start() -> ZooKeeperServer:
        server = ZooKeeperServer(tmp_path / f"zk{len(servers)}", die_with_parent=True)
        servers.append(server)
        return server.start()

    try:
        yield start
    finally:
        for server in servers:
            server.stop()
