"""Checkpoints that do not stop adds: while a checkpoint writes its snapshot,
adds, fences and reads go on; the snapshot holds the index as of the
checkpoint's start (copy on write), and a crash right after it loses nothing
added before, during or after it."""

from __future__ import annotations

import os
import threading

import numpy as np

from storage import journal
from storage import storage_files as sf
from storage.index import PAGE_SLOTS, Index

from .test_ledger_storage import payload


def _put(index: Index, ledger: int, entries, log_id: int = 1) -> None:
    entries = np.asarray(list(entries), np.uint64)
    n = len(entries)
    index.put_batch(np.full(n, ledger, np.uint64), entries, log_id,
                    np.arange(n, dtype=np.int64) * 100, np.full(n, 10, np.int64))


def test_frozen_index_keeps_its_state_while_the_live_one_changes():
    index = Index()
    _put(index, 1, range(100))
    index.ensure(1).fenced = False
    frozen = index.freeze()
    _put(index, 1, range(50, 200), log_id=2)  # overwrites part of a shared page, grows it
    _put(index, 1, [PAGE_SLOTS + 1], log_id=2)  # a new page
    _put(index, 7, range(30), log_id=2)  # a new ledger (more than the few-entry path)
    _put(index, 1, [3], log_id=3)  # the few-entry path writes in place too
    index.ensure(1).fenced = True
    assert frozen.locate(1, 60) == (1, 6000, 10) and frozen.locate(1, 3) == (1, 300, 10)
    assert frozen.ledger(1).last_entry == 99 and not frozen.ledger(1).fenced
    assert frozen.entry_count() == 100 and 7 not in frozen.ledgers
    assert index.locate(1, 60) == (2, 1000, 10) and index.locate(1, 3) == (3, 0, 10)
    assert index.locate(1, PAGE_SLOTS + 1)[0] == 2 and index.ledger(1).last_entry > PAGE_SLOTS
    index.thaw()
    page = index.ledger(1).pages[0]
    _put(index, 1, [4], log_id=4)
    assert index.ledger(1).pages[0] is page  # after thaw: written in place again


def _blocking_snapshot(monkeypatch):
    """Make the snapshot write wait for ``release``; ``writing`` is set once it started."""
    writing, release = threading.Event(), threading.Event()
    real = sf.save_snapshot

    def slow_save(st, meta, index):
        writing.set()
        assert release.wait(60), "the test never released the snapshot write"
        real(st, meta, index)

    monkeypatch.setattr(sf, "save_snapshot", slow_save)
    return writing, release


def test_adds_and_reads_go_on_during_a_checkpoint_and_survive_a_crash(opener, monkeypatch):
    st = opener()
    before = st.add_entries([1] * 50, list(range(50)), [payload(1, e) for e in range(50)])
    st.wait_durable(before, timeout_s=10)
    done_before = st.stats()["checkpoints"]  # open() may have checkpointed
    writing, release = _blocking_snapshot(monkeypatch)
    errors: list[BaseException] = []

    def run_checkpoint():
        try:
            st.checkpoint()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    thread = threading.Thread(target=run_checkpoint)
    thread.start()
    try:
        assert writing.wait(30), "the checkpoint never reached its snapshot write"
        # The checkpoint is stuck in its slow part: the storage must still serve.
        during = st.add_entries([1] * 50 + [2], list(range(50, 100)) + [0],
                                [payload(1, e) for e in range(50, 100)] + [payload(2, 0)])
        fence = st.fence(3)
        assert st.wait_durable(max(during, fence), timeout_s=10)
        assert st.read_entries(1, 0, 99) == [payload(1, e) for e in range(100)]
        assert thread.is_alive() and st.stats()["checkpoints"] == done_before
    finally:
        release.set()
        thread.join(60)
    assert not errors, errors
    assert st.stats()["checkpoints"] == done_before + 1
    after = st.add_entries([2], [1], [payload(2, 1)])
    st.wait_durable(after, timeout_s=10)
    st.abort()  # a crash right after the checkpoint
    monkeypatch.undo()
    st2 = opener()
    assert not st2.clean_shutdown_before
    assert st2.read_entries(1, 0, 99) == [payload(1, e) for e in range(100)]
    assert st2.read_entries(2, 0, 1) == [payload(2, 0), payload(2, 1)]
    assert st2.is_fenced(3)
    # The snapshot covered the first 50 entries: replay started after them.
    assert st2.recovery_stats["recovered_journal_records"] < 50 + 3


def test_close_during_a_checkpoint_waits_for_it_and_shuts_down_clean(opener, monkeypatch):
    st = opener()
    st.add_entries([1] * 10, list(range(10)), [payload(1, e) for e in range(10)])
    writing, release = _blocking_snapshot(monkeypatch)
    thread = threading.Thread(target=st.checkpoint)
    thread.start()
    try:
        assert writing.wait(30)
        st.add_entry(1, 10, payload(1, 10))
        closer = threading.Thread(target=st.close)
        closer.start()
        release.set()
        closer.join(60)
        assert not closer.is_alive()
    finally:
        release.set()
        thread.join(60)
    monkeypatch.undo()
    st2 = opener()
    assert st2.clean_shutdown_before  # close checkpointed everything: nothing to replay
    assert st2.read_entries(1, 0, 10) == [payload(1, e) for e in range(11)]


def _segments(journal_dir) -> list[str]:
    return sorted(n for n in os.listdir(journal_dir) if n.endswith(".seg"))


def test_old_segments_are_freed_in_steps_and_a_crash_midway_is_harmless(opener, dirs,
                                                                          monkeypatch):
    monkeypatch.setattr(journal, "FREE_STEP_BYTES", 64 * 1024)  # 512 KiB segments: 8 steps
    monkeypatch.setattr(journal, "FREE_PAUSE_S", 0.0)
    st = opener()
    for first in range(0, 600, 20):  # ~1.2 MiB of journal over 512 KiB segments
        st.add_entries([2] * 20, list(range(first, first + 20)),
                       [payload(2, e, 2000) for e in range(first, first + 20)])
    st.flush()
    assert len(_segments(dirs[0])) >= 3
    real_shrink, shrunk = journal._shrink_gradually, []

    def shrink_then_crash(path):
        real_shrink(path)
        shrunk.append(os.path.getsize(path))
        raise OSError("simulated crash after shrinking, before the unlink")

    monkeypatch.setattr(journal, "_shrink_gradually", shrink_then_crash)
    try:
        st.checkpoint()
    except OSError:
        pass
    assert shrunk and shrunk[0] <= 64 * 1024  # shrunk in steps down to the last one
    st.abort()
    monkeypatch.setattr(journal, "_shrink_gradually", real_shrink)
    st2 = opener()  # the shrunk segment lies before the snapshot's mark: never replayed
    assert st2.read_entries(2, 0, 599) == [payload(2, e, 2000) for e in range(600)]
    st2.checkpoint()
    assert len(_segments(dirs[0])) == 1
