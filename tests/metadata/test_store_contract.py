"""The MetadataStore contract: every operation and error, on both backends."""

from __future__ import annotations

import threading

import pytest

from appliance.errors import (
    ClientClosedError,
    MetadataError,
    MetadataVersionError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
)
from storage.metadata import ANY_VERSION, DATA_BYTES_MAX


def test_create_get_roundtrip_starts_at_version_zero(store):
    assert store.create("/a", b"hello") == "/a"
    assert store.get("/a") == (b"hello", 0)
    assert store.exists("/a")
    assert not store.exists("/b")


def test_create_existing_node_fails_naming_path(store):
    store.create("/a", b"1")
    with pytest.raises(NodeExistsError, match="/a"):
        store.create("/a", b"2")
    assert store.get("/a") == (b"1", 0)


def test_create_needs_parent_unless_make_parents(store):
    with pytest.raises(NoNodeError, match="/x/y"):
        store.create("/x/y/z", b"")
    assert store.create("/x/y/z", b"leaf", make_parents=True) == "/x/y/z"
    assert store.get("/x/y") == (b"", 0)
    assert store.get("/x/y/z") == (b"leaf", 0)


def test_get_missing_node_names_path(store):
    with pytest.raises(NoNodeError, match="/missing"):
        store.get("/missing")


def test_set_is_compare_and_swap(store):
    store.create("/n", b"v0")
    assert store.set("/n", b"v1", 0) == 1
    with pytest.raises(MetadataVersionError, match="/n"):
        store.set("/n", b"stale", 0)
    assert store.get("/n") == (b"v1", 1)
    assert store.set("/n", b"v2", ANY_VERSION) == 2
    assert store.get("/n") == (b"v2", 2)


def test_set_missing_node_fails(store):
    with pytest.raises(NoNodeError, match="/nothing"):
        store.set("/nothing", b"x", 0)


def test_delete_checks_version_and_children(store):
    store.create("/p", b"")
    store.create("/p/c", b"")
    with pytest.raises(NotEmptyError, match="/p"):
        store.delete("/p")
    with pytest.raises(MetadataVersionError, match="/p/c"):
        store.delete("/p/c", 3)
    store.delete("/p/c", 0)
    assert not store.exists("/p/c")
    store.delete("/p")
    with pytest.raises(NoNodeError, match="/p"):
        store.delete("/p")


def test_children_are_sorted_direct_names(store):
    store.create("/d", b"")
    for name in ("b", "a", "c"):
        store.create(f"/d/{name}", b"")
    store.create("/d/a/deep", b"")
    assert store.children("/d") == ["a", "b", "c"]
    assert store.children("/d/b") == []
    assert "d" in store.children("/")
    with pytest.raises(NoNodeError, match="/nope"):
        store.children("/nope")


def test_sequential_names_are_unique_increasing_and_padded(store):
    store.create("/q", b"")
    names = [store.create("/q/item-", b"", sequential=True) for _ in range(5)]
    store.delete(names[-1])
    names.append(store.create("/q/item-", b"", sequential=True))
    suffixes = [n.removeprefix("/q/item-") for n in names]
    assert all(len(s) == 10 and s.isdigit() for s in suffixes)
    assert [int(s) for s in suffixes] == sorted({int(s) for s in suffixes})
    assert store.children("/q") == sorted(n.rsplit("/", 1)[1] for n in names[:4] + names[5:])


def test_ephemeral_node_is_visible_to_others_and_owned(backend):
    owner, other = backend.open(), backend.open()
    owner.create("/e", b"", make_parents=False, ephemeral=True)
    owner.create("/persist", b"")
    assert other.get("/e") == (b"", 0)
    assert other.ephemeral_owner("/e") == owner.session_id != other.session_id
    assert other.ephemeral_owner("/persist") is None


def test_ephemeral_node_vanishes_when_owner_closes(backend):
    owner, other = backend.open(), backend.open()
    owner.create("/group", b"")
    owner.create("/group/member", b"me", ephemeral=True)
    owner.close()
    assert not other.exists("/group/member")
    assert other.children("/group") == []
    other.create("/group/member", b"new owner", ephemeral=True)
    assert other.get("/group/member") == (b"new owner", 0)


def test_ephemeral_node_cannot_have_children(store):
    store.create("/eph", b"", ephemeral=True)
    with pytest.raises(MetadataError, match="/eph") as info:
        store.create("/eph/child", b"")
    assert not isinstance(info.value, NoNodeError | NodeExistsError)


def test_ephemeral_sequential_node(store):
    store.create("/locks", b"")
    path = store.create("/locks/lock-", b"", sequential=True, ephemeral=True)
    assert path.startswith("/locks/lock-") and store.ephemeral_owner(path) == store.session_id


def test_bad_arguments_raise_before_anything_is_written(store):
    for bad in ("relative", "/trailing/", "/a//b", "/a/../b", "/a/./b", "/ctl\x01char"):
        with pytest.raises(ValueError, match="path"):
            store.create(bad, b"")
    with pytest.raises(TypeError, match="path"):
        store.get(b"/bytes")
    with pytest.raises(TypeError, match="data"):
        store.create("/s", "text")
    with pytest.raises(ValueError, match="DATA_BYTES_MAX"):
        store.create("/big", b"x" * (DATA_BYTES_MAX + 1))
    with pytest.raises(ValueError, match="expected_version"):
        store.set("/", b"", -2)
    with pytest.raises(ValueError, match="root"):
        store.delete("/")
    assert store.children("/") == []


def test_largest_allowed_data_roundtrips(store):
    data = bytes(range(256)) * (DATA_BYTES_MAX // 256)
    store.create("/big", data)
    assert store.get("/big") == (data, 0)


def test_closed_store_refuses_operations(backend):
    store = backend.open()
    store.close()
    store.close()  # idempotent
    with pytest.raises(ClientClosedError, match="closed"):
        store.get("/")
    with pytest.raises(ClientClosedError):
        store.create("/x", b"")


def _in_thread(fn, *args):
    """Run ``fn`` in a thread; returns (thread, result holder)."""
    result: dict = {}

    def run():
        try:
            result["value"] = fn(*args)
        except BaseException as exc:  # reported to the test below
            result["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def test_wait_for_change_sees_another_session_write(backend):
    waiter, writer = backend.open(), backend.open()
    writer.create("/w", b"0")
    thread, result = _in_thread(waiter.wait_for_change, "/w", 0, 30.0)
    writer.set("/w", b"1", 0)
    thread.join(35)
    assert not thread.is_alive()
    assert result == {"value": (b"1", 1)}


def test_wait_for_change_returns_at_once_if_already_changed(store):
    store.create("/w", b"0")
    store.set("/w", b"1", 0)
    assert store.wait_for_change("/w", 0, 30.0) == (b"1", 1)


def test_wait_for_change_times_out_with_none(store):
    store.create("/w", b"0")
    assert store.wait_for_change("/w", 0, 0.2) is None


def test_wait_for_change_on_deleted_node_raises(backend):
    waiter, writer = backend.open(), backend.open()
    writer.create("/w", b"0")
    thread, result = _in_thread(waiter.wait_for_change, "/w", 0, 30.0)
    writer.delete("/w")
    thread.join(35)
    assert isinstance(result.get("error"), NoNodeError)
    with pytest.raises(NoNodeError, match="/w"):
        waiter.wait_for_change("/w", 0, 1.0)


def test_wait_for_children_change(backend):
    waiter, writer = backend.open(), backend.open()
    writer.create("/set", b"")
    writer.create("/set/a", b"")
    assert waiter.wait_for_children_change("/set", ["a"], 0.2) is None
    thread, result = _in_thread(waiter.wait_for_children_change, "/set", {"a"}, 30.0)
    writer.create("/set/b", b"", ephemeral=True)
    thread.join(35)
    assert result == {"value": ["a", "b"]}
    assert waiter.wait_for_children_change("/set", ["a"], 30.0) == ["a", "b"]


def test_sync_makes_another_sessions_writes_visible(backend):
    writer, reader = backend.open(), backend.open()
    reader.sync()
    writer.create("/synced", b"v1")
    reader.sync("/synced")  # after it returns, the write acknowledged before is seen
    assert reader.get("/synced") == (b"v1", 0)
    with pytest.raises(ValueError):
        reader.sync("no-slash")
