"""Speculative reads and the client's bookie quarantine: a read not answered
within ``speculative_read_timeout_ms`` is also sent to the next replica and
the first payload wins; a negative still needs every replica's own "no"
(BP-46); quarantined bookies are asked last and released after their time."""

import pytest

from appliance.errors import OK, BKTimeoutError, NoSuchEntryError
from appliance.protocol import events as ev
from appliance.protocol.entry import pack_entry
from appliance.protocol.quarantine import BookieHealth
from appliance.protocol.quorum import ALL_PROTECTIONS, Protections
from appliance.protocol.reader import LedgerReader, ReaderConfig
from tests.protocol.helpers import DIGEST, KEY, metadata, of

SPEC_MS = 100


class Drive:
    """One reader driven by hand: its sends and timers are kept, replies and
    timer ticks are given when the test says."""

    def __init__(self, md=None, health=None, protections=ALL_PROTECTIONS, **config):
        config.setdefault("speculative_read_timeout_ms", SPEC_MS)
        config.setdefault("read_timeout_ms", 5_000)
        self.r = LedgerReader(md or metadata(), DIGEST, master_key=KEY,
                              config=ReaderConfig(**config), health=health,
                              protections=protections)
        self.r.last_add_confirmed = 9
        self.sent: list = []
        self.results: list = []
        self.timers: set[int] = set()

    def take(self, actions) -> None:
        for a in actions:
            if isinstance(a, ev.SetTimer):
                self.timers.add(a.timer_id)
            elif isinstance(a, ev.SendRead | ev.SendReadBatch):
                self.sent.append(a)
            else:
                self.results.append(a)

    def read(self, first, last, now_ms=0) -> None:
        self.take(self.r.read(first, last, now_ms))

    def tick(self, now_ms) -> None:
        timers, self.timers = self.timers, set()
        for timer_id in sorted(timers):
            self.take(self.r.handle(ev.TimerFired(timer_id, now_ms)))

    def answer(self, send, code=OK, now_ms=0) -> None:
        data = record(send.entry_id) if code == OK else None
        self.take(self.r.handle(ev.ReadResponse(send.request_id, send.bookie_id, 1,
                                                send.entry_id, code, data, now_ms)))

    def answer_batch(self, send, now_ms=0) -> None:
        ids = tuple(range(send.first_entry_id, send.last_entry_id + 1))
        self.take(self.r.handle(ev.ReadBatchResponse(
            send.request_id, send.bookie_id, 1, OK, ids, (OK,) * len(ids),
            tuple(record(e) for e in ids), now_ms=now_ms)))

    def done(self) -> list:
        return of(ev.ReadDone, self.results)


def record(entry_id: int) -> bytes:
    return pack_entry(1, entry_id, entry_id - 1, entry_id + 1, b"e%d" % entry_id, DIGEST)


def test_an_unanswered_read_goes_to_the_next_replica_and_the_first_payload_wins():
    d = Drive()
    d.read(0, 0)
    assert [s.bookie_id for s in d.sent] == ["b1"]
    d.tick(SPEC_MS - 1)
    assert len(d.sent) == 1  # not yet
    d.tick(SPEC_MS)
    assert [s.bookie_id for s in d.sent] == ["b1", "b2"]
    d.answer(d.sent[1], now_ms=SPEC_MS + 1)
    assert [(x.code, [bytes(p) for p in x.payloads]) for x in d.done()] == [(OK, [b"e0"])]
    d.answer(d.sent[0], now_ms=SPEC_MS + 2)  # the stalled replica answers late: dropped
    assert len(d.done()) == 1 and d.r.speculative_reads == 1


def test_a_speculative_negative_waits_for_the_replica_still_out():
    d = Drive()
    d.read(0, 0)
    d.tick(SPEC_MS)
    d.answer(d.sent[1], NoSuchEntryError.code)  # b2 lacks it: b3 is asked at once
    assert [s.bookie_id for s in d.sent] == ["b1", "b2", "b3"]
    d.answer(d.sent[2], NoSuchEntryError.code)
    assert d.done() == []  # two of three said no; b1 has not answered
    d.answer(d.sent[0])
    assert [x.code for x in d.done()] == [OK]


def test_a_negative_needs_every_replica_also_when_one_was_speculative():
    d = Drive()
    d.read(0, 0)
    d.tick(SPEC_MS)
    d.tick(2 * SPEC_MS)
    assert [s.bookie_id for s in d.sent] == ["b1", "b2", "b3"]
    for send in d.sent[1:]:
        d.answer(send, NoSuchEntryError.code)
    assert d.done() == []
    d.answer(d.sent[0], NoSuchEntryError.code)
    assert [x.code for x in d.done()] == [NoSuchEntryError.code]


def test_the_broken_switch_trusts_the_first_negative():
    """What ``read-negative-all`` guards (the simulation must catch it off)."""
    d = Drive(protections=Protections.without("read-negative-all"))
    d.read(0, 0)
    d.tick(SPEC_MS)
    d.answer(d.sent[1], NoSuchEntryError.code)
    assert [x.code for x in d.done()] == [NoSuchEntryError.code]


def test_speculation_off_waits_for_the_read_timeout():
    d = Drive(speculative_read_timeout_ms=0, read_timeout_ms=1_000)
    d.read(0, 0)
    d.tick(900)
    assert len(d.sent) == 1
    d.tick(1_000)
    assert [s.bookie_id for s in d.sent] == ["b1", "b2"]
    assert d.r.speculative_reads == 0


def test_a_batch_read_is_sent_again_to_another_bookie_once():
    d = Drive(read_batch_entries=4)
    d.read(0, 3)
    first = d.sent[0]
    d.tick(SPEC_MS)
    d.tick(2 * SPEC_MS)
    assert len(d.sent) == 2  # speculated once, not again
    second = d.sent[1]
    assert second.bookie_id != first.bookie_id
    assert (second.first_entry_id, second.last_entry_id) == (0, 3)
    d.answer_batch(second)
    assert [(x.code, len(x.payloads)) for x in d.done()] == [(OK, 4)]
    d.answer_batch(first)  # late: dropped
    assert len(d.done()) == 1 and d.r.stale_replies >= 1


def test_a_failed_batch_copy_leaves_the_race_to_the_other():
    d = Drive(read_batch_entries=4)
    d.read(0, 3)
    d.tick(SPEC_MS)
    first, second = d.sent
    d.take(d.r.handle(ev.ReadBatchResponse(second.request_id, second.bookie_id, 1,
                                           BKTimeoutError.code)))
    assert len(d.sent) == 2 and d.done() == []  # the first copy may still answer
    d.answer_batch(first)
    assert [x.code for x in d.done()] == [OK]


def test_quarantined_bookies_are_asked_last_and_released_after_their_time():
    health = BookieHealth(quarantine_ms=1_000, strikes_max=2, window_ms=500)
    d = Drive(health=health)
    d.read(0, 0)  # b1 first (entry 0)
    d.tick(SPEC_MS)  # b1 outrun: one strike
    d.answer(d.sent[1])
    d.read(0, 0, now_ms=200)
    d.tick(200 + SPEC_MS)  # b1 outrun again: quarantined
    assert health.quarantined(300) == ("b1",) and health.quarantines == 1
    d.answer(d.sent[3], now_ms=300)
    d.read(0, 0, now_ms=400)
    assert d.sent[-1].bookie_id == "b2"  # b1 asked last now
    d.answer(d.sent[-1], now_ms=401)
    d.read(0, 0, now_ms=1_400)  # released
    assert d.sent[-1].bookie_id == "b1"
    assert health.quarantined(1_400) == ()


def test_an_explicit_negative_is_no_strike():
    health = BookieHealth(quarantine_ms=1_000, strikes_max=1, window_ms=500)
    d = Drive(health=health)
    d.read(0, 0)
    d.answer(d.sent[0], NoSuchEntryError.code)
    assert health.quarantined(0) == ()


def test_health_strikes_window_and_ensemble_preference():
    h = BookieHealth(quarantine_ms=100, strikes_max=3, window_ms=50)
    assert not h.strike("b1", 0) and not h.strike("b1", 10)
    assert not h.strike("b1", 70)  # the first strike is out of the window
    assert not h.strike("b1", 80)  # 10, 70, 80: three, but over 70 ms
    assert h.strike("b1", 90) and h.is_quarantined("b1", 189)  # 70, 80, 90
    assert not h.is_quarantined("b1", 190)
    h.strike("b2", 200), h.strike("b2", 201), h.strike("b2", 202)
    assert h.order(("b2", "b1", "b3"), 250) == ("b1", "b3", "b2")
    assert h.prefer(("b1", "b2", "b3"), 2, 250) == ("b1", "b3")
    assert h.prefer(("b1", "b2", "b3"), 3, 250) == ("b1", "b2", "b3")  # too few without it
    off = BookieHealth(quarantine_ms=0)
    assert not any(off.strike("b1", t) for t in range(10))


def test_health_refuses_impossible_settings():
    with pytest.raises(ValueError):
        BookieHealth(strikes_max=0)
