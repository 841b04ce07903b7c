"""The producer core (appliance.protocol.log_producer): events in, actions
out, time passed in.  The requests it sends are read back with the log
server's own decoder (appliance.protocol.log_service.decode_request)."""

from __future__ import annotations

import pytest

from appliance.protocol import limits
from appliance.protocol import log_producer as lp
from appliance.protocol.errors import (
    BadRequestError,
    ClientClosedError,
    LogServiceUnavailableError,
    TooManyProducersError,
    UnauthorizedError,
)
from appliance.protocol.invariant import InvariantViolation
from appliance.protocol.log_service import decode_request, encode_header, encode_written
from appliance.protocol.logs import DLSN

PID = b"\x07" * 16
A, B = "ipc://a", "ipc://b"
TIMEOUT = limits.LOG_PRODUCER_REQUEST_TIMEOUT_MS
DEADLINE = limits.LOG_PRODUCER_DEADLINE_MS


# -- what goes in -------------------------------------------------------------------------
def written(gen: int, seq: int, n: int, entry: int = 1, slot: int = 0, now: int = 0):
    return lp.Reply(encode_written(gen, seq, [[5, entry, slot, n]]), now)


def answer(gen: int, now: int = 0, **doc):
    return lp.Reply(encode_header({"gen": gen, **doc}), now)


def error(gen: int, code: str, now: int = 0, **doc):
    return answer(gen, now, op="error", code=code, **doc)


# -- what comes out -----------------------------------------------------------------------
def sends(actions) -> list:
    """Each Send as (endpoint, op, gen, first seq, records)."""
    out = []
    for action in actions:
        if type(action) is lp.Send:
            doc, payloads = decode_request([action.frame])
            out.append((action.endpoint, doc["op"], doc["gen"], doc.get("seq"),
                        [bytes(p) for p in payloads]))
    return out


def settled(actions) -> list:
    return [(dlsn, token) for a in actions if type(a) is lp.Settle for dlsn, token in a.done]


def failed(actions) -> list:
    return [(token, type(a.error)) for a in actions if type(a) is lp.Fail for _, token in a.done]


def connected(resume: bool = False, now: int = 0) -> lp.ProducerCore:
    core = lp.ProducerCore("orders", PID, resume=resume)
    assert core.pump(now) == [lp.FindOwner()]
    assert core.pump(now) == []  # one lookup at a time
    assert core.handle(lp.OwnerFound(A, now)) == ([] if not resume else core.take_actions())
    return core


def write(core, *payloads, now: int = 0, seq=None) -> list:
    for p in payloads:
        core.write(p, p.decode(), seq, now)
    return core.pump(now)


# -- numbering, batching, settling ---------------------------------------------------------
def test_writes_are_numbered_sent_in_one_request_and_settled_with_their_dlsns():
    core = lp.ProducerCore("orders", PID)
    for p in (b"a", b"b", b"c"):
        core.write(p, p.decode(), None, 0)
    assert core.pump(0) == [lp.FindOwner()]
    assert sends(core.handle(lp.OwnerFound(A, 0))) == [(A, "write", 1, 1, [b"a", b"b", b"c"])]
    assert settled(core.handle(written(1, 1, 3))) == [
        (DLSN(5, 1, 0), "a"), (DLSN(5, 1, 1), "b"), (DLSN(5, 1, 2), "c")]
    assert not core.pending and core.inflight_bytes == 0


@pytest.mark.parametrize("batch_max, requests_max, writes, first_sends", [
    (2, 1, 5, [(1, 2)]),  # one request awaiting its reply: the rest wait
    (2, 3, 5, [(1, 2), (3, 2), (5, 1)]),  # three requests may await theirs
    (1024, 1, 5, [(1, 5)]),
])
def test_batching(monkeypatch, batch_max, requests_max, writes, first_sends):
    monkeypatch.setattr(limits, "LOG_PRODUCER_BATCH_RECORDS_MAX", batch_max)
    monkeypatch.setattr(limits, "LOG_PRODUCER_REQUESTS_INFLIGHT_MAX", requests_max)
    core = connected()
    out = write(core, *[b"%d" % i for i in range(writes)])
    assert [(seq, len(records)) for _, _, _, seq, records in sends(out)] == first_sends


def test_the_rest_leaves_together_once_the_request_is_answered(monkeypatch):
    monkeypatch.setattr(limits, "LOG_PRODUCER_BATCH_RECORDS_MAX", 2)
    core = connected()
    write(core, b"a")
    assert sends(write(core, b"b", b"c", b"d")) == []  # one request awaits its reply
    assert sends(core.handle(written(1, 1, 1))) == [(A, "write", 1, 2, [b"b", b"c"])]


# -- the window ----------------------------------------------------------------------------
def test_a_duplicated_reply_does_not_let_another_request_leave(monkeypatch):
    """A reply counts once: its duplicate frees no room among the requests
    in flight (LOG_PRODUCER_REQUESTS_INFLIGHT_MAX), it only settles again
    nothing new."""
    monkeypatch.setattr(limits, "LOG_PRODUCER_REQUESTS_INFLIGHT_MAX", 1)
    monkeypatch.setattr(limits, "LOG_PRODUCER_BATCH_RECORDS_MAX", 1)
    core = connected()
    assert sends(write(core, b"a", b"b", b"c")) == [(A, "write", 1, 1, [b"a"])]
    assert sends(core.handle(written(1, 1, 1))) == [(A, "write", 1, 2, [b"b"])]
    assert sends(core.handle(written(1, 1, 1))) == []  # a's reply again: c waits for b's
    assert core.awaiting == 1
    assert sends(core.handle(written(1, 2, 1, entry=2))) == [(A, "write", 1, 3, [b"c"])]


def test_a_full_window_keeps_writes_out_until_a_reply_frees_room(monkeypatch):
    monkeypatch.setattr(limits, "LOG_PRODUCER_INFLIGHT_RECORDS_MAX", 2)
    core = connected()
    assert sends(write(core, b"a", b"b", b"c")) == [(A, "write", 1, 1, [b"a", b"b"])]
    assert list(core.pending) == [1, 2] and len(core.waiting) == 1
    assert not core.has_room(1)
    out = core.handle(written(1, 1, 2))
    assert settled(out) == [(DLSN(5, 1, 0), "a"), (DLSN(5, 1, 1), "b")]
    assert list(core.pending) == [3]  # c entered as they left, and is sent
    assert sends(out) == [(A, "write", 1, 3, [b"c"])]


def test_the_byte_window_counts_payload_bytes_but_one_record_always_fits(monkeypatch):
    monkeypatch.setattr(limits, "LOG_PRODUCER_INFLIGHT_BYTES_MAX", 10)
    core = connected()
    write(core, b"x" * 30, b"y")  # bigger than the window alone: it enters
    assert list(core.pending) == [1] and len(core.waiting) == 1
    core.handle(written(1, 1, 1))
    assert list(core.pending) == [2]


# -- failures ridden over -------------------------------------------------------------------
def test_a_request_unanswered_for_the_timeout_finds_the_owner_and_resends_everything():
    core = connected()
    write(core, b"a", now=0)
    write(core, b"b", now=10)
    assert core.handle(lp.Tick(TIMEOUT)) == []  # not yet
    assert core.handle(lp.Tick(TIMEOUT + 1)) == [lp.FindOwner()]
    assert core.stats["timeouts"] == 1
    assert sends(core.handle(lp.OwnerFound(B, TIMEOUT + 2))) == [
        (B, "write", 2, 1, [b"a", b"b"])]


def test_the_owners_process_gone_finds_the_owner_at_once_and_resends_everything():
    """A server known gone (its registration went) ends the wait for its
    replies at once, not after the request timeout; news of another server
    changes nothing."""
    core = connected()
    write(core, b"a", b"b", now=0)
    assert core.handle(lp.ServerGone(B, 5)) == [] and core.endpoint == A
    assert core.handle(lp.ServerGone(A, 6)) == [lp.FindOwner()]
    assert core.stats["servers_gone"] == 1 and core.stats["timeouts"] == 0
    assert sends(core.handle(lp.OwnerFound(B, 7))) == [(B, "write", 2, 1, [b"a", b"b"])]


def test_a_refusal_by_the_server_fails_every_write_and_sticks():
    core = connected()
    write(core, b"a", b"b", now=0)
    refusal = UnauthorizedError("log server ls-1 refused this client's CURVE key")
    actions = core.handle(lp.Refused(refusal, 5))
    assert failed(actions) == [("a", UnauthorizedError), ("b", UnauthorizedError)]
    assert failed(write(core, b"c", now=6)) == [("c", UnauthorizedError)]


def test_a_write_a_reply_left_out_is_resent_after_the_timeout():
    core = connected()
    write(core, b"a", b"b")
    core.handle(written(1, 1, 1, now=10))  # the answer names a only
    assert core.handle(lp.Tick(10 + TIMEOUT + 1)) == [lp.FindOwner()]
    assert sends(core.handle(lp.OwnerFound(A, 10 + TIMEOUT + 2))) == [(A, "write", 2, 2, [b"b"])]


def test_the_timeout_counts_from_a_request_sent_after_an_idle_spell():
    core = connected()
    write(core, b"a", now=0)
    core.handle(written(1, 1, 1, now=5))
    write(core, b"b", now=3 * TIMEOUT)  # idle for longer than the timeout
    assert core.handle(lp.Tick(3 * TIMEOUT + 10)) == []


@pytest.mark.parametrize("doc, then", [
    ({"endpoint": B}, [(B, "write", 2, 1, [b"a"])]),  # follows the redirect at once
    ({}, [lp.FindOwner()]),  # no endpoint named: looks the owner up
])
def test_not_owner_redirects(doc, then):
    core = connected()
    write(core, b"a")
    out = core.handle(error(1, "not_owner", **doc))
    assert (sends(out) or out) == then
    assert core.stats["redirects"] == 1


def test_retry_and_held_pause_with_a_doubling_back_off_reset_by_a_written():
    core = connected()
    write(core, b"a", b"b")
    assert core.handle(error(1, "retry", now=100)) == [lp.WakeAt(120)]
    assert sends(core.pump(119)) == []
    assert sends(core.pump(120)) == [(A, "write", 2, 1, [b"a", b"b"])]
    assert core.handle(error(2, "retry", now=200)) == [lp.WakeAt(240)]
    core.pump(240)
    assert core.handle(error(3, "held", message="held by vm:1", now=300)) == \
        [lp.WakeAt(300 + 4 * 80)]
    assert core.last_refusal == "held by vm:1"
    core.pump(620)
    core.handle(written(4, 1, 2))
    write(core, b"c")
    assert core.handle(error(4, "retry", now=700)) == [lp.WakeAt(720)]


def test_a_gap_resends_from_the_oldest_after_a_pause():
    core = connected()
    write(core, b"a")
    # the owner lost track of what it already has: resend from the oldest
    assert core.handle(error(1, "gap", expected=1, now=50)) == [lp.WakeAt(70)]
    assert sends(core.pump(70)) == [(A, "write", 2, 1, [b"a"])]


def test_a_gap_below_the_oldest_from_a_stale_owner_is_retried_not_fatal():
    """Seed 76 of tests/sim/logservicesim: writes 1-2 stored and settled; a
    server paused past its session (a stale owner whose table knew none of
    them) answers write 3 "gap, expected 1".  The producer pauses and
    resends; the real owner stores it.  (It used to fail the producer for
    good with BadRequestError.)"""
    core = connected()
    write(core, b"a", b"b")
    assert settled(core.handle(written(1, 1, 2))) == [(DLSN(5, 1, 0), "a"), (DLSN(5, 1, 1), "b")]
    write(core, b"c")
    assert core.handle(error(1, "gap", expected=1, now=50)) == [lp.WakeAt(70)]
    assert "expects sequence number 1, below" in core.last_refusal
    assert sends(core.pump(70)) == [(A, "write", 2, 3, [b"c"])]
    assert settled(core.handle(written(2, 3, 1, entry=2))) == [(DLSN(5, 2, 0), "c")]
    assert core.error is None


@pytest.mark.parametrize("code, error_type", [("full", TooManyProducersError),
                                               ("bad", BadRequestError)])
def test_refusals_that_cannot_be_retried_fail_every_write_and_stick(code, error_type):
    core = connected()
    write(core, b"a", b"b")
    assert failed(core.handle(error(1, code, message="no"))) == [("a", error_type),
                                                                 ("b", error_type)]
    assert failed(write(core, b"c")) == [("c", error_type)]
    assert core.done()


def test_no_owner_found_looks_again_after_a_back_off():
    core = lp.ProducerCore("orders", PID)
    write(core, b"a")
    assert core.handle(lp.OwnerFound(None, 100)) == [lp.WakeAt(120)]
    assert core.pump(110) == []
    assert core.pump(120) == [lp.FindOwner()]


# -- hello, deadline, close ----------------------------------------------------------------
def test_a_resumed_producer_says_hello_first_and_continues_after_the_owners_number():
    core = lp.ProducerCore("orders", PID, resume=True)
    core.pump(0)
    assert sends(core.handle(lp.OwnerFound(A, 0))) == [(A, "hello", 1, None, [])]
    assert sends(write(core, b"a")) == []  # waits for the number
    assert sends(core.handle(answer(0, op="hello", next_seq=99))) == []  # an older hello's
    assert sends(core.handle(answer(1, op="hello", next_seq=42))) == [
        (A, "write", 1, 42, [b"a"])]


def test_a_write_not_stored_by_its_deadline_fails_it_and_every_later_write():
    core = connected()
    write(core, b"a", now=0)
    write(core, b"b", now=1000)
    core.handle(error(1, "held", message="held by vm:1", now=10))
    assert failed(core.handle(lp.Tick(DEADLINE))) == []
    out = core.handle(lp.Tick(DEADLINE + 1))
    assert failed(out) == [("a", LogServiceUnavailableError), ("b", LogServiceUnavailableError)]
    assert "the last refusal: held by vm:1" in str(core.error)
    assert failed(write(core, b"c", now=DEADLINE + 2)) == [("c", LogServiceUnavailableError)]
    assert settled(core.handle(written(2, 1, 2))) == []  # too late: already failed


def test_an_explicit_seq_must_increase_and_only_that_write_fails():
    core = connected()
    write(core, b"a", seq=10)
    assert failed(write(core, b"b", seq=10)) == [("b", ValueError)]
    assert core.error is None
    write(core, b"c", seq=12)
    assert list(core.pending) == [10, 12]


def test_close_lets_pending_writes_finish_and_refuses_new_ones():
    core = connected()
    write(core, b"a")
    core.close()
    assert not core.done()
    assert failed(write(core, b"b")) == [("b", ClientClosedError)]
    core.handle(written(1, 1, 1))
    assert core.done()


# -- replies duplicated, late, for an old generation ---------------------------------------
def test_replies_duplicated_late_or_of_an_old_generation():
    core = connected()
    write(core, b"a", b"b")
    core.handle(error(1, "retry", now=0))
    core.pump(20)  # generation 2 resends both
    assert settled(core.handle(written(1, 1, 1))) == [(DLSN(5, 1, 0), "a")]  # late, still true
    assert settled(core.handle(written(1, 1, 1))) == []  # duplicated: settled once
    assert core.handle(error(1, "not_owner", endpoint=B)) == []  # an old generation's
    assert core.endpoint == A and core.stats["redirects"] == 0
    assert settled(core.handle(written(2, 1, 2))) == [(DLSN(5, 1, 1), "b")]  # a at slot 0 again
    assert core.stats["stale_replies"] == 2
    assert core.handle(lp.Reply(b"\x02cut", 0)) == []  # malformed: dropped
    assert core.stats["stale_replies"] == 3


def test_settled_positions_must_increase_with_the_sequence_numbers():
    core = connected()
    write(core, b"a", b"b")
    core.handle(written(1, 1, 1, entry=7))
    with pytest.raises(InvariantViolation, match="settled at"):
        core.handle(written(1, 2, 1, entry=6))
