"""Entry-log garbage collection: deleted ledgers' logs are removed once a
snapshot no longer references them; surviving ledgers stay readable, also
after a crash right after the removal."""

from __future__ import annotations

import pytest

from appliance.errors import NoSuchLedgerError
from storage.entry_log import list_logs
from storage.gc import reclaimable_logs
from tests.storage.support import fill

A, B = 7, 8


def test_rules_keep_logs_past_the_mark_unknown_or_with_a_live_ledger():
    per = {1: {A: 10}, 2: {A: 10, B: 5}, 3: {A: 4}, 4: {}, 6: {A: 1}}
    live = {B: object()}
    assert reclaimable_logs([1, 2, 3, 4, 5, 6], per, 6, frozenset(), live) == [(1, 10), (3, 4)]
    # still in the last snapshot written: kept until the next one
    assert reclaimable_logs([1, 3], per, 6, frozenset({A}), live) == []


def test_deleted_ledger_logs_are_removed_after_a_checkpoint_and_survivors_read_back(
        opener, dirs, log_mode):
    _journal_dir, ledger_dir = dirs
    st = opener()
    fill(st, A, 0, 1500)          # ~1.5 MB: several 512 KiB logs hold only A
    b_data = fill(st, B, 0, 300)
    a_more = fill(st, A, 1500, 10)  # A again after B: that log holds both
    assert len(a_more) == 10
    by_log = st.ledger_bytes()
    only_a = sorted(log for log, per in by_log.items() if set(per) == {A})
    assert len(only_a) >= 2

    st.delete_ledger(A)
    assert st.reclaim_entry_logs() == ([], 0)  # the last snapshot still names A
    st.checkpoint()
    removed, freed = st.reclaim_entry_logs()
    assert removed and set(removed) <= set(only_a)
    if log_mode == "per_ledger":  # BP-32: every log of A goes, its tail after B's too
        assert set(removed) == set(only_a) and freed == sum(by_log[x][A] for x in only_a)
        assert all(set(per) == {B} for log, per in st.ledger_bytes().items())
    else:
        assert freed >= len(removed) * 400_000
    assert not set(removed) & set(list_logs(str(ledger_dir)))
    assert st.read_entries(B, 0, 299) == b_data
    with pytest.raises(NoSuchLedgerError):
        st.read_entry(A, 0)

    st.abort()  # crash right after the removal
    st2 = opener()
    assert st2.read_entries(B, 0, 299) == b_data
    assert not st2.ledger_exists(A)
    assert st2.reclaim_entry_logs()[0] == []  # nothing left to remove, nothing resurrected


def test_a_ledger_written_again_after_its_delete_keeps_its_logs(opener):
    st = opener()
    fill(st, A, 0, 1200)
    st.delete_ledger(A)
    again = fill(st, A, 0, 3)  # a late add re-creates it locally
    st.checkpoint()
    assert st.reclaim_entry_logs() == ([], 0)
    assert st.read_entries(A, 0, 2) == again
