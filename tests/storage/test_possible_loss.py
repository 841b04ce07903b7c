"""BP-46 detection in storage: why a bookie may have lost data it
acknowledged, decided from the mode the data was *written* in and kept
durable until the bookie's phase one is (``possible_loss_reasons``)."""

from __future__ import annotations

import os

from storage import cookie as ck
from storage.snapshot import SNAPSHOT_NAME


def _add(st, ledger_id: int, n: int) -> None:
    st.wait_durable(st.add_entries([ledger_id] * n, list(range(n)),
                                   [b"r%05d" % i * 10 for i in range(n)]))


def test_a_crash_after_journal_less_adds_is_possible_loss_even_if_the_journal_is_on_now(opener):
    st = opener(journal_write_data=False)
    _add(st, 1, 20)
    st.abort()  # crash
    st = opener(journal_write_data=True)  # the config changed across the crash
    assert any("without the journal" in r for r in st.possible_loss_reasons)
    st.possible_loss_handled()  # phase one durable: forgotten, journal-less mark too
    st.close()
    st = opener(journal_write_data=True)
    assert st.possible_loss_reasons == []
    st.abort()
    st = opener(journal_write_data=True)  # a crash with every add journaled: no loss
    assert st.possible_loss_reasons == []


def test_a_clean_stop_after_journal_less_adds_is_no_loss(opener):
    st = opener(journal_write_data=False)
    _add(st, 1, 20)
    st.close()
    st = opener(journal_write_data=False)
    assert st.possible_loss_reasons == []
    assert st.clean_shutdown_before
    st.close()
    st = opener(journal_write_data=True)  # switched on after a clean stop
    _add(st, 2, 5)
    st.abort()  # a later crash with every add journaled is no loss
    assert opener(journal_write_data=True).possible_loss_reasons == []


def test_reasons_survive_a_crash_until_handled(opener, dirs):
    st = opener(journal_write_data=False)
    _add(st, 1, 5)
    st.abort()
    st = opener(journal_write_data=True)
    first = list(st.possible_loss_reasons)
    assert first
    st.abort()  # crashed again before phase one was durable
    st = opener(journal_write_data=True)
    assert st.possible_loss_reasons == first
    assert ck.read_marker(str(dirs[1]), ck.POSSIBLE_LOSS_NAME)["reasons"] == first


def test_an_index_rebuilt_from_a_scan_is_possible_loss_with_the_journal_on(opener, dirs):
    st = opener()
    _add(st, 1, 10)
    st.fence(1)
    st.close()
    os.rename(dirs[1] / SNAPSHOT_NAME, dirs[1].parent / "moved.snap")
    st = opener()
    assert any("rebuilt" in r for r in st.possible_loss_reasons)
    assert st.read_entry(1, 9)  # the data is still found by the scan


def test_fresh_storage_knows_it_never_held_anything(opener):
    st = opener()
    assert st.fresh
    _add(st, 1, 1)
    st.close()
    assert not opener().fresh


def test_a_reason_noted_by_the_bookie_is_durable(opener):
    st = opener()
    st.note_possible_loss("cookie mismatch")
    st.abort()
    st = opener()
    assert st.possible_loss_reasons == ["cookie mismatch"]


def _wipe(directory) -> None:
    import shutil

    shutil.rmtree(directory)
    os.makedirs(directory)


def test_a_replaced_journal_disk_is_adopted_and_recorded(opener, dirs):
    st = opener()
    _add(st, 1, 10)
    st.close()  # checkpointed: the entries live in the entry logs
    _wipe(dirs[0])
    reason = ck.adopt_replaced_dir("bookie-1", str(dirs[0]), str(dirs[1]))
    assert reason and "journal_dir" in reason
    st = opener()
    assert reason in st.possible_loss_reasons
    assert st.read_entry(1, 9)
    _add(st, 2, 3)  # it takes writes again
    st.close()
    assert opener().read_entry(2, 2)


def test_a_replaced_ledger_disk_is_rebuilt_from_the_journal(opener, dirs):
    st = opener()
    _add(st, 1, 10)
    st.abort()  # crash: the journal still holds the adds
    _wipe(dirs[1])
    reason = ck.adopt_replaced_dir("bookie-1", str(dirs[0]), str(dirs[1]))
    assert reason and "ledger_dir" in reason
    st = opener()
    assert reason in st.possible_loss_reasons
    assert any("rebuilt" in r for r in st.possible_loss_reasons)
    assert st.read_entry(1, 9)


def test_nothing_is_adopted_unless_exactly_one_new_empty_directory(dirs):
    assert ck.adopt_replaced_dir("bookie-1", str(dirs[0]), str(dirs[1])) is None  # both fine
    _wipe(dirs[0])
    (dirs[0] / "stray").write_text("someone else's file")
    assert ck.adopt_replaced_dir("bookie-1", str(dirs[0]), str(dirs[1])) is None  # not empty
    assert ck.adopt_replaced_dir("bookie-2", str(dirs[0]), str(dirs[1])) is None
