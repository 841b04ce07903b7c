"""The log service's records in the metadata store (SQLite with injected
clocks, and ZooKeeper): a log's ownership lease is held by one session at
a time, taken by another only after release or the holder's expiry; server
registrations vanish with their session."""

from __future__ import annotations

from appliance.meta.logservice import LogServiceRegistry
from storage.metadata import open_store
from storage.metadata.sqlite_store import SqliteStore


class Clock:
    def __init__(self):
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


def _store(path, clock) -> SqliteStore:
    return SqliteStore(path / "meta.db", session_timeout_ms=2000, clock_ms=clock,
                       heartbeat=False, boot_id="test-boot")


def test_one_owner_at_a_time_until_release_or_expiry(tmp_path):
    clock = Clock()
    with _store(tmp_path, clock) as s1, _store(tmp_path, clock) as s2:
        one, two = LogServiceRegistry(s1), LogServiceRegistry(s2)
        assert one.owner("orders") is None
        assert one.acquire("orders", "ls-1", "ipc://a")
        assert one.acquire("orders", "ls-1", "ipc://a")  # its own lease: still held
        assert not two.acquire("orders", "ls-2", "ipc://b")
        assert one.holds("orders") and not two.holds("orders")
        assert two.owner("orders") == {"server": "ls-1", "endpoint": "ipc://a"}
        two.release("orders")  # not its lease: nothing happens
        assert two.owner("orders")["server"] == "ls-1"
        one.release("orders")
        assert two.acquire("orders", "ls-2", "ipc://b")

        # the holder stops renewing (a dead process): its lease ends at expiry
        s1.renew_session()
        assert one.acquire("events", "ls-1", "ipc://a")
        clock.now += 1999
        s2.renew_session()
        assert not two.acquire("events", "ls-2", "ipc://b")
        clock.now += 2
        assert two.owner("events") is None
        assert two.acquire("events", "ls-2", "ipc://b")
        assert not one.holds("events")


def test_registrations_list_live_servers_only(tmp_path):
    clock = Clock()
    with _store(tmp_path, clock) as s1, _store(tmp_path, clock) as s2:
        one, two = LogServiceRegistry(s1), LogServiceRegistry(s2)
        one.register("ls-1", "ipc://a", {"pid": 11}, stale_wait_ms=0)
        two.register("ls-2", "ipc://b", {"pid": 22}, stale_wait_ms=0)
        assert sorted(two.servers()) == ["ls-1", "ls-2"]
        assert two.servers()["ls-1"] == {"endpoint": "ipc://a", "pid": 11}
        clock.now += 1500
        s2.renew_session()  # ls-2 lives on; ls-1's process stopped renewing
        clock.now += 600
        assert sorted(two.servers()) == ["ls-2"]
        two.unregister("ls-2")
        assert two.servers() == {}


def test_with_zookeeper_a_lease_ends_with_its_holders_session(zookeeper):
    uri = zookeeper.new_uri("leases")
    with open_store(uri, session_timeout_ms=4000) as s1, \
            open_store(uri, session_timeout_ms=4000) as s2:
        one, two = LogServiceRegistry(s1), LogServiceRegistry(s2)
        one.register("ls-1", "ipc://a", {"pid": 11}, stale_wait_ms=0)
        assert one.acquire("orders", "ls-1", "ipc://a")
        assert not two.acquire("orders", "ls-2", "ipc://b")
        assert two.owner("orders")["server"] == "ls-1" and sorted(two.servers()) == ["ls-1"]
        s1.close()  # its session ends: its lease and registration with it
        assert two.owner("orders") is None and two.servers() == {}
        assert two.acquire("orders", "ls-2", "ipc://b") and two.holds("orders")


def test_a_dead_servers_registration_and_leases_go_at_once_and_only_its_own(tmp_path):
    """``forget_dead_server`` (its supervisor saw the process exit): the dead
    session's registration and leases are deleted without waiting for its
    expiry; another server's lease stays; a restarted server then registers
    and takes the logs at once; nothing to do for a server not registered."""
    clock = Clock()
    with _store(tmp_path, clock) as dead, _store(tmp_path, clock) as live, \
            _store(tmp_path, clock) as supervisor:
        one, two, sup = (LogServiceRegistry(s) for s in (dead, live, supervisor))
        one.register("ls-1", "ipc://a", {"pid": 11}, stale_wait_ms=0)
        two.register("ls-2", "ipc://b", {"pid": 22}, stale_wait_ms=0)
        assert one.acquire("orders", "ls-1", "ipc://a") and one.acquire("events", "ls-1", "ipc://a")
        assert two.acquire("clicks", "ls-2", "ipc://b")
        assert sorted(sup.forget_dead_server("ls-1")) == ["events", "orders"]
        assert sup.owner("orders") is None and sup.owner("events") is None
        assert sup.owner("clicks")["server"] == "ls-2" and sorted(sup.servers()) == ["ls-2"]
        assert sup.forget_dead_server("ls-1") == []  # done already
        with _store(tmp_path, clock) as restarted:  # its session has not expired: no wait
            again = LogServiceRegistry(restarted)
            again.register("ls-1", "ipc://a", {"pid": 33}, stale_wait_ms=0)
            assert again.acquire("orders", "ls-1", "ipc://a")
            assert sup.servers()["ls-1"]["pid"] == 33


def test_with_zookeeper_a_dead_servers_nodes_go_before_its_session_does(zookeeper):
    """ZooKeeper lets another session delete a live session's ephemeral
    nodes: the supervisor frees a dead server's leases while ZooKeeper still
    counts its session (60 s here), the other server's lease untouched."""
    uri = zookeeper.new_uri("dead")
    with open_store(uri, session_timeout_ms=60_000) as dead, \
            open_store(uri, session_timeout_ms=60_000) as live, \
            open_store(uri, session_timeout_ms=60_000) as supervisor:
        one, two, sup = (LogServiceRegistry(s) for s in (dead, live, supervisor))
        one.register("ls-1", "ipc://a", {"pid": 11}, stale_wait_ms=0)
        assert one.acquire("orders", "ls-1", "ipc://a")
        assert two.acquire("clicks", "ls-2", "ipc://b")
        assert sup.forget_dead_server("ls-1") == ["orders"]
        assert sup.owner("orders") is None and sup.servers() == {}
        assert sup.owner("clicks")["server"] == "ls-2"
        assert two.acquire("orders", "ls-2", "ipc://b")
