"""The bookie's garbage collector against a real storage and a scripted
metadata listing: what it deletes, and every case where it must not."""

from __future__ import annotations

import time

import pytest

from appliance.bookie.ledger_gc import LedgerGC
from appliance.errors import MetadataUnavailableError, NoSuchLedgerError
from storage import LedgerStorage
from tests.storage.conftest import small_options


class FakeLedgers:
    """A metadata store's ledger list; ``on_list`` runs inside the listing."""

    def __init__(self, ids):
        self.ids = set(ids)
        self.on_list = None
        self.fail = False

    def list_ledgers(self):
        if self.fail:
            raise MetadataUnavailableError("metadata store unreachable")
        if self.on_list:
            self.on_list()
        return sorted(self.ids)

    def read_ledger(self, ledger_id):
        if ledger_id not in self.ids:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist")
        return object(), 0


@pytest.fixture
def storage(tmp_path):
    j, d = tmp_path / "j", tmp_path / "d"
    LedgerStorage.format("b", j, d, small_options())
    st = LedgerStorage.open("b", j, d, small_options())
    yield st
    st.abort()


def _add(st, ledger_id, n=3):
    st.wait_durable(st.add_entries([ledger_id] * n, list(range(n)), [b"x" * 100] * n), 10)


def test_a_ledger_is_deleted_after_two_passes_without_metadata(storage):
    for lid in (1, 2, 3):
        _add(storage, lid)
    md = FakeLedgers({1, 2, 3})
    gc = LedgerGC(storage, md, 1000)
    assert gc.run_once() == []
    md.ids.discard(2)
    assert gc.run_once() == []  # first miss: only a suspect
    assert storage.ledger_exists(2)
    assert gc.run_once() == [2]
    assert storage.ledgers() == [1, 3] and gc.stats["ledgers_deleted"] == 1


def test_a_ledger_back_in_the_listing_or_found_by_id_is_kept(storage):
    _add(storage, 5)
    md = FakeLedgers(set())
    gc = LedgerGC(storage, md, 1000)
    gc.run_once()                 # suspect
    md.ids.add(5)
    gc.run_once()                 # listed again: no longer a suspect
    md.ids.discard(5)
    gc.run_once()                 # suspect again (first miss)
    assert storage.ledger_exists(5)

    class ListingMisses(FakeLedgers):  # a lagging listing; the read by id finds it
        def list_ledgers(self):
            return []
    gc2 = LedgerGC(storage, ListingMisses({5}), 1000)
    gc2.run_once()
    assert gc2.run_once() == [] and storage.ledger_exists(5)


def test_a_ledger_created_while_listing_is_not_a_suspect(storage):
    md = FakeLedgers(set())
    gc = LedgerGC(storage, md, 1000)
    md.on_list = lambda: _add(storage, 9)  # written after the local snapshot was taken
    gc.run_once()
    md.on_list = None
    # Not suspected in the first pass (it was not stored when that pass began),
    # so the second pass only suspects it: a listing taken before the local
    # snapshot would have made it a suspect already and deleted it here.
    assert gc.run_once() == [] and storage.ledger_exists(9)


def test_an_unreachable_store_changes_nothing(storage):
    _add(storage, 4)
    md = FakeLedgers(set())
    gc = LedgerGC(storage, md, 1000)
    gc.run_once()
    md.fail = True
    with pytest.raises(MetadataUnavailableError):
        gc.run_once()
    assert storage.ledger_exists(4)


# -- over-replicated ledgers ------------------------------------------------------------
ME = "bookie-9"


def _md(ledger_id, bookies, state="CLOSED", last=2):
    from appliance.protocol.metadata import LedgerMetadata

    return LedgerMetadata(ledger_id=ledger_id, ensemble_size=3, write_quorum=3, ack_quorum=2,
                          ensembles=((0, tuple(bookies)),), state=state,
                          last_entry_id=last if state == "CLOSED" else -1)


class MetaLedgers(FakeLedgers):
    """Ledgers with metadata; ``on_read(ledger_id)`` runs before each read."""

    def __init__(self, mds):
        super().__init__(mds)
        self.mds = dict(mds)
        self.on_read = None

    def read_ledger(self, ledger_id):
        if self.on_read:
            self.on_read(ledger_id)
        if ledger_id not in self.mds:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist")
        return self.mds[ledger_id], 3


class Clock:
    def __init__(self):
        self.now_ms = 0

    def __call__(self):
        return self.now_ms


@pytest.fixture
def markers(tmp_path):
    from appliance.rereplication.markers import CopyMarkers
    from storage.metadata import open_store

    store = open_store(f"sqlite:///{tmp_path / 'meta.db'}")
    yield CopyMarkers(store)
    store.close()


def _orep_gc(storage, md, markers, clock, grace_ms=1000):
    return LedgerGC(storage, md, 1000, bookie_id=ME, markers=markers,
                    overreplicated_grace_ms=grace_ms, clock_ms=clock)


def _passes(gc, clock, n, step_ms=600):
    deleted = []
    for _ in range(n):
        clock.now_ms += step_ms
        deleted += gc.run_once()
        deleted += gc.last_overreplicated
    return deleted


def test_an_overreplicated_ledger_is_deleted_after_the_grace_a_named_one_never(storage, markers):
    moved, named = 1, 2
    for lid in (moved, named):
        _add(storage, lid)
    md = MetaLedgers({moved: _md(moved, ["b1", "b2", "b3"]), named: _md(named, ["b1", "b2", ME])})
    clock = Clock()
    gc = _orep_gc(storage, md, markers, clock)
    assert _passes(gc, clock, 2) == []   # seen, waiting: 2 passes, 600 ms
    assert storage.ledger_exists(moved) and gc.stats["overreplicated_waiting"] == 1
    assert _passes(gc, clock, 1) == [moved]  # 3 passes, 1200 ms >= grace
    assert storage.ledgers() == [named]
    assert gc.stats["overreplicated_deleted"] == 1
    assert gc.stats["overreplicated_entries_deleted"] == 3
    assert gc.stats["ledgers_deleted"] == 0  # the metadata-gone counter is another thing
    assert _passes(gc, clock, 10) == [] and storage.ledgers() == [named]


def test_off_when_the_grace_is_zero(storage, markers):
    _add(storage, 1)
    clock = Clock()
    gc = _orep_gc(storage, MetaLedgers({1: _md(1, ["b1", "b2", "b3"])}), markers, clock, 0)
    assert _passes(gc, clock, 10, step_ms=10**6) == [] and storage.ledger_exists(1)


def test_a_copy_marker_keeps_the_copies_until_released(storage, markers):
    _add(storage, 1)
    clock = Clock()
    gc = _orep_gc(storage, MetaLedgers({1: _md(1, ["b1", "b2", "b3"])}), markers, clock)
    with markers.hold(1, ME):
        assert _passes(gc, clock, 10) == []
        assert storage.ledger_exists(1)
    with markers.hold(1, "bookie-1"):  # a marker for another bookie changes nothing here
        assert _passes(gc, clock, 3) == [1]


def test_a_marker_taken_after_the_passes_but_before_the_delete_wins(storage, markers):
    _add(storage, 1)
    clock = Clock()
    md = MetaLedgers({1: _md(1, ["b1", "b2", "b3"])})
    gc = _orep_gc(storage, md, markers, clock)
    _passes(gc, clock, 2)
    held = []
    real_held_for = markers.held_for

    def marker_appears(ledger_id, bookie_id):  # a re-replicator starts right then
        held.append(markers.create(1, ME))
        return real_held_for(ledger_id, bookie_id)
    markers.held_for = marker_appears
    assert _passes(gc, clock, 1) == [] and storage.ledger_exists(1)
    assert gc.stats["overreplicated_kept"] == 1 and held


def test_metadata_that_names_the_bookie_again_at_the_last_read_wins(storage, markers):
    _add(storage, 1)
    clock = Clock()
    md = MetaLedgers({1: _md(1, ["b1", "b2", "b3"])})
    gc = _orep_gc(storage, md, markers, clock)
    _passes(gc, clock, 2)
    real_held_for = markers.held_for

    def cas_lands(ledger_id, bookie_id):  # right after the marker check, before the re-read
        md.mds[1] = _md(1, ["b1", "b2", ME])
        return real_held_for(ledger_id, bookie_id)
    markers.held_for = cas_lands
    assert _passes(gc, clock, 1) == [] and storage.ledger_exists(1)
    assert gc.stats["overreplicated_kept"] == 1


def test_an_add_while_waiting_refuses_the_delete_and_restarts_the_wait(storage, markers):
    _add(storage, 1)
    clock = Clock()
    md = MetaLedgers({1: _md(1, ["b1", "b2", "b3"])})
    gc = _orep_gc(storage, md, markers, clock)
    _passes(gc, clock, 2)
    _add(storage, 1, n=1)  # a copy arrives (e.g. a re-replicator that took no marker)
    assert _passes(gc, clock, 1) == [] and storage.ledger_exists(1)
    assert gc.stats["overreplicated_kept"] == 1
    assert _passes(gc, clock, 2) == []  # a new wait, from a new mark
    assert _passes(gc, clock, 1) == [1]


def test_in_recovery_limbo_and_metadata_gone_are_left_alone(storage, markers):
    for lid in (1, 2, 3):
        _add(storage, lid)
    storage.wait_durable(storage.mark_limbo(2), 10)
    md = MetaLedgers({1: _md(1, ["b1", "b2", "b3"], state="IN_RECOVERY"),
                      2: _md(2, ["b1", "b2", "b3"])})
    md.ids = {1, 2, 3}  # 3 is listed but its record is gone when read by id
    clock = Clock()
    gc = _orep_gc(storage, md, markers, clock)
    assert _passes(gc, clock, 10) == []
    assert storage.ledgers() == [1, 2, 3]


def test_a_fenced_overreplicated_ledger_stays_fenced(storage, markers):
    _add(storage, 1)
    storage.wait_durable(storage.fence(1), 10)
    clock = Clock()
    gc = _orep_gc(storage, MetaLedgers({1: _md(1, ["b1", "b2", "b3"])}), markers, clock)
    assert _passes(gc, clock, 3) == [1]
    assert storage.is_fenced(1) and storage.ledger_entry_count(1) == 0
    assert _passes(gc, clock, 5) == []  # an empty fenced ledger is not collected again


def test_a_damaged_metadata_record_keeps_the_copy_and_the_gc_going(storage, markers):
    from appliance.errors import CorruptMetadataError

    for lid in (1, 2):
        _add(storage, lid)

    class Damaged(MetaLedgers):
        def read_ledger(self, ledger_id):
            if ledger_id == 2:
                raise CorruptMetadataError(f"ledger {ledger_id}: not a ledger record")
            return super().read_ledger(ledger_id)
    md = Damaged({1: _md(1, ["b1", "b2", "b3"]), 2: _md(2, ["b1", "b2", "b3"])})
    clock = Clock()
    gc = _orep_gc(storage, md, markers, clock)
    assert _passes(gc, clock, 3) == [1]
    assert storage.ledgers() == [2] and gc.stats["failed_passes"] == 0


class LaggingLedgers(FakeLedgers):
    """A follower behind the leader: listings and reads see ``seen``, which
    catches up with ``ids`` only at ``store.sync()``."""

    def __init__(self, ids, seen):
        super().__init__(ids)
        self.seen = set(seen)
        self.syncs = 0
        self.store = self

    def sync(self):
        self.syncs += 1
        self.seen = set(self.ids)

    def list_ledgers(self):
        return sorted(self.seen)

    def read_ledger(self, ledger_id):
        if ledger_id not in self.seen:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist")
        return object(), 0


def test_collect_now_deletes_in_one_pass_what_a_synced_read_does_not_find(storage):
    for lid in (1, 2, 3):
        _add(storage, lid)
    # 2 is deleted; 3 exists but the lagging follower does not show it yet
    md = LaggingLedgers(ids={1, 3}, seen={1})
    gc = LedgerGC(storage, md, 1000)
    assert gc.collect_now() == [2]
    assert md.syncs == 1 and storage.ledgers() == [1, 3]
    assert gc.stats["ledgers_deleted"] == 1
    assert gc.collect_now() == [] and md.syncs == 1  # nothing missing: no sync


def test_collect_now_clears_what_the_periodic_passes_suspected(storage):
    _add(storage, 4)
    md = LaggingLedgers(ids=set(), seen=set())
    gc = LedgerGC(storage, md, 1000)
    assert gc.run_once() == []  # a suspect after one periodic pass
    assert gc.collect_now() == [4]
    assert gc.run_once() == [] and storage.ledgers() == []


def test_collect_now_changes_nothing_when_the_store_is_unreachable(storage):
    _add(storage, 6)
    md = FakeLedgers(set())
    md.fail = True
    gc = LedgerGC(storage, md, 1000)
    with pytest.raises(MetadataUnavailableError):
        gc.collect_now()
    assert storage.ledgers() == [6]


def test_the_pass_that_deletes_a_ledger_gives_its_active_log_bytes_back(tmp_path):
    opts = small_options(entry_log_rotate_bytes=64 << 20, entry_log_rotate_garbage_bytes=256 << 10)
    j, d = tmp_path / "j", tmp_path / "d"
    LedgerStorage.format("b", j, d, opts)
    st = LedgerStorage.open("b", j, d, opts)
    try:
        for first in range(0, 1000, 50):  # ~1 MB of ledger 9, all in the active log
            st.wait_durable(st.add_entries([9] * 50, list(range(first, first + 50)),
                                           [b"y" * 1000] * 50), 10)
        _add(st, 1)
        before = st.disk_usage(0)["entry_log_bytes"]
        md = FakeLedgers({1})
        gc = LedgerGC(st, md, 1000)
        assert gc.run_once() == [] and st.disk_usage(0)["entry_log_bytes"] == before
        assert gc.run_once() == [9]
        assert gc.stats["active_log_rotations"] == 1 and gc.stats["compactions_started"] == 1
        deadline = time.monotonic() + 30  # the compaction it started (ledger 1 shared the log)
        while st.disk_usage(0)["entry_log_bytes"] > before - 900_000:
            assert time.monotonic() < deadline, (before, st.disk_usage(0))
            time.sleep(0.01)
        assert st.read_entries(1, 0, 2) == [b"x" * 100] * 3
    finally:
        st.abort()
