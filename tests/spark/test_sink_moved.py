"""A streaming sink's micro-batch interrupted by ``kill -9`` of its Spark
driver and replayed after the target log moved to a log server that no
longer knows the sink's producers (log servers whose rebuild window is 0:
``tests.spark.short_memory_logserver``): every row is in the log once."""

from __future__ import annotations

import sys

import pytest

from appliance.bench import launcher
from tests.logservice.support import LogServers
from tests.spark.support import BATCH, kill_in_a_batch_then_rerun, payloads_of
from tests.support.launch import wait_for


class ShortMemoryServers(LogServers):
    def start(self, server_id: str, wait: bool = True):
        proc = launcher.spawn([sys.executable, "-m", "tests.spark.short_memory_logserver",
                               "--config", str(self.cluster.config_path), "--id", server_id],
                              self.log_path(server_id))
        self.procs[server_id] = proc
        if wait:
            self.wait_registered(server_id, proc.pid)
        return proc


@pytest.fixture(scope="module")
def app(appliance_factory):
    return appliance_factory(3)


@pytest.fixture
def servers(app):
    servers = ShortMemoryServers(app.cluster, app.client)
    try:
        yield servers
    finally:
        servers.kill_all()


# Two Spark driver processes (each starts a JVM and its Python workers: 60-120 s each on
# this shared machine, 270 s for the whole test at load average 16-28) and two moves of
# the log, each waiting out the killed owner's lease: more than the default 300 s
# leaves no room on a loaded machine.
@pytest.mark.timeout(600)
def test_a_batch_replayed_after_its_log_moved_to_an_owner_that_forgot_it_is_stored_once(
        app, servers, tmp_path):
    servers.start("ls-1")
    markers = []

    def move_twice():
        """Each move made by another producer's row: ls-2 takes the log over
        (and learns the batch's rows), then ls-3, which learns only ls-2's
        segment: the marker's producer, none of the sink's."""
        for before, server in (("ls-1", "ls-2"), ("ls-2", "ls-3")):
            servers.kill(before)
            servers.start(server)
            markers.append(b"marker of " + server.encode())
            with app.client.log("target").producer() as producer:
                producer.write(markers[-1])
            assert servers.owner("target") == server
        assert wait_for(lambda: "log target: owned" in servers.log_path("ls-3").read_text(),
                        30, 0.1, what="ls-3 took the log")
        assert "1 records learnt for 1 producers" in servers.log_path("ls-3").read_text()

    kill_in_a_batch_then_rerun(app, tmp_path / "checkpoint", move_twice)
    got = payloads_of(app, "target")
    assert sorted(got) == sorted([b"copied record %d" % i for i in range(3 * BATCH)] + markers)
