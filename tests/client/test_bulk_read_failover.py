"""Bulk-read failover, the pure decision: which replica of a chunk to ask
next after an error or a timeout, when a round is over (back off), and the
error when none served.  The reader runs exactly these functions."""

from __future__ import annotations

from appliance.client.bulk_read.failover import (
    no_replica_error,
    replicas_to_ask,
    tries_after_failure,
)
from appliance.errors import (
    BadRequestError,
    BKTimeoutError,
    BookieUnavailableError,
    DigestMismatchError,
    NoSuchEntryError,
    NoSuchLedgerError,
    is_explicit_negative,
)

WS = ("b1", "b2", "b3")
EVEN = dict.fromkeys(WS, 1 << 62)  # an unstriped ledger: every replica holds the whole chunk


def ask(tries=None, suspects=frozenset(), ordinal=0, run_lens=EVEN, rounds_max=2):
    return replicas_to_ask(WS, ordinal, run_lens, tries or {}, suspects, rounds_max)


def test_a_fresh_chunk_asks_every_replica_rotated_by_its_ordinal():
    assert ask() == ("b1", "b2", "b3")
    assert ask(ordinal=1) == ("b2", "b3", "b1")
    assert ask(ordinal=5) == ("b3", "b1", "b2")


def test_after_an_error_the_others_come_first_until_each_was_asked():
    assert ask({"b1": 1}) == ("b2", "b3")
    assert ask({"b1": 1, "b2": 1}) == ("b3",)
    assert ask({"b1": 1, "b2": 1, "b3": 1}) == ("b1", "b2", "b3")  # round two


def test_a_replica_holding_a_longer_run_comes_first():
    # striped ledger: one request to b2 serves 3 entries, to b1 only 1
    assert ask(run_lens={"b1": 1, "b2": 3, "b3": 2}) == ("b2", "b3", "b1")


def test_a_suspect_is_asked_only_when_no_healthy_replica_with_fewest_tries_is_left():
    assert ask(suspects={"b1"}) == ("b2", "b3")
    assert ask({"b2": 1, "b3": 1}, suspects={"b1"}) == ("b1",)
    assert ask(suspects=set(WS)) == ("b1", "b2", "b3")


def test_no_replica_is_asked_more_than_rounds_max_times():
    assert ask(dict.fromkeys(WS, 2)) is None
    assert ask(dict.fromkeys(WS, 1), rounds_max=1) is None
    assert ask({"b1": 2, "b2": 2, "b3": 1}) == ("b3",)


def test_a_failure_counts_a_try_and_ends_a_round_once_every_replica_failed():
    tries = {}
    tries, done = tries_after_failure(WS, tries, "b1", 2)
    assert (tries, done) == ({"b1": 1}, False)
    tries, done = tries_after_failure(WS, tries, "b2", 2)
    assert done is False
    before = dict(tries)
    tries, done = tries_after_failure(WS, tries, "b3", 2)
    assert (tries, done) == (dict.fromkeys(WS, 1), True)
    assert before == {"b1": 1, "b2": 1}  # the input is not changed


def test_a_replica_that_can_never_serve_uses_up_its_rounds_at_once():
    tries, done = tries_after_failure(WS, {}, "b2", 2, exhaust=True)
    assert (tries, done) == ({"b2": 2}, False)
    assert ask(tries) == ("b1", "b3")


def test_a_failover_told_step_by_step():
    tries, suspects, codes = {}, set(), []

    def fail(bookie, error) -> bool:
        nonlocal tries
        tries, round_done = tries_after_failure(WS, tries, bookie, 2)
        codes.append(error.code)
        return round_done

    assert ask(tries, suspects)[0] == "b1"
    suspects.add("b1")  # b1 times out: the reader resets its socket, it is suspect
    assert fail("b1", BKTimeoutError) is False
    assert ask(tries, suspects) == ("b2", "b3")
    assert fail("b2", BadRequestError) is False  # an error reply
    assert ask(tries, suspects) == ("b3",)
    assert fail("b3", DigestMismatchError) is True  # a bad record ends round one: back off
    assert ask(tries, suspects) == ("b2", "b3")  # round two: the suspect goes last
    assert fail("b2", BadRequestError) is False
    assert fail("b3", DigestMismatchError) is False
    assert ask(tries, suspects) == ("b1",)  # only the suspect has a try left
    assert fail("b1", BKTimeoutError) is True
    assert ask(tries, suspects) is None  # every replica had its rounds: the read fails
    err = no_replica_error(42, 7, codes, ["b1 timed out"])
    assert isinstance(err, DigestMismatchError)  # a bad record is named, not the timeouts


def test_the_error_is_a_negative_only_when_every_answer_was_one():
    negatives = [NoSuchEntryError.code, NoSuchLedgerError.code]
    err = no_replica_error(42, 7, negatives, ["b1: no entry", "b2: no ledger"])
    assert isinstance(err, NoSuchEntryError)
    assert "ledger 42 entry 7: no replica served it (b1: no entry; b2: no ledger)" in str(err)
    mixed = [NoSuchEntryError.code, BKTimeoutError.code]
    assert isinstance(no_replica_error(42, 7, mixed, []), BKTimeoutError)  # the last answer
    # a "no" last, after replicas that never answered, is still unknown (found by the
    # simulation's bulk reader: a closed ledger's entry reported as missing)
    late_no = [BKTimeoutError.code, BKTimeoutError.code, NoSuchEntryError.code]
    err = no_replica_error(42, 7, late_no, [])
    assert isinstance(err, BKTimeoutError) and not is_explicit_negative(err.code)


def test_the_error_class_for_bad_records_timeouts_and_no_answers():
    digest = [BKTimeoutError.code, DigestMismatchError.code, BadRequestError.code]
    assert isinstance(no_replica_error(1, 0, digest, []), DigestMismatchError)
    timeouts = [BKTimeoutError.code] * 3
    assert isinstance(no_replica_error(1, 0, timeouts, []), BKTimeoutError)
    assert isinstance(no_replica_error(1, 0, [], []), BookieUnavailableError)
    last = [BKTimeoutError.code, BadRequestError.code]
    assert isinstance(no_replica_error(1, 0, last, []), BadRequestError)
