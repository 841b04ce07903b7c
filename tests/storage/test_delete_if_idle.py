"""``delete_ledger_if_idle``: the bookie-local half of collecting
over-replicated ledgers.  The check (no add or state change since a mark,
not in limbo) and the delete happen under one lock, so a copy that arrives
while the garbage collector decides is never deleted with the ledger."""

from __future__ import annotations

import threading


def _add(st, ledger_id, first=0, n=3):
    ids = list(range(first, first + n))
    st.wait_durable(st.add_entries([ledger_id] * n, ids, [b"e%d" % i * 10 for i in ids]), 10)


def test_an_idle_ledger_is_deleted_and_stays_deleted_after_reopen(opener):
    st = opener()
    _add(st, 7)
    _add(st, 8)
    mark = st.activity_mark()
    ticket = st.delete_ledger_if_idle(7, mark)
    assert ticket and st.wait_durable(ticket, 10)
    assert st.ledgers() == [8] and st.ledger_entry_count(7) == 0
    st.close()
    st = opener()
    assert st.ledgers() == [8] and st.ledger_entry_count(8) == 3


def test_any_add_after_the_mark_refuses_the_delete(opener):
    st = opener()
    _add(st, 7)
    mark = st.activity_mark()
    _add(st, 9)                      # another ledger's add does not matter
    _add(st, 7, first=0, n=1)        # the same entry again (a re-copy): still an add
    assert st.delete_ledger_if_idle(7, mark) is None
    assert st.ledger_entry_count(7) == 3
    assert st.delete_ledger_if_idle(9, mark) is None  # created after the mark
    later = st.activity_mark()
    assert st.delete_ledger_if_idle(7, later) is not None


def test_an_add_in_a_batch_of_many_ledgers_counts_too(opener):
    st = opener()
    _add(st, 7)
    mark = st.activity_mark()
    ledgers = [1, 2, 7, 3] * 8
    st.wait_durable(st.add_entries(ledgers, list(range(32)), [b"x"] * 32), 10)
    assert st.delete_ledger_if_idle(7, mark) is None


def test_state_changes_and_limbo_refuse_the_delete(opener):
    st = opener()
    for lid in (1, 2, 3):
        _add(st, lid)
    mark = st.activity_mark()
    st.wait_durable(st.fence(1), 10)
    st.wait_durable(st.set_master_key(2, b"k" * 20), 10)
    assert st.delete_ledger_if_idle(1, mark) is None
    assert st.delete_ledger_if_idle(2, mark) is None
    st.wait_durable(st.mark_limbo(3), 10)
    assert st.delete_ledger_if_idle(3, st.activity_mark()) is None  # limbo: never
    assert st.delete_ledger_if_idle(42, st.activity_mark()) is None  # unknown ledger


def test_a_fenced_ledger_keeps_its_fence_but_not_its_entries(opener):
    st = opener()
    _add(st, 5)
    st.wait_durable(st.fence(5), 10)
    ticket = st.delete_ledger_if_idle(5, st.activity_mark())
    assert ticket is not None and st.wait_durable(ticket, 10)
    assert st.is_fenced(5) and st.ledger_entry_count(5) == 0
    st.abort()  # a crash: the journal replays the delete, then the fence
    st = opener()
    assert st.is_fenced(5) and st.ledger_entry_count(5) == 0
    assert st.ledgers() == [5]


def test_no_add_slips_between_the_check_and_the_delete(opener):
    """Adds racing the delete: either the delete is refused, or every add
    that returned after it is stored (none is lost with the ledger)."""
    st = opener()
    for round_ in range(30):
        lid = 100 + round_
        _add(st, lid)
        mark = st.activity_mark()
        acked: list[int] = []
        go = threading.Event()

        def writer(lid=lid, acked=acked, go=go):
            go.wait()
            for e in range(3, 40):
                st.add_entries([lid], [e], [b"copy"])
                acked.append(e)

        t = threading.Thread(target=writer)
        t.start()
        go.set()
        ticket = st.delete_ledger_if_idle(lid, mark)
        t.join()
        if ticket is None:
            continue
        stored = {e for e in acked if st.ledger_exists(lid) and _has(st, lid, e)}
        # after a delete, the ledger holds exactly the adds that came after it
        count = st.ledger_entry_count(lid)
        assert count == len(stored) and set(acked[len(acked) - count:]) == stored


def _has(st, lid, e):
    try:
        st.read_entry(lid, e)
        return True
    except Exception:  # noqa: BLE001 - NoSuchEntry
        return False


def test_copies_written_after_the_delete_survive_a_crash(opener):
    """The delete is replayed in its place: copies that arrived after it (a
    re-replication that chose this bookie again) are not deleted by replay."""
    st = opener()
    _add(st, 7, n=5)
    ticket = st.delete_ledger_if_idle(7, st.activity_mark())
    assert ticket is not None
    _add(st, 7, first=10, n=4)  # new copies, after the delete
    st.abort()
    st = opener()
    assert st.ledger_entry_count(7) == 4
    assert [st.read_entry(7, e) for e in range(10, 14)] == [b"e%d" % e * 10 for e in range(10, 14)]
    assert not _has(st, 7, 0)


def test_journal_less_copies_after_the_delete_survive_a_checkpoint_and_crash(opener):
    st = opener(journal_write_data=False)
    _add_no_wait = st.add_entries
    _add_no_wait([7] * 5, list(range(5)), [b"old"] * 5)
    st.checkpoint()
    assert st.delete_ledger_if_idle(7, st.activity_mark()) is not None
    _add_no_wait([7] * 3, [20, 21, 22], [b"new"] * 3)
    st.checkpoint()
    st.abort()
    st = opener(journal_write_data=False)
    assert st.ledger_entry_count(7) == 3 and st.read_entry(7, 21) == b"new"
    assert not _has(st, 7, 0)
