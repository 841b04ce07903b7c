"""Crash recovery and corruption: replay restores entries and ledger state; a
torn or corrupt tail is cut, never served; flipped bits give errors, never
wrong bytes; garbage journals and snapshots are refused with a clear error."""

from __future__ import annotations

import os
import random

import pytest

from appliance.errors import BookieIOError, ConfigError, CorruptRecordError, NoSuchEntryError
from storage import LedgerStorage
from storage.codec import BLOCK_HEADER_BYTES, RECORD_HEADER_BYTES
from storage.journal_scan import RECORD_BYTES as JOURNAL_RECORD_BYTES

from .conftest import small_options


def _segments(journal_dir) -> list[str]:
    return sorted(os.path.join(journal_dir, n) for n in os.listdir(journal_dir)
                  if n.endswith(".seg"))


def _logs(ledger_dir) -> list[str]:
    return sorted(os.path.join(ledger_dir, n) for n in os.listdir(ledger_dir)
                  if n.startswith("entrylog-"))


def _flip(path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x20]))


def test_replay_restores_entries_and_ledger_state(opener):
    st = opener()
    st.set_master_key(1, b"secret")
    st.add_entries([1, 1, 2], [0, 1, 0], [b"a", b"b", b"c"])
    st.fence(1)
    st.mark_limbo(2)
    st.set_explicit_lac(1, 0)
    st.add_entries([3], [0], [b"gone"])
    st.delete_ledger(3)
    st.wait_durable(st.fence(2), timeout_s=10)
    st.abort()
    st2 = opener()
    assert not st2.clean_shutdown_before
    assert st2.read_entries(1, 0, 1) == [b"a", b"b"] and st2.read_entry(2, 0) == b"c"
    assert st2.is_fenced(1) and st2.is_fenced(2) and st2.is_limbo(2)
    assert st2.get_master_key(1) == b"secret" and st2.get_explicit_lac(1) == 0
    assert not st2.ledger_exists(3)
    assert st2.recovery_stats["recovered_journal_records"] >= 7


def test_replay_after_a_checkpoint_combines_snapshot_and_journal(opener):
    st = opener()
    st.add_entries([1] * 50, list(range(50)), [os.urandom(300) for _ in range(50)])
    before = st.read_entries(1, 0, 49)
    st.checkpoint()
    after = [os.urandom(300) for _ in range(50)]
    st.wait_durable(st.add_entries([1] * 50, list(range(50, 100)), after), timeout_s=10)
    st.abort()
    st2 = opener()
    assert st2.read_entries(1, 0, 99) == before + after
    assert st2.recovery_stats["recovered_journal_records"] == 1


def test_reopen_twice_after_crashes_is_idempotent(opener):
    st = opener()
    st.wait_durable(st.add_entries([1] * 5, list(range(5)), [b"x"] * 5), timeout_s=10)
    st.abort()
    opener().abort()  # recovered (and checkpointed), then "crashed" again
    st3 = opener()
    assert st3.read_entries(1, 0, 4) == [b"x"] * 5
    assert st3.stats()["entries"] == 5


def test_torn_tail_is_cut_and_never_served(opener, dirs):
    st = opener()
    st.wait_durable(st.add_entries([1] * 3, [0, 1, 2], [b"keep"] * 3), timeout_s=10)
    st.wait_durable(st.add_entries([1] * 3, [3, 4, 5], [b"torn" * 50] * 3), timeout_s=10)
    st.abort()
    seg = _segments(dirs[0])[-1]
    with open(seg, "rb") as f:
        last = f.read().rfind(b"torn" * 50)
    _flip(seg, last + 10)  # inside the last group commit: as a torn write leaves it
    st2 = opener()
    assert st2.recovery_stats["recovery_cut"] is not None
    assert st2.read_entries(1, 0, 2) == [b"keep"] * 3
    with pytest.raises(NoSuchEntryError):
        st2.read_entry(1, 3)
    st2.add_entry(1, 3, b"new")  # and the storage keeps working
    assert st2.read_entry(1, 3) == b"new"


def test_junk_after_the_last_record_is_ignored(opener, dirs):
    st = opener()
    st.wait_durable(st.add_entries([1, 1], [0, 1], [b"a", b"b"]), timeout_s=10)
    st.abort()
    seg = _segments(dirs[0])[0]
    with open(seg, "r+b") as f:
        f.seek(8192)
        f.write(os.urandom(3000))
    st2 = opener()
    assert st2.read_entries(1, 0, 1) == [b"a", b"b"]


def test_lost_synced_data_mid_journal_is_refused(opener, dirs):
    st = opener()
    for i in range(0, 400, 20):  # several 512 KiB segments
        st.wait_durable(st.add_entries([1] * 20, list(range(i, i + 20)),
                                       [os.urandom(3000)] * 20), timeout_s=10)
    st.abort()
    first = _segments(dirs[0])[0]
    _flip(first, 4096 + 40)  # inside the first record's block header
    with pytest.raises(CorruptRecordError, match="synced records were lost"):
        LedgerStorage.open("bookie-1", *dirs, small_options())


def test_all_junk_journal_refuses_to_open(opener, dirs):
    st = opener()
    st.wait_durable(st.add_entry(1, 0, b"a"), timeout_s=10)
    st.abort()
    for seg in _segments(dirs[0]):
        with open(seg, "r+b") as f:
            f.write(random.Random(7).randbytes(os.path.getsize(seg)))
    with pytest.raises(CorruptRecordError, match="garbage from its start"):
        LedgerStorage.open("bookie-1", *dirs, small_options())


@pytest.mark.parametrize("where", ["data", "record header"])
def test_flipped_bit_in_entry_log_is_an_error_not_wrong_bytes(opener, dirs, where):
    st = opener()
    st.add_entries([1] * 3, [0, 1, 2], [b"A" * 500, b"B" * 500, b"C" * 500])
    st.close()
    log = _logs(dirs[1])[-1]
    with open(log, "rb") as f:
        pos = f.read().find(b"B" * 500)
    _flip(log, pos + 250 if where == "data" else pos - 20)
    st2 = opener()
    with pytest.raises(CorruptRecordError):
        st2.read_entry(1, 1)
    with pytest.raises(CorruptRecordError):
        st2.read_entries(1, 0, 2)
    assert st2.read_entry(1, 0) == b"A" * 500 and st2.read_entry(1, 2) == b"C" * 500


def test_corrupt_snapshot_is_refused_and_can_be_rebuilt(opener, dirs):
    st = opener()
    st.set_master_key(1, b"k")
    st.add_entries([1, 1], [0, 1], [b"a", b"b"])
    st.close()
    snap = os.path.join(dirs[1], "index.snap")
    _flip(snap, os.path.getsize(snap) - 5)
    with pytest.raises(CorruptRecordError, match="index snapshot"):
        LedgerStorage.open("bookie-1", *dirs, small_options())
    os.rename(snap, snap + ".bad")  # the documented fix: rebuild from the entry logs
    st2 = opener()
    assert not st2.clean_shutdown_before and st2.recovery_stats["index_rebuilt"]
    assert st2.read_entries(1, 0, 1) == [b"a", b"b"]


def test_no_journal_mode_keeps_written_entries_and_loses_only_the_buffer(opener):
    st = opener(journal_write_data=False)
    st.wait_durable(st.fence(1), timeout_s=10)
    st.add_entries([1] * 10, list(range(10)), [b"flushed"] * 10)
    st.flush()
    st.add_entries([1], [10], [b"buffered"])
    st.abort()  # the write buffer is dropped, as in a process crash
    st2 = opener(journal_write_data=False)
    assert not st2.clean_shutdown_before
    assert st2.read_entries(1, 0, 9) == [b"flushed"] * 10
    assert st2.is_fenced(1)
    with pytest.raises(NoSuchEntryError):
        st2.read_entry(1, 10)


def test_second_process_on_same_dirs_is_refused(opener, dirs):
    opener()
    with pytest.raises(ConfigError, match="in use"):
        LedgerStorage.open("bookie-1", *dirs, small_options())


@pytest.mark.parametrize("short_padding", [1, 2, 3])
def test_group_ending_just_before_a_page_boundary_replays(opener, short_padding):
    # Found by the crash test: padding shorter than a 4-byte magic was read as
    # the start of a record and the journal was cut there, dropping later groups.
    # journal: 4096 (segment header) + 32 (record) + 32 (block) + 24 (entry) + L
    length = (8192 - short_padding - 4096 - JOURNAL_RECORD_BYTES - BLOCK_HEADER_BYTES
              - RECORD_HEADER_BYTES)
    st = opener()
    st.wait_durable(st.add_entry(1, 0, b"p" * length), timeout_s=10)
    st.wait_durable(st.add_entry(1, 1, b"after"), timeout_s=10)
    st.abort()
    st2 = opener()
    assert st2.recovery_stats["recovery_cut"] is None
    assert st2.read_entries(1, 0, 1) == [b"p" * length, b"after"]


@pytest.mark.parametrize("short_padding", [1, 2, 3])
def test_entry_log_block_ending_just_before_a_page_boundary_scans(opener, short_padding):
    # entry log: 4096 (log header) + 32 (block) + 24 (entry) + L, journal not used
    length = 8192 - short_padding - 4096 - BLOCK_HEADER_BYTES - RECORD_HEADER_BYTES
    st = opener(journal_write_data=False)
    st.add_entry(1, 0, b"q" * length)
    st.flush()
    st.add_entry(1, 1, b"after")
    st.flush()
    st.abort()
    st2 = opener(journal_write_data=False)
    assert st2.read_entries(1, 0, 1) == [b"q" * length, b"after"]


def test_failed_fsync_stops_writes_keeps_reads_and_never_acks(opener, dirs, monkeypatch):
    import errno

    st = opener()
    st.wait_durable(st.add_entry(1, 0, b"durable"), timeout_s=10)
    real = os.fdatasync

    def broken(fd):
        raise OSError(errno.EIO, "injected I/O error")

    monkeypatch.setattr(os, "fdatasync", broken)
    ticket = st.add_entry(1, 1, b"never acknowledged")
    with pytest.raises(BookieIOError):
        st.wait_durable(ticket, timeout_s=10)
    assert st.durable_ticket < ticket
    with pytest.raises(BookieIOError):
        st.add_entry(1, 2, b"refused")
    assert st.read_entry(1, 0) == b"durable"  # reads keep working
    st.close()  # no hang; no clean marker after a failure
    monkeypatch.setattr(os, "fdatasync", real)
    st2 = opener()
    assert not st2.clean_shutdown_before
    assert st2.read_entry(1, 0) == b"durable"
