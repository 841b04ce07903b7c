"""LedgerStorage as a library: adds, reads, ledger state, durability tickets,
limits and lifecycle, as a bookie server would use them."""

from __future__ import annotations

import os
import select

import pytest

from appliance.errors import (
    ClientClosedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    UnauthorizedError,
)


def payload(ledger: int, entry: int, size: int = 100) -> bytes:
    seed = f"{ledger}:{entry}:".encode()
    return (seed * (size // len(seed) + 1))[:size]


def test_add_read_roundtrip_and_batches(opener):
    st = opener()
    ticket = st.add_entry(1, 0, payload(1, 0))
    batch = st.add_entries([1, 2, 1, 2], [1, 0, 2, 1],
                           [payload(1, 1), payload(2, 0), payload(1, 2), memoryview(payload(2, 1))])
    assert batch > ticket
    assert st.wait_durable(batch, timeout_s=10)
    assert st.durable_ticket >= batch
    assert st.read_entry(1, 1) == payload(1, 1)
    assert st.read_entries(1, 0, 2) == [payload(1, e) for e in range(3)]
    assert st.read_entries(2, 0, 1) == [payload(2, 0), payload(2, 1)]
    assert st.last_entry_id(1) == 2 and st.last_entry_id(2) == 1
    assert st.ledgers() == [1, 2]
    assert st.stats()["entries"] == 5


def test_empty_and_large_entries_are_returned_exactly(opener):
    st = opener()
    big = os.urandom(60 * 1024)
    st.wait_durable(st.add_entries([5, 5], [0, 1], [b"", big]), timeout_s=10)
    assert st.read_entry(5, 0) == b""
    assert st.read_entry(5, 1) == big


def test_missing_ledger_and_entry_are_explicit_negatives(opener):
    st = opener()
    with pytest.raises(NoSuchLedgerError):
        st.read_entry(9, 0)
    with pytest.raises(NoSuchLedgerError):
        st.last_entry_id(9)
    st.fence(9)
    assert st.last_entry_id(9) == -1  # exists, no entries
    with pytest.raises(NoSuchEntryError):
        st.read_entry(9, 0)
    st.add_entries([9, 9], [0, 2], [b"a", b"c"])
    with pytest.raises(NoSuchEntryError, match="entry 1"):
        st.read_entries(9, 0, 2)
    with pytest.raises(NoSuchEntryError):
        st.read_entry(9, 5000)


def test_master_key_fence_limbo_lac(opener):
    st = opener()
    t = st.set_master_key(3, b"k1")
    assert st.wait_durable(t, timeout_s=10)
    assert st.get_master_key(3) == b"k1"
    assert st.set_master_key(3, b"k1") <= st.durable_ticket  # no change, already durable
    with pytest.raises(UnauthorizedError):
        st.set_master_key(3, b"other")
    with pytest.raises(UnauthorizedError):
        st.check_master_key(3, b"other")
    st.check_master_key(3, b"k1")
    assert st.get_master_key(99) is None and not st.is_fenced(99)
    # what an add is admitted by, in one lookup: the three getters' answers
    assert st.admission(99) == (False, None, False) and not st.ledger_exists(99)
    assert st.admission(3) == (True, b"k1", False)
    assert st.wait_durable(st.fence(3), timeout_s=10) and st.is_fenced(3)
    assert st.admission(3) == (True, b"k1", True)
    st.wait_durable(st.fence(5), timeout_s=10)  # fenced before any add: known, no key
    assert st.admission(5) == (True, None, True)
    st.mark_limbo(3)
    assert st.is_limbo(3)
    st.wait_durable(st.clear_limbo(3), timeout_s=10)
    assert not st.is_limbo(3)
    assert st.get_explicit_lac(3) == -1
    st.set_explicit_lac(3, 7)
    st.set_explicit_lac(3, 4)  # never moves back
    assert st.get_explicit_lac(3) == 7


def test_delete_ledger(opener):
    st = opener()
    st.add_entries([4, 4, 5], [0, 1, 0], [b"a", b"b", b"c"])
    st.delete_ledger(4)
    st.delete_ledger(4)  # idempotent
    assert not st.ledger_exists(4) and st.ledger_exists(5)
    with pytest.raises(NoSuchLedgerError):
        st.read_entry(4, 0)
    assert st.read_entry(5, 0) == b"c"
    # The bytes stay accounted to their log until GC reclaims them.
    per_log = st.ledger_bytes()
    assert any(4 in ledgers for ledgers in per_log.values())


def test_bad_input_is_refused_and_storage_keeps_working(opener):
    st = opener()
    with pytest.raises(ValueError, match="entry_bytes_max"):
        st.add_entry(1, 0, b"x" * (st.options.record_bytes_max + 1))  # 64 KiB payload + 64
    with pytest.raises(ValueError):
        st.add_entries([1, 2], [0], [b"a", b"b"])
    with pytest.raises(ValueError):
        st.add_entries([], [], [])
    with pytest.raises(ValueError):
        st.add_entry(-1, 0, b"a")
    with pytest.raises(ValueError):
        st.read_entries(1, 5, 2)
    with pytest.raises(ValueError):
        st.set_master_key(1, b"k" * 2000)
    st.wait_durable(st.add_entry(1, 0, b"ok"), timeout_s=10)
    assert st.read_entry(1, 0) == b"ok"


def test_durable_fd_and_callbacks(opener):
    st = opener()
    st.drain_durable()
    done = []
    ticket = st.add_entry(1, 0, b"x")
    st.add_durable_callback(ticket, done.append)
    readable, _, _ = select.select([st.durable_fd], [], [], 10)
    assert readable == [st.durable_fd]
    st.drain_durable()
    assert done == [ticket]
    st.add_durable_callback(ticket, done.append)  # already durable: runs at once
    assert done == [ticket, ticket]


def test_oversized_batch_is_split_and_still_one_ticket(opener):
    st = opener()
    datas = [os.urandom(30 * 1024) for _ in range(12)]  # 360 KiB > 128 KiB batches
    ticket = st.add_entries([8] * 12, list(range(12)), datas)
    assert st.wait_durable(ticket, timeout_s=10)
    assert st.read_entries(8, 0, 11) == datas


def test_rotation_and_reads_across_logs_and_buffer(opener):
    st = opener()
    datas = [os.urandom(5000) for _ in range(400)]  # ~2 MiB over 512 KiB logs
    for i in range(0, 400, 10):
        st.add_entries([1] * 10, list(range(i, i + 10)), datas[i:i + 10])
    assert st.stats()["entry_logs_created"] >= 4
    assert st.read_entries(1, 0, 399) == datas
    assert st.read_entry(1, 399) == datas[399]


def test_reopen_after_clean_close(opener):
    st = opener()
    assert not st.clean_shutdown_before  # a fresh format counts as not clean
    st.set_master_key(1, b"key")
    st.add_entries([1] * 3, [0, 1, 2], [b"a", b"b", b"c"])
    st.fence(1)
    st.mark_limbo(1)
    st.set_explicit_lac(1, 1)
    st.close()
    st2 = opener()
    assert st2.clean_shutdown_before
    assert st2.read_entries(1, 0, 2) == [b"a", b"b", b"c"]
    assert st2.is_fenced(1) and st2.is_limbo(1) and st2.get_master_key(1) == b"key"
    assert st2.get_explicit_lac(1) == 1


def test_closed_storage_refuses(opener):
    st = opener()
    st.close()
    with pytest.raises(ClientClosedError):
        st.add_entry(1, 0, b"x")
    with pytest.raises(ClientClosedError):
        st.read_entry(1, 0)


def test_checkpoint_frees_journal_segments(opener, dirs):
    st = opener()
    for i in range(0, 600, 20):  # ~1.2 MiB of journal over 512 KiB segments
        st.add_entries([2] * 20, list(range(i, i + 20)), [os.urandom(2000)] * 20)
    st.flush()
    segments = [n for n in os.listdir(dirs[0]) if n.endswith(".seg")]
    assert len(segments) >= 3
    st.checkpoint()
    segments = [n for n in os.listdir(dirs[0]) if n.endswith(".seg")]
    assert len(segments) == 1
    assert st.read_entry(2, 599)


def test_no_journal_mode_tickets_and_flush(opener):
    st = opener(journal_write_data=False)
    fence_ticket = st.fence(1)
    add_ticket = st.add_entry(1, 0, b"x")
    assert add_ticket == fence_ticket  # adds wait only for earlier journaled state
    st.flush()
    assert st.durable_ticket >= add_ticket
    assert st.stats()["journal_records"] == 1  # only the fence was journaled
    assert st.read_entry(1, 0) == b"x"


def test_concurrent_writers_reader_and_checkpoints(opener):
    import threading

    st = opener(checkpoint_interval_s=0.01)  # the checkpointer thread runs throughout
    errors: list[BaseException] = []

    def writer(ledger: int) -> None:
        try:
            for first in range(0, 300, 10):
                ids = list(range(first, first + 10))
                st.add_entries([ledger] * 10, ids, [payload(ledger, e, 700) for e in ids])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def reader() -> None:
        try:
            for _ in range(200):
                for ledger in (1, 2):
                    if st.ledger_exists(ledger):
                        last = st.last_entry_id(ledger)
                        if last >= 0:
                            assert st.read_entry(ledger, last) == payload(ledger, last, 700)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(led,)) for led in (1, 2)]
    threads.append(threading.Thread(target=reader))
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    st.flush()
    assert st.stats()["checkpoints"] >= 1
    for ledger in (1, 2):
        assert st.read_entries(ledger, 0, 299) == [payload(ledger, e, 700) for e in range(300)]


def test_group_commit_one_sync_for_many_small_adds(opener):
    st = opener(journal_group_wait_us=200_000)  # a group waits up to 200 ms for company
    tickets = [st.add_entry(1, e, b"small") for e in range(50)]
    assert st.wait_durable(tickets[-1], timeout_s=10)
    stats = st.stats()
    assert stats["journal_records"] == 50
    assert stats["journal_syncs"] <= 3  # 50 adds, a handful of fdatasyncs


def test_group_commit_closes_on_bytes_before_the_wait(opener):
    st = opener(journal_group_wait_us=30_000_000)  # 30 s: only the byte threshold can close it
    ticket = st.add_entries([1] * 40, list(range(40)), [os.urandom(2000)] * 40)  # 80 KiB > 64
    assert st.wait_durable(ticket, timeout_s=10)


def test_flush_and_checkpoint_do_not_wait_out_the_group_wait(opener):
    st = opener(journal_group_wait_us=30_000_000)
    ticket = st.add_entry(1, 0, b"x")
    st.flush()  # would take 30 s if it waited for the group to fill or time out
    assert st.durable_ticket >= ticket
    st.add_entry(1, 1, b"y")
    st.checkpoint()
    assert st.read_entries(1, 0, 1) == [b"x", b"y"]
