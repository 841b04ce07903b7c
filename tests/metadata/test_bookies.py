"""The bookie registry and cookies on both backends."""

from __future__ import annotations

import threading

import pytest

from appliance.errors import (
    CorruptMetadataError,
    MetadataVersionError,
    NodeExistsError,
    NoNodeError,
)
from appliance.meta.bookies import AVAILABLE_ROOT, COOKIES_ROOT, BookieRegistry
from storage.metadata import ANY_VERSION
from tests.support.launch import wait_for


def test_register_is_visible_to_others_with_endpoint_and_info(backend):
    bookie, client = BookieRegistry(backend.open()), BookieRegistry(backend.open())
    assert client.available() == {}
    bookie.register("bookie-1", "ipc:///tmp/b1.sock", {"disk_bytes": 10, "cpus": [0, 1]})
    bookie.register("bookie-2", "tcp://127.0.0.1:3181", read_only=True)
    assert client.available() == {
        "bookie-1": {"endpoint": "ipc:///tmp/b1.sock", "read_only": False,
                     "info": {"disk_bytes": 10, "cpus": [0, 1]}},
        "bookie-2": {"endpoint": "tcp://127.0.0.1:3181", "read_only": True, "info": {}},
    }
    bookie.unregister("bookie-2")
    bookie.unregister("bookie-2")  # idempotent
    assert list(client.available()) == ["bookie-1"]


def test_registration_vanishes_when_the_bookie_closes(backend):
    owner, client = backend.open(), BookieRegistry(backend.open())
    BookieRegistry(owner).register("bookie-1", "ipc://b1")
    assert "bookie-1" in client.available()
    owner.close()
    assert client.available() == {}


def test_read_only_flag_is_flipped_by_cas(backend):
    bookie, client = BookieRegistry(backend.open()), BookieRegistry(backend.open())
    bookie.register("bookie-1", "ipc://b1", {"x": 1})
    client.set_read_only("bookie-1", True)
    assert client.get("bookie-1") == {"endpoint": "ipc://b1", "read_only": True, "info": {"x": 1}}
    bookie.set_read_only("bookie-1", False)
    assert client.get("bookie-1")["read_only"] is False
    with pytest.raises(NoNodeError, match="bookie-9"):
        client.set_read_only("bookie-9", True)


def test_reregistering_by_the_same_session_updates_in_place(store):
    registry = BookieRegistry(store)
    registry.register("bookie-1", "ipc://old")
    registry.register("bookie-1", "ipc://new", {"v": 2})
    assert registry.get("bookie-1") == {"endpoint": "ipc://new", "read_only": False,
                                        "info": {"v": 2}}


def test_same_id_from_another_live_session_is_refused(backend):
    BookieRegistry(backend.open()).register("bookie-1", "ipc://first")
    impostor = BookieRegistry(backend.open(), stale_wait_ms=200)
    with pytest.raises(NodeExistsError, match="bookie-1"):
        impostor.register("bookie-1", "ipc://second")
    assert impostor.get("bookie-1")["endpoint"] == "ipc://first"


def test_restart_waits_for_the_previous_registration_to_expire(backend):
    old_store = backend.open()
    old = BookieRegistry(old_store)
    old.register("bookie-1", "ipc://before-crash")
    old.close()  # like a dead process: nothing will re-register it
    restarted = BookieRegistry(backend.open(), stale_wait_ms=60_000)
    result = {}

    def register():
        try:
            restarted.register("bookie-1", "ipc://after-restart")
            result["ok"] = True
        except Exception as exc:  # reported below
            result["error"] = exc

    thread = threading.Thread(target=register)
    thread.start()
    backend.expire_session(old_store)  # the old session ends (lease or server expiry)
    thread.join(60)
    assert result == {"ok": True}
    path = f"{AVAILABLE_ROOT}/bookie-1"
    assert restarted.store.ephemeral_owner(path) == restarted.store.session_id
    assert restarted.get("bookie-1")["endpoint"] == "ipc://after-restart"


def test_lost_session_re_registers_by_itself(backend):
    store = backend.open()
    registry, client = BookieRegistry(store), BookieRegistry(backend.open())
    registry.register("bookie-1", "ipc://b1", {"k": "v"}, read_only=True)
    old_session = store.session_id
    backend.expire_session(store)
    wait_for(lambda: store.session_id != old_session
             and client.store.exists(f"{AVAILABLE_ROOT}/bookie-1")
             and client.store.ephemeral_owner(f"{AVAILABLE_ROOT}/bookie-1") == store.session_id,
             timeout_s=backend.expiry_bound_s, what="re-registration on the new session")
    assert client.get("bookie-1") == {"endpoint": "ipc://b1", "read_only": True,
                                      "info": {"k": "v"}}


def test_wait_for_change_sees_a_bookie_arrive(backend):
    bookie, client = BookieRegistry(backend.open()), BookieRegistry(backend.open())
    assert client.wait_for_change(set(), 0.1) is None
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("v",
                                                               client.wait_for_change([], 30)))
    thread.start()
    bookie.register("bookie-7", "ipc://b7")
    thread.join(35)
    assert result["v"] == ["bookie-7"]


def test_bad_bookie_ids_and_arguments(store):
    registry = BookieRegistry(store)
    for bad in ("", "a/b", "..", "x" * 256, "tab\there"):
        with pytest.raises(ValueError, match="bookie_id"):
            registry.register(bad, "ipc://x")
    with pytest.raises(ValueError, match="endpoint"):
        registry.register("bookie-1", "")
    with pytest.raises(TypeError):
        registry.register("bookie-1", "ipc://x", {"not json": object()})
    with pytest.raises(TypeError, match="cookie"):
        registry.write_cookie("bookie-1", "text")
    assert registry.available() == {}


def test_corrupt_registration_is_named_and_skipped_in_listings(backend):
    bookie, client = BookieRegistry(backend.open()), BookieRegistry(backend.open())
    bookie.register("bookie-1", "ipc://b1")
    bookie.register("bookie-2", "ipc://b2")
    bookie.store.set(f"{AVAILABLE_ROOT}/bookie-2", b"\x00garbage", ANY_VERSION)
    with pytest.raises(CorruptMetadataError, match=f"{AVAILABLE_ROOT}/bookie-2"):
        client.get("bookie-2")
    assert list(client.available()) == ["bookie-1"]


def test_cookie_lifecycle(backend):
    bookie, admin = BookieRegistry(backend.open()), BookieRegistry(backend.open())
    assert bookie.read_cookie("bookie-1") is None
    assert bookie.write_cookie("bookie-1", b"identity-1") == 0
    assert admin.read_cookie("bookie-1") == (b"identity-1", 0)
    with pytest.raises(NodeExistsError, match="bookie-1"):
        bookie.write_cookie("bookie-1", b"again")
    assert bookie.write_cookie("bookie-1", b"identity-2", expected_version=0) == 1
    with pytest.raises(MetadataVersionError):
        admin.write_cookie("bookie-1", b"stale", expected_version=0)
    with pytest.raises(ValueError, match="version"):
        admin.write_cookie("bookie-1", b"blind", expected_version=ANY_VERSION)
    assert admin.read_cookie("bookie-1") == (b"identity-2", 1)
    bookie.store.close()  # cookies are persistent, unlike registrations
    admin.delete_cookie("bookie-1", 1)
    assert admin.read_cookie("bookie-1") is None


def test_corrupt_cookie_raises_naming_the_path(store):
    registry = BookieRegistry(store)
    registry.write_cookie("bookie-1", b"identity")
    path = f"{COOKIES_ROOT}/bookie-1"
    data, version = store.get(path)
    store.set(path, data[:-1] + bytes([data[-1] ^ 0x80]), version)
    with pytest.raises(CorruptMetadataError, match=path):
        registry.read_cookie("bookie-1")


def test_placement_labels_come_from_the_registration_info(store):
    from appliance.meta.bookies import bookie_locations
    from appliance.protocol.placement import Location

    registry = BookieRegistry(store)
    registry.register("bookie-1", "ipc://b1", {"host": "h1", "rack": "r1"})
    registry.register("bookie-2", "ipc://b2", {"host": "h2"}, read_only=True)
    registry.register("bookie-3", "ipc://b3", {"pid": 7})  # an older bookie: no labels
    assert bookie_locations(registry.available()) == {
        "bookie-1": Location("h1", "r1"), "bookie-2": Location("h2", "default-rack")}
