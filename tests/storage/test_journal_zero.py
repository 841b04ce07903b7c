"""Zero-filling the journal ahead of its write position (cheaper syncs for
small groups): done by the idle journal thread after a small group written
inline or under a group wait, never after big groups; it never covers a
record, stops for good after a failed zero write, skips segments that were
not preallocated, and a crash after it replays every durable record."""

from __future__ import annotations

import pytest

from appliance.errors import BookieIOError
from storage import journal as journal_module
from tests.storage.test_ledger_storage import payload
from tests.support.launch import wait_for


@pytest.fixture
def writes(monkeypatch):
    """Every journal segment write as (offset, bytes, all zeros), in order."""
    seen: list[tuple[int, int, bool]] = []
    real = journal_module.aio.write_aligned

    def spy(fd, view, offset, path):
        if path.endswith(".seg"):
            seen.append((offset, len(view), bytes(view) == bytes(len(view))))
        return real(fd, view, offset, path)

    monkeypatch.setattr(journal_module.aio, "write_aligned", spy)
    return seen


def _zeros_cover_no_record(writes) -> None:
    """A zero write starts at or past the end of every record written
    before it in the same segment (segments restart at offset 4096)."""
    record_end = 0
    for offset, size, zeros in writes:
        if zeros and size > 4096:
            assert offset >= record_end, (offset, record_end)
        elif offset == 4096:  # a new segment's first record
            record_end = offset + size
        else:
            record_end = max(record_end, offset + size)


def _zero_writes(writes) -> int:
    return sum(1 for _, size, zeros in list(writes) if zeros and size > 4096)


def test_small_inline_groups_get_zeros_ahead_and_a_crash_replays_every_record(opener,
                                                                              writes):
    st = opener(journal_group_wait_us=0)
    st.write_journal_inline()  # the owner from here on
    for e in range(400):  # ~3 segments of 512 KiB: zeroing restarts in each
        ticket = st.add_entry(1, e, payload(1, e, 900))
        if not st.write_journal_inline():  # the thread was zeroing: it takes ours next
            assert st.wait_durable(ticket, timeout_s=10)
        assert st.durable_ticket >= ticket
    wait_for(lambda: _zero_writes(writes) >= 1, 10, what="the thread zeroing (the owner idles)")
    _zeros_cover_no_record(writes)
    st.abort()  # a crash: the journal is replayed over its zero-filled tail
    st2 = opener(journal_group_wait_us=0)
    assert [st2.read_entry(1, e) for e in range(400)] == \
        [payload(1, e, 900) for e in range(400)]


def test_the_thread_alone_zeroes_nothing_without_a_group_wait(opener, writes):
    st = opener(journal_group_wait_us=0)  # no inline owner: the thread writes every group
    for e in range(20):
        assert st.wait_durable(st.add_entry(1, e, payload(1, e)), timeout_s=10)
    assert _zero_writes(writes) == 0


def test_big_groups_get_no_zeros(opener, writes):
    st = opener(journal_group_wait_us=0)
    st.write_journal_inline()
    for e in range(0, 60, 8):  # 8 x 4 KiB: 32 KiB groups
        # the thread, woken by the last write's end, may still be looking at the
        # queue: it would take the group itself and the inline write find none
        wait_for(st._journal.parked, 10, 0.001, "the journal thread waiting for work")
        ticket = st.add_entries([1] * 8, list(range(e, e + 8)),
                                [payload(1, i, 4096) for i in range(e, e + 8)])
        assert st.write_journal_inline() is True and st.durable_ticket >= ticket
    assert _zero_writes(writes) == 0


def test_the_thread_zeroes_when_a_group_wait_rules_inline_writes_out(opener, writes):
    st = opener(journal_group_wait_us=200)
    for e in range(20):
        assert st.wait_durable(st.add_entry(1, e, payload(1, e, 900)), timeout_s=10)
    wait_for(lambda: any(zeros for _, _, zeros in writes), 10, what="the thread zeroing")
    for e in range(20, 40):
        assert st.wait_durable(st.add_entry(1, e, payload(1, e, 900)), timeout_s=10)
    _zeros_cover_no_record(list(writes))
    st.abort()
    st2 = opener(journal_group_wait_us=200)
    assert [st2.read_entry(1, e) for e in range(40)] == [payload(1, e, 900) for e in range(40)]


def test_a_failed_zero_write_stops_zeroing_but_not_the_journal(opener, monkeypatch):
    real = journal_module.aio.write_aligned
    failed = []

    def fail_zeros(fd, view, offset, path):
        if len(view) > 4096 and bytes(view) == bytes(len(view)):
            failed.append(offset)
            raise BookieIOError(f"injected: zero write at {offset}")
        return real(fd, view, offset, path)

    monkeypatch.setattr(journal_module.aio, "write_aligned", fail_zeros)
    st = opener(journal_group_wait_us=0)
    st.write_journal_inline()
    for e in range(10):
        ticket = st.add_entry(1, e, payload(1, e))
        if not st.write_journal_inline():
            assert st.wait_durable(ticket, timeout_s=10)
        wait_for(lambda: failed, 10, what="a failed zero write")  # the thread tried once
    assert len(failed) == 1  # and never again
    assert st.read_entries(1, 0, 9) == [payload(1, e) for e in range(10)]


def test_a_segment_not_preallocated_is_not_zeroed(opener, monkeypatch, writes):
    monkeypatch.setattr(journal_module, "_preallocate", lambda fd, nbytes, path: False)
    st = opener(journal_group_wait_us=0)
    st.write_journal_inline()
    for e in range(10):
        wait_for(st._journal.parked, 10, 0.001, "the journal thread waiting for work")
        st.add_entry(1, e, payload(1, e))
        assert st.write_journal_inline() is True
    st.close()  # the thread ends: any zero step it was to take is done
    assert _zero_writes(writes) == 0
