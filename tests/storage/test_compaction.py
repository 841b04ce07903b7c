"""Compaction: entry logs that are mostly garbage are rewritten and removed;
every live entry reads back (during the run, after it, after a restart and
after a crash at each step), and the disk follows the data."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from appliance.errors import CorruptRecordError
from storage import compaction
from storage.codec import RECORD_HEADER_BYTES
from storage.compaction import plan
from storage.entry_log import list_logs, log_path
from storage.index import Index

LEDGERS = list(range(10, 20))


def _interleaved(st, ledgers, rounds: int, size: int = 900) -> dict[int, list[bytes]]:
    """``rounds`` batches, each one entry of every ledger: ledgers share every log."""
    data = {led: [] for led in ledgers}
    for r in range(rounds):
        batch = [os.urandom(size) for _ in ledgers]
        ticket = st.add_entries(ledgers, [r] * len(ledgers), batch)
        for led, payload in zip(ledgers, batch, strict=True):
            data[led].append(payload)
    st.wait_durable(ticket, timeout_s=30)
    return data


def _log_bytes(ledger_dir) -> int:
    return sum(os.stat(log_path(str(ledger_dir), i)).st_size for i in list_logs(str(ledger_dir)))


def _reads_back(st, data) -> None:
    for led, payloads in data.items():
        assert st.read_entries(led, 0, len(payloads) - 1) == payloads, led


def test_plan_takes_sealed_logs_under_the_threshold_emptiest_first():
    sizes = {1: 4096 + 1000, 2: 4096 + 1000, 3: 4096 + 1000, 4: 4096 + 1000, 5: 4096 + 1000}
    live = {1: 500, 2: 100, 3: 900, 5: 0}
    # 4 holds nothing live (share 0), 5 is at the mark (not sealed before it), 3 is too full
    assert plan(sizes, live, 5, set(), 0.6) == [(4, 0, 5096), (2, 100, 5096), (1, 500, 5096)]
    assert plan(sizes, live, 5, {4}, 0.6) == [(2, 100, 5096), (1, 500, 5096)]  # garbage already
    assert plan(sizes, live, 5, set(), 0.05) == [(4, 0, 5096)]


def test_index_scans_agree_with_entry_by_entry_lookups():
    index = Index()
    rng = np.random.default_rng(5)
    for ledger in (1, 2, 3):
        entries = np.unique(rng.integers(0, 20_000, 3000)).astype(np.uint64)
        logs = rng.integers(1, 4, len(entries))
        for log_id in (1, 2, 3):
            sel = logs == log_id
            n = int(sel.sum())
            index.put_batch(np.full(n, ledger, np.uint64), entries[sel], log_id,
                            rng.integers(0, 1 << 30, n).astype(np.uint32),
                            rng.integers(0, 5000, n).astype(np.uint32))
    expect_live: dict[int, int] = {}
    expect_rows = []
    for ledger, led in index.ledgers.items():
        for page_no, page in led.pages.items():
            for slot, (log_id, offset, length) in enumerate(page.tolist()):
                if length != 0xFFFF_FFFF:
                    expect_live[log_id] = expect_live.get(log_id, 0) + length + 24
                    if log_id == 2:
                        expect_rows.append((ledger, (page_no << 12) + slot, offset, length))
    assert index.live_bytes_by_log(24) == expect_live
    got = _rows_in_log(index, 2)
    assert sorted(map(tuple, got.tolist())) == sorted(expect_rows)
    some = got[got[:, 0] == 1][:50]
    ok = index.still_at(1, some[:, 1], 2, some[:, 2])
    assert ok.all()
    moved = some[:5]
    index.put_batch(np.full(5, 1, np.uint64), moved[:, 1].astype(np.uint64), 3,
                    np.zeros(5, np.uint32), np.ones(5, np.uint32))
    ok = index.still_at(1, some[:, 1], 2, some[:, 2])
    assert not ok[:5].any() and ok[5:].all()
    assert not index.still_at(99, some[:, 1], 2, some[:, 2]).any()


def _rows_in_log(index, log_id: int) -> np.ndarray:
    """(ledger, entry, offset, length) of every entry the index has in ``log_id``."""
    parts = [np.stack([ledgers[rows[:, 0] == log_id], entries[rows[:, 0] == log_id],
                       rows[rows[:, 0] == log_id, 1].astype(np.int64),
                       rows[rows[:, 0] == log_id, 2].astype(np.int64)], axis=1)
             for ledgers, entries, rows in index.slot_chunks(slots_max=5000)]
    return np.concatenate(parts)


def test_deleted_ledgers_space_comes_back_and_survivors_read_back(opener, dirs):
    _journal_dir, ledger_dir = dirs
    st = opener()
    data = _interleaved(st, LEDGERS, 300)  # ~2.8 MB over several 512 KiB logs
    keep = {led: data[led] for led in LEDGERS[:3]}
    for led in LEDGERS[3:]:
        st.delete_ledger(led)
    before = _log_bytes(ledger_dir)
    st.checkpoint()
    _removed, gc_freed = st.reclaim_entry_logs()
    if not st.options.entry_log_per_ledger:
        assert gc_freed == 0  # every interleaved log still holds a live entry
    result = st.compact(major=True)
    live = sum(len(p) + RECORD_HEADER_BYTES for payloads in keep.values() for p in payloads)
    after = _log_bytes(ledger_dir)
    assert result["logs_removed"] == result["logs_compacted"]
    if not st.options.entry_log_per_ledger:
        assert result["logs_compacted"] >= 5
    assert after < 0.4 * before and result["bytes_reclaimed"] > 0
    assert after < 1.5 * live, (after, live, before)
    usage = st.disk_usage(max_age_s=0)
    assert usage["live_bytes"] == live and usage["entry_log_bytes"] == after
    assert usage["garbage_bytes"] == after - live
    _reads_back(st, keep)
    st.close()
    st = opener()  # restart
    _reads_back(st, keep)
    assert st.compact(major=True)["logs_compacted"] == 0  # nothing left under 0.8


@pytest.fixture
def interleaved(tmp_path):
    """One interleaved-mode storage (per-ledger logs hold one ledger each: a
    log there is never a quarter garbage, so this case is interleaved only)."""
    from storage import LedgerStorage

    from .conftest import small_options

    options = small_options(entry_log_per_ledger=False)
    dirs = (tmp_path / "j", tmp_path / "l")
    LedgerStorage.format("bookie-1", *dirs, options)
    st = LedgerStorage.open("bookie-1", *dirs, options)
    yield st
    st.abort()


def test_minor_threshold_leaves_fuller_logs(interleaved):
    st = interleaved
    data = _interleaved(st, LEDGERS[:4], 400)
    st.delete_ledger(LEDGERS[0])  # a quarter of each log is garbage: live share 0.75
    result = st.compact(major=False)  # minor: 0.2
    assert result["logs_compacted"] == 0
    result = st.compact(major=True)  # major: 0.8
    assert result["logs_compacted"] >= 3
    _reads_back(st, {led: data[led] for led in LEDGERS[1:4]})


def test_reads_never_fail_while_compaction_runs(opener):
    st = opener()
    data = _interleaved(st, LEDGERS, 300)
    for led in LEDGERS[2:]:
        st.delete_ledger(led)
    keep = {led: data[led] for led in LEDGERS[:2]}
    errors, stop, reads = [], threading.Event(), [0]

    def reader():
        rng = np.random.default_rng(1)
        while not stop.is_set():
            led = LEDGERS[int(rng.integers(0, 2))]
            first = int(rng.integers(0, 300))
            last = min(299, first + int(rng.integers(0, 40)))
            try:
                got = st.read_entries(led, first, last)
                assert got == keep[led][first:last + 1]
                assert st.read_entry(led, last) == keep[led][last]
                reads[0] += 1
            except Exception as exc:  # noqa: BLE001 - the test asserts there is none
                errors.append(exc)
                return

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for _ in range(3):
            st.compact(major=True)
            _interleaved(st, [LEDGERS[-1] + 1], 50)  # adds go on too
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert errors == [] and reads[0] > 0
    _reads_back(st, keep)


def test_a_crash_after_copying_before_the_switch_is_durable_loses_nothing(opener, dirs):
    """Copies made, index switched in memory, no checkpoint yet: the crash
    leaves the old snapshot, which points into the old log; it is still there."""
    st = opener()
    data = _interleaved(st, LEDGERS, 300)
    for led in LEDGERS[2:]:
        st.delete_ledger(led)
    keep = {led: data[led] for led in LEDGERS[:2]}
    with st._lock:
        st._logs.rotate()
    st.checkpoint()
    sealed = [i for i in list_logs(str(dirs[1])) if i < st._persisted[1]]
    for log_id in sealed:
        st._compactor._copy_log(log_id)
    assert st._garbage == set(sealed)
    st.abort()  # kill -9 between copy and index switch
    st = opener()
    _reads_back(st, keep)
    assert set(sealed) <= set(list_logs(str(dirs[1])))  # nothing removed early
    st.compact(major=True)  # and a later run finishes the job
    _reads_back(st, keep)
    assert not set(sealed) & set(list_logs(str(dirs[1])))


def test_a_crash_right_after_removal_reopens_clean(opener, dirs):
    st = opener()
    data = _interleaved(st, LEDGERS, 300)
    for led in LEDGERS[2:]:
        st.delete_ledger(led)
    st.compact(major=True)
    st.abort()
    st = opener()
    _reads_back(st, {led: data[led] for led in LEDGERS[:2]})
    assert st._garbage == set()


def test_removing_the_old_log_before_the_switch_is_durable_loses_entries(
        opener, dirs, monkeypatch):
    """The mutation the crash test must catch, shown deterministically."""
    monkeypatch.setattr(compaction, "REMOVE_BEFORE_CHECKPOINT", True)
    st = opener(entry_log_buffer_bytes=1 << 20)  # the copies stay in the buffer a crash drops
    data = _interleaved(st, LEDGERS, 300)
    for led in LEDGERS[2:]:
        st.delete_ledger(led)
    st.compact(major=True)
    _reads_back(st, {led: data[led] for led in LEDGERS[:2]})  # fine until a crash
    st.abort()
    st = opener()
    with pytest.raises(CorruptRecordError, match="missing"):
        _reads_back(st, {led: data[led] for led in LEDGERS[:2]})


def test_a_corrupt_record_stops_that_log_only_and_keeps_it(opener, dirs):
    st = opener()
    data = _interleaved(st, LEDGERS, 300)
    for led in LEDGERS[2:]:
        st.delete_ledger(led)
    with st._lock:
        st._logs.rotate()
    st.checkpoint()
    victim = list_logs(str(dirs[1]))[0]
    rows = _rows_in_log(st._index, victim)
    rows = rows[np.argsort(rows[:, 2])]
    offset = int(rows[0, 2]) + RECORD_HEADER_BYTES + 10  # a byte of the first live entry
    with open(log_path(str(dirs[1]), victim), "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))
    result = st.compact(major=True)
    assert result["logs_failed"] == 1 and result["logs_compacted"] >= 4
    assert victim in list_logs(str(dirs[1]))
    led, entry = int(rows[0, 0]), int(rows[0, 1])
    with pytest.raises(CorruptRecordError):
        st.read_entry(led, entry)  # as it was before compaction: nothing worse
    others = {k: v for k, v in data.items() if k in LEDGERS[:2]}
    for k, payloads in others.items():
        for e, p in enumerate(payloads):
            if (k, e) != (led, entry):
                assert st.read_entry(k, e) == p


def test_requested_runs_are_served_by_the_compactor_thread(opener):
    st = opener()
    data = _interleaved(st, LEDGERS, 200)
    for led in LEDGERS[1:]:
        st.delete_ledger(led)
    ticket = st.request_compaction(major=True)
    from tests.support.launch import wait_for
    wait_for(lambda: st.compaction_status()["requests_done"] >= ticket, 30,
             what="requested compaction")
    status = st.compaction_status()
    assert status["last"]["logs_removed"] >= 3 and status["last_error"] is None
    assert status["bytes_reclaimed_total"] == status["last"]["bytes_reclaimed"]
    assert st.stats()["compaction"]["runs"] == 1
    _reads_back(st, {LEDGERS[0]: data[LEDGERS[0]]})


def test_a_compaction_copy_is_not_activity_for_the_over_replicated_delete(opener):
    st = opener()
    data = _interleaved(st, LEDGERS[:4], 300)
    st.delete_ledger(LEDGERS[0])
    st.delete_ledger(LEDGERS[1])
    mark = st.activity_mark()
    assert st.compact(major=True)["entries_copied"] > 0  # LEDGERS[2:4] moved
    assert st.delete_ledger_if_idle(LEDGERS[2], mark) is not None
    again = _interleaved(st, [LEDGERS[3]], 1)[LEDGERS[3]]  # an add (entry 0 again) is
    assert st.delete_ledger_if_idle(LEDGERS[3], mark) is None  # activity: refused
    assert st.read_entries(LEDGERS[3], 0, 299) == again + data[LEDGERS[3]][1:]
