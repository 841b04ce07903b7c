"""The log owner core (appliance.protocol.log_owner): events in, actions out.

What a producer sees of one owned log: its records answered with their
positions once stored, a retry answered with the first copy's position
(never a second copy), gaps and a full window refused, records of many
producers sharing entries (the gather rule, the linger), control entries
after an idle pause, a failed entry dropping the log, a hand-over that
sends what it holds before it lets the lease go."""

from __future__ import annotations

import math

import pytest

from appliance.protocol.invariant import InvariantViolation
from appliance.protocol.log_owner import Answer, LogOwner, OwnerConfig, OwnerState
from appliance.protocol.log_owner_events import (
    Close,
    CloseWriter,
    EntryAcked,
    EntryFailed,
    Hello,
    LeaseReleased,
    Opened,
    OpenFailed,
    ReleaseLease,
    Reply,
    SendControl,
    SendEntry,
    Tick,
    Write,
    WriterClosed,
)
from appliance.protocol.log_service import DedupTable

A, B = b"A" * 16, b"B" * 16
SMALL = OwnerConfig(linger_ms=2.0, gather_ms=0.0, entries_inflight_max=2, window_entries=4,
                    window_bytes=1 << 20, flush_bytes=1 << 20, entry_room_bytes=1 << 20,
                    control_interval_ms=0)


def opened(config: OwnerConfig = SMALL, learnt=(), table=None) -> LogOwner:
    owner = LogOwner("orders", config, table)
    assert owner.handle(Opened(0, learnt, epoch=3)) == []
    assert owner.state is OwnerState.OPEN and owner.epoch == 3
    return owner


def write(owner, token, pid, seq, n=1, now=0, oldest=None):
    """A request alone in its turn of the driver's loop: Write, then Tick."""
    out = owner.handle(Write(token, pid, seq, oldest or seq, [b"r%d" % s for s in
                                                             range(seq, seq + n)], now))
    return out + owner.handle(Tick(now))


def ack(owner, entry_no, seg, entry, n, now=0):
    return owner.handle(EntryAcked(entry_no, [[seg, entry, 0, n]] if n else [], now))


def replies(actions):
    return [(a.token, a.answer, a.runs) for a in actions if isinstance(a, Reply)]


def entries(actions):
    return [(a.entry_no, a.tags) for a in actions if isinstance(a, SendEntry)]


def test_a_write_is_answered_with_its_positions_once_its_entry_is_acknowledged():
    owner = opened()
    out = write(owner, "t1", A, 1, n=2)
    assert entries(out) == [(1, [(A, 1), (A, 2)])] and replies(out) == []
    assert replies(ack(owner, 1, 5, 0, 2)) == [("t1", Answer.WRITTEN, [[5, 0, 0, 2]])]


def test_a_retry_of_a_pending_write_is_answered_once_stored_with_the_same_positions():
    owner = opened()
    write(owner, "t1", A, 1, n=3)
    out = write(owner, "t2", A, 2, n=2, oldest=1)  # the producer timed out: 2 and 3 again
    assert entries(out) == [] and replies(out) == []  # nothing sent twice, nothing answered
    assert owner.stats["duplicates"] == 2
    out = ack(owner, 1, 5, 7, 3)
    assert replies(out) == [("t1", Answer.WRITTEN, [[5, 7, 0, 3]]),
                            ("t2", Answer.WRITTEN, [[5, 7, 1, 2]])]
    # after it was stored: answered at once from the filter
    assert replies(write(owner, "t3", A, 3, oldest=1)) == [("t3", Answer.WRITTEN, [[5, 7, 2, 1]])]


def test_the_requests_of_one_turn_share_an_entry_sent_at_its_tick():
    owner = opened()
    assert owner.handle(Write("a", A, 1, 1, [b"a"], 0)) == [] and owner.next_due_ms() == 0
    assert owner.handle(Write("b", B, 1, 1, [b"b"], 0.1)) == []
    assert entries(owner.handle(Tick(0.2))) == [(1, [(A, 1), (B, 1)])]


@pytest.mark.parametrize("seq, oldest, answer, expected", [
    (3, 3, Answer.GAP, 2),  # a known producer skipped seq 2
    (1, 1, Answer.WRITTEN, 0),  # a duplicate of a stored record
])
def test_a_known_producers_requests_are_judged_against_the_next_seq(seq, oldest, answer,
                                                                     expected):
    owner = opened(learnt=((A, 1, (2, 0, 0)),))
    (reply,) = [a for a in owner.handle(Write("t", A, seq, oldest, [b"x"], 0))
                if isinstance(a, Reply)]
    assert (reply.answer, reply.expected) == (answer, expected)


def test_the_filter_is_rebuilt_from_the_learnt_tail():
    owner = opened(learnt=((A, 1, (2, 0, 0)), (A, 2, (2, 0, 1)), (B, 9, (2, 1, 0))))
    assert replies(owner.handle(Hello("h", A, 0))) == [("h", Answer.HELLO, None)]
    assert owner.handle(Hello("h", B, 0))[0].next_seq == 10
    assert replies(write(owner, "t", A, 2)) == [("t", Answer.WRITTEN, [[2, 0, 1, 1]])]


def test_an_unknown_producer_starts_at_its_oldest_unacknowledged_write():
    owner = opened()
    out = owner.handle(Write("late", A, 3, 1, [b"c"], 0))  # overtook its writes 1 and 2
    assert [(r.answer, r.expected) for r in out if isinstance(r, Reply)] == [(Answer.GAP, 1)]


def test_a_request_without_room_in_the_ledgers_window_is_answered_retry_before_judging():
    config = OwnerConfig(linger_ms=0, gather_ms=0, entries_inflight_max=4, window_entries=1,
                         flush_bytes=16, entry_room_bytes=1024, control_interval_ms=0)
    owner = opened(config)
    assert entries(write(owner, "t1", A, 1)) == [(1, [(A, 1)])]
    out = write(owner, "t2", B, 1, n=3)  # it would cut entries while the window is full
    assert replies(out)[0][1] is Answer.RETRY and owner.stats["busy"] == 1
    assert owner.handle(Hello("h", B, 0))[0].next_seq is None  # nothing judged
    ack(owner, 1, 1, 0, 1)
    assert entries(write(owner, "t3", B, 1, n=3)) != []  # taken once the ack made room


def test_records_arriving_while_an_entry_is_in_flight_wait_for_its_ack_or_the_linger():
    owner = opened()
    write(owner, "t1", A, 1)
    assert entries(write(owner, "t2", B, 1, now=0.5)) == []  # held: entry 1 in flight
    assert owner.next_due_ms() == 2.5  # its linger
    out = ack(owner, 1, 1, 0, 1, now=1)
    assert entries(out) == [(2, [(B, 1)])]  # the ack lets it go at once
    write(owner, "t3", A, 2, now=1.2)
    assert entries(owner.handle(Tick(3.0))) == []
    assert entries(owner.handle(Tick(3.2))) == [(3, [(A, 2)])]  # linger over: 2 in flight
    write(owner, "t4", A, 3, now=3.3)
    assert entries(owner.handle(Tick(9))) == [] and owner.next_due_ms() == math.inf  # 2 out


def test_the_gather_rule_holds_records_for_the_producers_just_answered():
    config = OwnerConfig(linger_ms=2, gather_ms=1000, control_interval_ms=0)
    owner = opened(config)
    write(owner, "a1", A, 1, now=0)
    write(owner, "b1", B, 1, now=0)  # held: entry 1 is in flight
    assert entries(owner.handle(Tick(3))) == [(2, [(B, 1)])]
    ack(owner, 1, 1, 0, 1, now=100)
    ack(owner, 2, 1, 1, 1, now=100)  # both answered at 100 ms: awaited
    assert entries(write(owner, "a2", A, 2, now=250)) == []
    assert owner.next_due_ms() == 1100  # held at most gather_ms after B's answer
    assert entries(write(owner, "b2", B, 2, now=400)) == [(3, [(A, 2), (B, 2)])]


def test_a_lone_producer_is_never_held_by_the_gather_rule():
    owner = opened(OwnerConfig(linger_ms=2, gather_ms=1000, control_interval_ms=0))
    for seq in (1, 2, 3):
        assert entries(write(owner, f"t{seq}", A, seq, now=seq * 10)) == [(seq, [(A, seq)])]
        ack(owner, seq, 1, seq, 1, now=seq * 10 + 1)


def test_a_control_entry_follows_an_idle_pause_after_an_acknowledged_entry():
    owner = opened(OwnerConfig(linger_ms=0, gather_ms=0, control_interval_ms=1000))
    write(owner, "t1", A, 1, now=0)
    ack(owner, 1, 1, 0, 1, now=5)
    assert owner.next_due_ms() == 1005 and owner.handle(Tick(1004)) == []
    assert owner.handle(Tick(1005)) == [SendControl(2)]
    assert ack(owner, 2, 1, 1, 0, now=1010) == [] and owner.next_due_ms() == math.inf
    write(owner, "t2", A, 2, now=1100)  # a write before it is due puts it off
    ack(owner, 3, 1, 2, 1, now=1101)
    write(owner, "t3", A, 3, now=1500)
    assert owner.handle(Tick(2101)) == []  # entry 4 in flight: its ack sets the next one
    ack(owner, 4, 1, 3, 1, now=2200)
    assert owner.handle(Tick(3200)) == [SendControl(5)]


def test_a_failed_entry_drops_the_log_answers_retry_and_lets_the_lease_go():
    owner = opened()
    write(owner, "t1", A, 1)
    write(owner, "t2", B, 1)  # held behind entry 1
    out = owner.handle(EntryFailed(1, "fenced", 1))
    assert [(r.token, r.answer) for r in out if isinstance(r, Reply)] == \
        [("t1", Answer.RETRY), ("t2", Answer.RETRY)]
    assert out[-1] == CloseWriter() and owner.state is OwnerState.FAILED
    assert replies(write(owner, "t3", A, 2))[0][1] is Answer.RETRY
    assert ack(owner, 1, 1, 0, 1) == []  # late: ignored
    assert owner.handle(WriterClosed(2)) == [ReleaseLease()]
    owner.handle(LeaseReleased(3))
    assert owner.state is OwnerState.CLOSED


def test_a_hand_over_sends_what_it_holds_waits_for_the_acks_then_closes():
    owner = opened()
    write(owner, "t1", A, 1)
    write(owner, "t2", B, 1)  # held (linger)
    out = owner.handle(Close(1))
    assert entries(out) == [(2, [(B, 1)])] and CloseWriter() not in out
    assert replies(write(owner, "t3", A, 2))[0][1] is Answer.RETRY  # closing: no new writes
    assert CloseWriter() not in ack(owner, 1, 1, 0, 1)
    out = ack(owner, 2, 1, 1, 1)
    assert replies(out) == [("t2", Answer.WRITTEN, [[1, 1, 0, 1]])] and out[-1] == CloseWriter()
    assert owner.handle(WriterClosed(2)) == [ReleaseLease()]


def test_a_close_while_opening_waits_for_the_open_and_a_failed_open_releases_the_lease():
    owner = LogOwner("orders", SMALL)
    assert replies(write(owner, "t", A, 1))[0][1] is Answer.RETRY  # opening
    assert owner.handle(Close(0)) == []
    assert owner.handle(Opened(1)) == [CloseWriter()]
    other = LogOwner("payments", SMALL)
    assert other.handle(OpenFailed(0, "no bookies")) == [ReleaseLease()]


def test_records_are_cut_into_entries_the_writer_packs_alone():
    config = OwnerConfig(linger_ms=0, gather_ms=0, flush_bytes=100, entry_room_bytes=1000,
                         record_overhead=10, control_interval_ms=0, window_entries=8)
    owner = opened(config)
    out = owner.handle(Write("t", A, 1, 1, [b"x" * 60] * 5, 0)) + owner.handle(Tick(0))
    # 2 x 70 >= 100: cut at two; the last, open, waits (2 entries in flight at most)
    assert [len(tags) for _, tags in entries(out)] == [2, 2]
    assert entries(ack(owner, 1, 1, 0, 2)) == [(3, [(A, 5)])]
    assert replies(ack(owner, 2, 1, 1, 2)) == []  # answered once all three are stored
    assert replies(ack(owner, 3, 1, 2, 1)) == [("t", Answer.WRITTEN, [[1, 0, 0, 2], [1, 1, 0, 2],
                                                                      [1, 2, 0, 1]])]
    # a retry of 2 to 5 spans the three entries: sliced from each entry's runs
    out = owner.handle(Write("r", A, 2, 1, [b"x" * 60] * 4, 1))
    assert replies(out) == [("r", Answer.WRITTEN, [[1, 0, 1, 1], [1, 1, 0, 2], [1, 2, 0, 1]])]


def test_a_record_too_large_for_an_entry_is_refused_bad():
    config = OwnerConfig(entry_room_bytes=100, record_overhead=10, control_interval_ms=0)
    owner = opened(config)
    assert replies(owner.handle(Write("t", A, 1, 1, [b"x" * 91], 0)))[0][1] is Answer.BAD


class _Forgetful(DedupTable):
    """A filter that takes every record as new (a broken one)."""

    def admit(self, producer_id, seq, now_ms, oldest=None):
        super().admit(producer_id, seq, now_ms, oldest)
        self._producers[producer_id].next_seq = seq
        return super().admit(producer_id, seq, now_ms, oldest)

    def admit_run(self, *args):
        return 0


def test_a_record_sent_twice_while_its_first_copy_is_pending_breaks_an_invariant():
    owner = opened(table=_Forgetful(8, 8, 1000))
    write(owner, "t1", A, 1)
    with pytest.raises(InvariantViolation) as caught:
        write(owner, "t2", A, 1)
    assert caught.value.rule == "stored-once"


def test_acknowledgements_out_of_order_break_an_invariant():
    owner = opened(OwnerConfig(linger_ms=0, gather_ms=0, entries_inflight_max=2,
                               control_interval_ms=0))
    write(owner, "t1", A, 1)
    write(owner, "t2", B, 1)
    with pytest.raises(InvariantViolation):
        ack(owner, 2, 1, 1, 1)
