"""The GC pass's part (``LedgerStorage.give_back_space``): a deleted ledger's
data in the *active* entry log comes back too.  The active log is rotated
once enough of it belongs to deleted ledgers (or little of it is live), the
logs holding only deleted ledgers are removed at once, a log shared with a
live ledger is compacted by a minor run started at once; the live ledger
reads back, also after a crash (kill -9 stand-in: ``abort``) right after."""

from __future__ import annotations

import time

import pytest

from appliance.errors import NoSuchLedgerError
from storage.entry_log import list_logs
from tests.storage.support import fill

A, B = 7, 8  # A is deleted, B lives on
KiB = 1024
BIG_LOGS = dict(entry_log_rotate_bytes=64 * 1024 * KiB,  # nothing rotates by size here
                entry_log_rotate_garbage_bytes=256 * KiB)
NO_TIMED_RUNS = dict(compaction_minor_interval_s=3600.0, compaction_major_interval_s=86400.0)


def _wait_compacted(st, runs_before: int, deadline_s: float = 30.0) -> dict:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        status = st.compaction_status()
        if status["runs"] > runs_before and not status["running"]:
            return status
        time.sleep(0.01)
    raise AssertionError(f"no compaction run within {deadline_s} s: {st.compaction_status()}")


def test_a_deleted_ledger_alone_in_the_active_log_is_given_back_by_the_pass(opener, log_mode):
    st = opener(**BIG_LOGS)
    fill(st, A, 0, 1000)  # ~1 MB, all in the active log (interleaved mode)
    before = st.disk_usage(0)["entry_log_bytes"]
    st.delete_ledger(A)
    done = st.give_back_space(1)
    if log_mode == "interleaved":
        assert done["rotated_garbage_bytes"] >= 1000 * 1000
    assert done["bytes_freed"] >= 1000 * 1000 and done["logs_removed"]
    assert st.disk_usage(0)["entry_log_bytes"] < before - 1000 * 1000
    with pytest.raises(NoSuchLedgerError):
        st.read_entry(A, 0)
    st.abort()  # a crash right after: nothing comes back, nothing is missing
    st2 = opener(**BIG_LOGS)
    assert not st2.ledger_exists(A) and st2.give_back_space(0)["logs_removed"] == []


def test_a_log_shared_with_a_live_ledger_is_compacted_at_once(opener, log_mode, dirs):
    st = opener(**BIG_LOGS, **NO_TIMED_RUNS)
    a_data, b_data = [], []
    for round_ in range(10):  # interleaved: 9 parts A to 1 part B in the same log
        a_data += fill(st, A, 90 * round_, 90)
        b_data += fill(st, B, 10 * round_, 10)
    before = st.disk_usage(0)["entry_log_bytes"]
    runs = st.compaction_status()["runs"]
    st.delete_ledger(A)
    done = st.give_back_space(1)
    if log_mode == "interleaved":  # per-ledger: A's own logs go, B's stay
        assert done["compaction"] and done["rotated_garbage_bytes"] >= 900 * 1000
        _wait_compacted(st, runs)
    after = st.disk_usage(0)["entry_log_bytes"]
    assert after < before - 800 * 1000, (before, after, done)
    assert st.read_entries(B, 0, 99) == b_data
    st.abort()  # crash after the reclaim: the live ledger survives, A stays gone
    st2 = opener(**BIG_LOGS)
    assert st2.read_entries(B, 0, 99) == b_data
    assert not st2.ledger_exists(A)
    assert st2.disk_usage(0)["entry_log_bytes"] <= after + 8 * KiB
    assert len(list_logs(str(dirs[1]))) <= 4


# interleaved only: per-ledger mode has no shared active log (checkpoints rotate its logs)
@pytest.mark.parametrize("log_mode", ["interleaved"], indirect=True)
def test_the_active_log_is_kept_below_the_limits_or_when_off(opener, log_mode):
    st = opener(entry_log_rotate_bytes=64 * 1024 * KiB, entry_log_rotate_garbage_bytes=4096 * KiB)
    fill(st, A, 0, 500)
    fill(st, B, 0, 250)
    st.delete_ledger(A)
    assert st.active_log_garbage_bytes() >= 500 * 1000
    # 0.5 MB < 4 MiB, and a third of the log is live (over the 0.2 minor threshold)
    assert st.give_back_space(1)["rotated_garbage_bytes"] == 0
    assert st.read_entries(B, 0, 249)
    st.delete_ledger(B)  # now nothing in it is live: a small log, rotated all the same
    st.options.entry_log_rotate_garbage_bytes = 0  # unless off: only size rotates
    assert st.give_back_space(1)["rotated_garbage_bytes"] == 0
    st.options.entry_log_rotate_garbage_bytes = 4096 * KiB
    done = st.give_back_space(1)
    assert done["rotated_garbage_bytes"] >= 750 * 1000 and done["bytes_freed"] >= 750 * 1000


# interleaved only: per-ledger logs hold one ledger each: nothing to compact
@pytest.mark.parametrize("log_mode", ["interleaved"], indirect=True)
def test_a_suspended_compactor_runs_the_pass_s_compaction_only_after_resume(opener, log_mode):
    st = opener(**BIG_LOGS, **NO_TIMED_RUNS)
    fill(st, A, 0, 900)
    b_data = fill(st, B, 0, 100)
    st.suspend_compaction()
    runs = st.compaction_status()["runs"]
    st.delete_ledger(A)
    assert st.give_back_space(1)["compaction"]
    assert st.compaction_status()["runs"] == runs and not st.compaction_status()["running"]
    st.resume_compaction()
    status = _wait_compacted(st, runs)
    assert status["last"]["logs_compacted"] >= 1
    assert st.read_entries(B, 0, 99) == b_data


# interleaved only: per-ledger logs hold one ledger each: nothing to compact
@pytest.mark.parametrize("log_mode", ["interleaved"], indirect=True)
def test_no_compaction_starts_by_itself_when_minor_runs_are_off(opener, log_mode):
    st = opener(**BIG_LOGS, compaction_minor_interval_s=0, compaction_major_interval_s=0)
    fill(st, A, 0, 900)
    fill(st, B, 0, 100)
    st.delete_ledger(A)
    done = st.give_back_space(1)
    assert done["rotated_garbage_bytes"] and not done["compaction"]
