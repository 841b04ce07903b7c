"""LedgerReader: failover, LAC reads, open without recovery, waiting for the LAC."""

import pytest

from appliance.errors import (
    OK,
    BKTimeoutError,
    DataUnknownError,
    NoSuchEntryError,
    NoSuchLedgerError,
)
from appliance.protocol import events as ev
from appliance.protocol.entry import pack_entry
from appliance.protocol.reader import LedgerReader, ReaderConfig
from tests.protocol.helpers import DIGEST, KEY, Loop, metadata, of, one


def store(loop, bookies, entry_id, lac, payload=None, digest=DIGEST):
    record = pack_entry(1, entry_id, lac, entry_id + 1, payload or b"e%d" % entry_id, digest)
    for bookie in bookies:
        loop.bookies[bookie].add(1, entry_id, record, KEY)


def reader(loop, **config):
    return LedgerReader(loop.meta[1][0], DIGEST, master_key=KEY,
                        config=ReaderConfig(**config))


def test_open_without_recovery_reads_the_lac_and_fences_nothing():
    loop = Loop(metadata())
    for e in range(3):
        store(loop, ["b1", "b2", "b3"], e, e - 1)
    r = reader(loop)
    loop.run(r, r.open(0))
    assert one(ev.OpenDone, loop.results).last_add_confirmed == 1
    assert not any(getattr(a, "fence", False) for a in loop.sent)
    assert not loop.bookies["b1"].storage.is_fenced(1)
    # nothing past the LAC: refused before anything is sent
    sent = len(loop.sent)
    loop.run(r, r.read(0, 2, 0))
    assert one(ev.ReadDone, loop.results).code == NoSuchEntryError.code
    assert len(loop.sent) == sent


def test_read_fails_over_on_errors_and_bad_digests():
    loop = Loop(metadata())
    store(loop, ["b1", "b2", "b3"], 0, -1)
    store(loop, ["b1", "b2", "b3"], 1, 0)
    store(loop, ["b1", "b2", "b3"], 2, 1)
    # entry 0's first replica (b1) is down; entry 1's first (b2) serves a forged record
    loop.down.add("b1")
    forged = pack_entry(1, 1, 0, 2, b"FORGED", DIGEST)
    loop.bookies["b2"].storage._live[1].entries[1] = forged[:-1] + b"X"
    r = reader(loop)
    r.last_add_confirmed = 1
    loop.run(r, r.read(0, 1, 0))
    loop.fire_timers(r, now_ms=10_000)
    done = one(ev.ReadDone, loop.results)
    assert done.code == OK and [bytes(p) for p in done.payloads] == [b"e0", b"e1"]


def test_negative_only_when_every_replica_says_so():
    loop = Loop(metadata())
    r = reader(loop)
    r.last_add_confirmed = 0
    loop.run(r, r.read(0, 0, 0))
    assert one(ev.ReadDone, loop.results).code == NoSuchEntryError.code
    assert len(of(ev.SendRead, loop.sent)) == 3


def test_a_limbo_replica_makes_a_missing_entry_unknown():
    loop = Loop(metadata())
    loop.bookies["b2"].boot([(1, False)], possible_data_loss=True)
    r = reader(loop, read_rounds_max=2)
    r.last_add_confirmed = 0
    loop.run(r, r.read(0, 0, 0))
    assert one(ev.ReadDone, loop.results).code == DataUnknownError.code
    assert len(of(ev.SendRead, loop.sent)) == 6  # two rounds, then give up


def test_entry_headers_raise_the_lac():
    loop = Loop(metadata())
    for e in range(4):
        store(loop, ["b1", "b2", "b3"], e, e - 1)
    r = reader(loop)
    r.last_add_confirmed = 1
    loop.run(r, r.read(0, 1, 0))
    assert r.last_add_confirmed == 1
    loop.run(r, r.read(0, 0, 0))
    store(loop, ["b1", "b2", "b3"], 4, 3)
    r.last_add_confirmed = 3
    loop.run(r, r.read(3, 3, 0))
    assert r.last_add_confirmed == 3


def test_wait_for_lac_polls_until_it_moves_or_times_out():
    loop = Loop(metadata())
    store(loop, ["b1", "b2", "b3"], 0, -1)
    r = reader(loop, lac_poll_interval_ms=10)
    loop.run(r, r.wait_for_lac(-1, timeout_ms=50, now_ms=0))
    assert loop.results == []  # LAC still -1: a poll is scheduled
    store(loop, ["b1", "b2", "b3"], 1, 0)
    loop.fire_timers(r, now_ms=10)
    got = one(ev.LacRead, loop.results)
    assert (got.code, got.lac) == (OK, 0)
    loop.results.clear()
    loop.run(r, r.wait_for_lac(0, timeout_ms=15, now_ms=20))
    for now_ms in (30, 40):
        loop.fire_timers(r, now_ms)
    got = one(ev.LacRead, loop.results)
    assert (got.code, got.lac) == (BKTimeoutError.code, 0)


def test_wait_for_lac_long_polls_answer_with_the_first_bookie_past_the_mark():
    loop = Loop(metadata())
    loop.drop = lambda a: isinstance(a, ev.SendWaitLac)  # answered by hand below
    r = reader(loop, long_poll=True, lac_poll_interval_ms=10)

    def answer(poll, code=OK, lac=-1, now_ms=0):
        return loop.run(r, r.handle(ev.ReadLacResponse(poll.request_id, poll.bookie_id, 1, code,
                                                      lac, now_ms)))

    loop.run(r, r.wait_for_lac(-1, timeout_ms=1000, now_ms=0))
    polls = of(ev.SendWaitLac, loop.sent)
    assert sorted(p.bookie_id for p in polls) == ["b1", "b2", "b3"]
    assert all((p.previous_lac, p.timeout_ms) == (-1, 1000) for p in polls)
    assert not of(ev.SendReadLac, loop.sent) and loop.results == []
    answer(polls[1], lac=0, now_ms=5)  # one bookie learnt LAC 0: enough
    got = one(ev.LacRead, loop.results)
    assert (got.code, got.lac) == (OK, 0) and r.last_add_confirmed == 0
    answer(polls[0], lac=0, now_ms=6)  # the others' late answers change nothing
    assert len(loop.results) == 1

    # every bookie answers at its timeout with nothing new: the wait times out
    loop.results.clear()
    loop.sent.clear()
    loop.run(r, r.wait_for_lac(0, timeout_ms=100, now_ms=10))
    for poll in of(ev.SendWaitLac, loop.sent):
        answer(poll, lac=0, now_ms=110)
    got = one(ev.LacRead, loop.results)
    assert (got.code, got.lac) == (BKTimeoutError.code, 0)

    # bookies that do not know the ledger yet answer at once: the next round
    # waits lac_poll_interval_ms instead of spinning
    loop.results.clear()
    loop.sent.clear()
    loop.run(r, r.wait_for_lac(0, timeout_ms=100, now_ms=200))
    for poll in of(ev.SendWaitLac, loop.sent):
        answer(poll, code=NoSuchLedgerError.code, now_ms=200)
    assert len(of(ev.SendWaitLac, loop.sent)) == 3 and loop.results == []
    loop.fire_timers(r, now_ms=210)
    assert len(of(ev.SendWaitLac, loop.sent)) == 6


def test_closed_ledger_lac_is_its_last_entry():
    md = metadata().to_in_recovery().to_closed(7)
    r = LedgerReader(md, DIGEST, master_key=KEY)
    assert r.last_add_confirmed == 7
    assert one(ev.OpenDone, r.open(0)).last_add_confirmed == 7


def test_argument_checks():
    r = LedgerReader(metadata(), DIGEST, master_key=KEY,
                     config=ReaderConfig(read_entries_max=10))
    with pytest.raises(ValueError):
        r.read(-1, 3, 0)
    with pytest.raises(ValueError):
        r.read(5, 4, 0)
    with pytest.raises(ValueError, match="read_entries_max"):
        r.read(0, 10, 0)
