"""A process's watch of the log servers' registrations
(``appliance.logs.server_watch``), on SQLite and ZooKeeper: a subscription
fires once when the registration it knew is deleted (a supervisor
forgetting a dead server, a session closing) or replaced (a restart on the
same endpoint), and only then."""

from __future__ import annotations

import threading

import pytest

from appliance.logs.server_watch import ServerWatch
from appliance.meta.logservice import LogServiceRegistry
from tests.support.launch import wait_for

DEADLINE_S = 30.0  # a bound on a loaded machine, not a target


@pytest.fixture
def watch(backend):
    w = ServerWatch(backend.open(), rescan_s=0.5)
    w.start()
    try:
        yield w
    finally:
        w.close()


class Calls:
    def __init__(self):
        self.n = 0
        self._lock = threading.Lock()

    def __call__(self) -> None:
        with self._lock:
            self.n += 1


def _register(backend, server_id: str, endpoint: str, pid: int) -> LogServiceRegistry:
    registry = LogServiceRegistry(backend.open())
    registry.register(server_id, endpoint, {"pid": pid}, stale_wait_ms=0)
    return registry


def test_a_deleted_registration_fires_its_subscribers_only(backend, watch):
    _register(backend, "ls-1", "ipc://one", 101)
    _register(backend, "ls-2", "ipc://two", 102)
    wait_for(lambda: watch.wait_ready(1) and watch.subscribe("ls-2").registration(),
             DEADLINE_S, what="the watch seeing ls-2")
    calls = Calls()
    by_endpoint = watch.subscribe("ipc://one", calls)
    by_id = watch.subscribe("ls-1")
    other = watch.subscribe("ipc://two")
    assert by_endpoint.registration() is not None and not by_endpoint.fired()
    # what the supervisor does when it sees the server exit
    assert LogServiceRegistry(backend.open()).forget_dead_server("ls-1") == []
    wait_for(lambda: by_endpoint.fired() and by_id.fired(), DEADLINE_S,
             what="the subscriptions of ls-1 firing")
    assert calls.n == 1 and not other.fired()


def test_a_restart_on_the_same_endpoint_fires(backend, watch):
    first = _register(backend, "ls-1", "ipc://one", 101)
    sub = wait_for(lambda: (s := watch.subscribe("ipc://one")).registration() and s,
                   DEADLINE_S, what="the watch seeing ls-1")
    first.store.close()  # its session ends: the registration goes with it
    _register(backend, "ls-1", "ipc://one", 202)
    assert sub.wait_fired(DEADLINE_S)
    # a subscription made now knows the new one, and stays quiet
    again = wait_for(lambda: (s := watch.subscribe("ipc://one")).registration() and
                     LogServiceRegistry.server_record(*s.registration())["pid"] == 202 and s,
                     DEADLINE_S, what="the watch seeing the restarted ls-1")
    assert not again.wait_fired(1.0)


def test_a_subscription_before_the_registration_waits_for_it_and_cancel_silences(
        backend, watch):
    early = watch.subscribe("ipc://late")
    cancelled = watch.subscribe("ipc://late")
    cancelled.cancel()
    late = _register(backend, "ls-9", "ipc://late", 909)
    wait_for(lambda: early.registration() is not None, DEADLINE_S,
             what="the first registration seen")
    late.unregister("ls-9")
    assert early.wait_fired(DEADLINE_S)
    assert not cancelled.fired()


def test_one_watch_per_store_which_ends_with_the_store(backend):
    store = backend.open()
    watch = ServerWatch.of(store)
    assert ServerWatch.of(store) is watch and watch.running()
    sub = watch.subscribe("ipc://one")
    store.close()
    wait_for(lambda: not watch.running(), DEADLINE_S, what="the watch's thread ending")
    assert not sub.fired()
    other = backend.open()
    assert ServerWatch.of(other) is not watch
    ServerWatch.of(other).close()
