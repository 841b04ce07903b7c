"""BP-32 per-ledger entry logs: the LRU cap, idle expiry, write-close
rotation, the checkpoint mark rule and the memory bound, on the manager
directly (with a fake clock) and through the facade."""

from __future__ import annotations

import os

import numpy as np

from storage import LedgerStorage
from storage.codec import RECORD_HEADER_BYTES, block_bytes_for, build_block, verify_record
from storage.entry_log import list_logs
from storage.entry_log_per_ledger import PerLedgerEntryLogger, split_by_ledger
from tests.support.launch import wait_for

from .conftest import small_options

KiB = 1024


class FakeClock:
    def __init__(self):
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def _manager(tmp_path, clock, **overrides) -> PerLedgerEntryLogger:
    knobs = dict(entry_log_per_ledger=True, entry_logs_open_max=2,
                 entry_log_ledger_buffer_bytes=8 * KiB, entry_log_idle_ms=1000)
    opts = small_options(**{**knobs, **overrides}).validate()
    return PerLedgerEntryLogger(str(tmp_path), opts, bytes(16), True, 1, clock=clock)


class Appender:
    """Appends one-record blocks and reads every one back at the end."""

    def __init__(self, mgr: PerLedgerEntryLogger):
        self.mgr, self.seq, self.placed = mgr, 0, []

    def add(self, ledger: int, entry: int, size: int = 100) -> int:
        self.seq += 1
        data = os.urandom(size)
        block, offsets = build_block(self.seq, np.array([ledger], np.uint64),
                                     np.array([entry], np.uint64), [data],
                                     np.array([size], np.int64))
        log_id, base = self.mgr.append_block(block)
        self.placed.append((ledger, entry, log_id, base + int(offsets[0]), data))
        return log_id

    def check_all(self) -> None:
        for ledger, entry, log_id, off, data in self.placed:
            raw = self.mgr.read_record(log_id, off, RECORD_HEADER_BYTES + len(data))
            assert bytes(verify_record(raw, ledger, entry, len(data), "test")) == data


def test_the_cap_rotates_the_least_recently_used_log(tmp_path):
    mgr = _manager(tmp_path, FakeClock())
    app = Appender(mgr)
    try:
        log1, log2 = app.add(1, 0), app.add(2, 0)
        assert log1 < log2 and mgr.stats["entry_logs_open"] == 2
        assert app.add(1, 1) == log1  # 1 is now the most recently used
        log3 = app.add(3, 0)          # a third ledger: 2, the LRU one, is rotated
        assert log3 > log2 and mgr.stats["entry_logs_rotated_cap"] == 1
        assert mgr.active_log(2) is None and mgr.active_log(1) == log1
        log2b = app.add(2, 1)         # 2 again: a new log (ids only grow); 1 goes now
        assert log2b > log3 and mgr.active_log(1) is None
        assert mgr.stats["entry_logs_rotated_cap"] == 2 and mgr.stats["entry_logs_open"] == 2
        app.check_all()               # buffered, in flight and rotated records read back
        mgr.sync()
        app.check_all()
        assert list_logs(str(tmp_path)) == [log1, log2, log3, log2b]
    finally:
        mgr.close()


def test_idle_logs_are_rotated_and_active_ones_kept(tmp_path):
    clock = FakeClock()
    mgr = _manager(tmp_path, clock)
    app = Appender(mgr)
    try:
        app.add(1, 0)
        clock.now_s = 0.6
        app.add(2, 0)
        clock.now_s = 0.99
        assert mgr.expire_idle() == 0
        clock.now_s = 1.2                # 1 idle 1.2 s, 2 idle 0.6 s
        assert mgr.expire_idle() == 1
        assert mgr.active_log(1) is None and mgr.active_log(2) is not None
        clock.now_s = 1.7
        log1b = app.add(1, 1)            # an append also expires: 2 idle 1.1 s
        assert mgr.active_log(2) is None and mgr.active_log(1) == log1b
        assert mgr.stats["entry_logs_rotated_idle"] == 2
        app.check_all()
    finally:
        mgr.close()


def test_checkpoint_rotates_every_log_so_the_mark_is_the_next_id(tmp_path):
    mgr = _manager(tmp_path, FakeClock(), entry_logs_open_max=4)
    app = Appender(mgr)
    try:
        for ledger in (1, 2, 3):
            app.add(ledger, 0)
        log_w = mgr.active_log(1)
        assert mgr.position == (log_w, mgr._by_log[log_w].file_off + block_bytes_for(100, 1))
        assert mgr.write_close(1) and not mgr.write_close(1)
        assert mgr.stats["entry_logs_rotated_write_close"] == 1
        token = mgr.begin_sync()
        assert mgr.stats["entry_logs_open"] == 0
        assert mgr.position == (max(list_logs(str(tmp_path))) + 1, 0)
        assert mgr.stats["entry_logs_rotated_checkpoint"] == 2
        newer = app.add(2, 1)  # after the marks: lands at or past the mark
        mgr.finish_sync(token)
        assert newer == max(list_logs(str(tmp_path)))
        app.check_all()
    finally:
        mgr.close()


def test_blocks_bigger_than_a_buffer_are_written_whole(tmp_path):
    mgr = _manager(tmp_path, FakeClock())
    app = Appender(mgr)
    try:
        app.add(1, 0, 100)
        app.add(1, 1, 20 * KiB)  # > 8 KiB buffer: its own aligned copy, in flight
        app.add(1, 2, 100)
        app.check_all()
        mgr.sync()
        app.check_all()
    finally:
        mgr.close()


def test_split_by_ledger_keeps_each_ledgers_order():
    ledgers = np.array([5, 3, 5, 3, 9], np.uint64)
    entries = np.array([0, 0, 1, 1, 0], np.uint64)
    datas = [b"a", b"b", b"c", b"d", b"e"]
    groups = split_by_ledger(ledgers, entries, datas, np.array([1] * 5, np.int64))
    got = [(g[0].tolist(), g[1].tolist(), g[2]) for g in groups]
    assert got == [([3, 3], [0, 1], [b"b", b"d"]), ([5, 5], [0, 1], [b"a", b"c"]),
                   ([9], [0], [b"e"])]
    one = split_by_ledger(ledgers[:1], entries[:1], datas[:1], np.array([1], np.int64))
    assert len(one) == 1


def test_facade_memory_stays_bounded_with_many_ledgers_and_reads_back(tmp_path):
    opts = small_options(entry_log_per_ledger=True, entry_logs_open_max=4,
                         entry_log_ledger_buffer_bytes=8 * KiB)
    dirs = (tmp_path / "j", tmp_path / "l")
    LedgerStorage.format("b", *dirs, opts)
    st = LedgerStorage.open("b", *dirs, opts)
    try:
        expected = {}
        for round_ in range(3):
            ledgers = [led for led in range(20) for _ in range(3)]
            entries = [round_ * 3 + i for _led in range(20) for i in range(3)]
            datas = [os.urandom(500) for _ in ledgers]
            st.wait_durable(st.add_entries(ledgers, entries, datas), timeout_s=10)
            expected.update(zip(zip(ledgers, entries, strict=True), datas, strict=True))
            stats = st.stats()
            assert stats["entry_logs_open"] <= 4
            assert stats["entry_log_buffers_bytes"] <= (4 + 3) * 8 * KiB
        for (led, entry), data in expected.items():
            assert st.read_entry(led, entry) == data
        assert all(len(per) == 1 for per in st.ledger_bytes().values())  # one ledger per log
    finally:
        st.close()


def test_facade_rotates_idle_logs_without_any_add(tmp_path):
    opts = small_options(entry_log_per_ledger=True, entry_log_idle_ms=30)
    dirs = (tmp_path / "j", tmp_path / "l")
    LedgerStorage.format("b", *dirs, opts)
    st = LedgerStorage.open("b", *dirs, opts)
    try:
        st.wait_durable(st.add_entry(7, 0, b"x"), timeout_s=10)
        assert st.active_entry_log(7) is not None
        wait_for(lambda: st.active_entry_log(7) is None, 10.0, 0.01, "idle rotation")
        assert st.stats()["entry_logs_rotated_idle"] == 1 and st.read_entry(7, 0) == b"x"
    finally:
        st.close()


def test_write_close_counts_in_both_modes_and_rotates_in_per_ledger(opener, log_mode):
    st = opener()
    st.wait_durable(st.add_entry(7, 0, b"x"), timeout_s=10)
    before = st.active_entry_log(7)
    assert st.write_close(7) is (log_mode == "per_ledger")
    assert st.stats()["write_closes"] == 1
    if log_mode == "per_ledger":
        assert before is not None and st.active_entry_log(7) is None
        assert st.write_close(7) is False  # nothing open any more
    else:
        assert st.active_entry_log(7) == before  # the shared log: nothing to rotate
    assert st.read_entry(7, 0) == b"x"
