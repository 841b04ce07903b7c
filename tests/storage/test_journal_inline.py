"""The bookie loop's thread writes its own journal records when the journal
thread is idle (``LedgerStorage.write_journal_inline``): durable on return,
never stuck when the owner forgets to call it, never interleaved with the
journal thread's writes, and replayed like any other record after a crash."""

from __future__ import annotations

import threading

from tests.storage.test_ledger_storage import payload
from tests.support.launch import wait_for


def test_inline_write_makes_the_owners_records_durable_on_its_own_thread(opener):
    st = opener(journal_group_wait_us=0)
    assert st.write_journal_inline() is False  # nothing queued; this thread is the owner now
    syncs = st.stats()["journal_syncs"]
    ticket = st.add_entries([1, 1, 1], [0, 1, 2], [payload(1, e) for e in range(3)])
    # the owner's submit did not wake the journal thread: the records wait for it
    assert st.durable_ticket < ticket
    assert st.write_journal_inline() is True
    assert st.durable_ticket >= ticket  # written and fdatasync'ed before it returned
    assert st.stats()["journal_syncs"] == syncs + 1
    assert st.read_entries(1, 0, 2) == [payload(1, e) for e in range(3)]


def test_owner_that_waits_instead_is_not_left_hanging(opener):
    st = opener(journal_group_wait_us=0)
    st.write_journal_inline()
    ticket = st.add_entry(1, 0, payload(1, 0))
    assert st.wait_durable(ticket, timeout_s=10)  # the journal thread takes them


def test_a_group_wait_is_left_to_the_journal_thread(opener):
    st = opener(journal_group_wait_us=1000)
    ticket = st.add_entry(1, 0, payload(1, 0))
    assert st.write_journal_inline() is False
    assert st.wait_durable(ticket, timeout_s=10)


def test_inline_and_thread_writes_interleave_and_replay_after_a_crash(opener):
    """The owner writes inline while another thread's adds go through the
    journal thread; after an abort (no clean close, no checkpoint) every
    entry whose ticket was durable is read back."""
    st = opener(journal_group_wait_us=0)
    st.write_journal_inline()
    durable: list[tuple[int, int]] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def other() -> None:
        try:
            for e in range(200):
                t = st.add_entry(2, e, payload(2, e, 700))
                assert st.wait_durable(t, timeout_s=30)
                with lock:
                    durable.append((2, e))
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            errors.append(exc)

    worker = threading.Thread(target=other)
    worker.start()
    inline_writes = 0
    for e in range(300):
        t = st.add_entry(1, e, payload(1, e, 900))
        inline_writes += st.write_journal_inline()
        if st.durable_ticket < t:  # the thread was writing: it takes ours next
            assert st.wait_durable(t, timeout_s=30)
        with lock:
            durable.append((1, e))
    worker.join(timeout=60)
    assert not worker.is_alive() and not errors
    assert inline_writes > 0
    st.abort()  # a crash: the entry logs' buffers are lost, the journal is replayed

    st2 = opener(journal_group_wait_us=0)
    for ledger, entry in durable:
        size = 900 if ledger == 1 else 700
        assert st2.read_entry(ledger, entry) == payload(ledger, entry, size)


def test_a_failed_inline_sync_stops_the_journal_for_good(opener, monkeypatch):
    """A failed fdatasync is never retried, and nothing after it may count
    as durable: a record another thread queued while the failing inline
    sync ran is not written by the journal thread afterwards (its sync
    would make the failed records look durable), waiters and later adds
    get the error."""
    import pytest

    from appliance.errors import BookieIOError
    from storage import journal as journal_module

    st = opener(journal_group_wait_us=0)
    good = st.add_entry(1, 0, payload(1, 0))
    assert st.wait_durable(good, timeout_s=10)
    st.write_journal_inline()  # the owner from here on
    # the thread, done with `good`, must be back waiting: else it takes the
    # next record itself (its loop looks at the queue once more before it waits)
    wait_for(st._journal.parked, 10, 0.001, "the journal thread waiting for work")
    ticket = st.add_entry(1, 1, payload(1, 1))
    real = journal_module.aio.fdatasync
    started, queued = threading.Event(), threading.Event()
    calls = []

    def fail_once(fd, path):
        calls.append(path)
        if len(calls) > 1:
            return real(fd, path)
        started.set()
        assert queued.wait(10)
        raise OSError(5, "injected I/O error", path)

    def other() -> None:
        assert started.wait(10)
        other_ticket.append(st.add_entry(2, 0, payload(2, 0)))  # queued meanwhile
        queued.set()

    other_ticket: list[int] = []
    monkeypatch.setattr(journal_module.aio, "fdatasync", fail_once)
    worker = threading.Thread(target=other)
    worker.start()
    assert st.write_journal_inline() is True  # it tried, and failed
    worker.join(timeout=10)
    assert other_ticket and other_ticket[0] > ticket
    journal_thread = st._journal._thread
    journal_thread.join(timeout=10)  # it stops instead of writing the other record
    assert not journal_thread.is_alive()
    with pytest.raises(BookieIOError):
        st.wait_durable(other_ticket[0], timeout_s=10)
    with pytest.raises(BookieIOError):
        st.add_entry(1, 2, payload(1, 2))
    assert len(calls) == 1  # no writer synced again
    assert st.durable_ticket < ticket


def test_close_waits_for_an_inline_write_then_ends(tmp_path, monkeypatch):
    """A close from another thread while the owner syncs inline: the
    journal thread waits for that write, then stops (nothing was queued
    after it, so only the close can wake it)."""
    from storage import journal as journal_module
    from storage.journal import Journal
    from tests.storage.conftest import small_options

    journal = Journal(str(tmp_path), small_options(journal_group_wait_us=0), b"i" * 16,
                      False, 1, 0, 0)
    real = journal_module.aio.fdatasync
    syncing, release = threading.Event(), threading.Event()

    def slow(fd, path):
        syncing.set()
        assert release.wait(10)
        return real(fd, path)

    def owner() -> None:
        journal.write_inline()  # the owner from here on
        journal.submit(1, 2, b"fence-like record")
        wrote.append(journal.write_inline())

    wrote: list[bool] = []
    monkeypatch.setattr(journal_module.aio, "fdatasync", slow)
    writer = threading.Thread(target=owner)
    writer.start()
    assert syncing.wait(10)
    closer = threading.Thread(target=journal.close)
    closer.start()
    release.set()
    writer.join(timeout=10)
    closer.join(timeout=10)
    assert wrote == [True] and journal.durable_seq == 1
    assert not closer.is_alive()  # the journal thread ended and close() returned
