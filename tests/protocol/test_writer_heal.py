"""The delayed ensemble change: a failed bookie with no spare lags while the
ack quorum holds, and what it missed is re-sent once it answers."""

from appliance.errors import OK, BookieIOError, MetadataVersionError, NotEnoughBookiesError
from appliance.protocol import events as ev
from appliance.protocol.writer import LedgerWriter, WriterConfig
from tests.protocol.helpers import DIGEST, KEY, ack, metadata, of, one


def writer(spares=(), **config):
    md = metadata()  # E3 W3 A2 on b1, b2, b3
    return LedgerWriter(md, 1, KEY, DIGEST, config=WriterConfig(add_timeout_ms=100, **config),
                        available_bookies=md.last_fragment[1] + tuple(spares))


def sends_to(actions, bookie):
    return [s for s in of(ev.SendAdd, actions) if s.bookie_id == bookie]


def lag_b3(w):
    """b3 errs on entry 0 with no spare: it lags; b1 and b2 confirm 0."""
    sends = {s.bookie_id: s for s in of(ev.SendAdd, w.add(b"0", 0))}
    out = ack(w, sends["b3"], code=BookieIOError.code)
    assert not of(ev.FailAdds, out) and not of(ev.WriteMetadata, out)
    done = ack(w, sends["b1"]) + ack(w, sends["b2"])
    assert one(ev.CompleteAdds, done).last_entry_id == 0
    return w


def test_no_spare_keeps_writing_at_the_ack_quorum():
    w = lag_b3(writer())
    sends = of(ev.SendAdd, w.add_many([b"1", b"2"], 10))
    assert sorted(s.bookie_id for s in sends) == ["b1", "b2"]  # b3 is skipped
    done = sum((ack(w, s) for s in sends), [])
    assert of(ev.CompleteAdds, done)[-1].last_entry_id == 2 and w.state == "open"
    assert w.metadata.ensembles == ((0, ("b1", "b2", "b3")),)  # no ensemble change


def test_the_lagging_bookie_is_probed_then_healed_and_rejoins():
    w = lag_b3(writer())
    for s in of(ev.SendAdd, w.add(b"1", 10)):
        ack(w, s)
    probe = sends_to(w.handle(ev.TimerFired(w._tick, 200)), "b3")
    assert [p.entry_ids for p in probe] == [(0,)]
    rest = ack(w, probe[0], now_ms=210)
    assert [s.entry_ids for s in sends_to(rest, "b3")] == [(1,)]  # the rest of its share
    ack(w, sends_to(rest, "b3")[0], now_ms=220)
    assert w._short == {} and w.healed_entries == 2 and not w._lagging
    assert sorted(s.bookie_id for s in of(ev.SendAdd, w.add(b"2", 230))) == ["b1", "b2", "b3"]


def test_losing_the_ack_quorum_still_fails():
    w = lag_b3(writer())
    sends = {s.bookie_id: s for s in of(ev.SendAdd, w.add(b"1", 10))}
    failed = one(ev.FailAdds, ack(w, sends["b2"], code=BookieIOError.code))
    assert failed.code == NotEnoughBookiesError.code and w.state == "failed"


def test_a_spare_that_appears_replaces_the_lagging_bookie():
    w = lag_b3(writer())
    out = w.handle(ev.AvailableBookies(("b1", "b2", "b3", "b4"), 20))
    change = one(ev.WriteMetadata, out)
    assert change.metadata.last_fragment == (1, ("b1", "b2", "b4"))


def test_a_spare_at_the_failure_is_used_at_once():
    w = writer(spares=("b4",))
    sends = {s.bookie_id: s for s in of(ev.SendAdd, w.add(b"0", 0))}
    change = one(ev.WriteMetadata, ack(w, sends["b3"], code=BookieIOError.code))
    assert change.metadata.last_fragment == (0, ("b1", "b2", "b4"))


def test_past_heal_bytes_max_entries_are_acknowledged_but_not_kept():
    w = lag_b3(writer(heal_bytes_max=100))
    sends = of(ev.SendAdd, w.add(b"x" * 200, 10))
    out = sum((ack(w, s) for s in sends), [])
    assert one(ev.CompleteAdds, out).last_entry_id == 1 and w.state == "open"
    assert w.untracked == 1 and 1 not in w._short["b3"]


def test_an_entry_trails_until_every_bookie_acked_it():
    w = writer()
    sends = {s.bookie_id: s for s in of(ev.SendAdd, w.add(b"0", 0))}
    ack(w, sends["b1"]) + ack(w, sends["b2"])
    assert w.last_add_confirmed == 0 and w._trail == {0: 0b100}
    ack(w, sends["b3"])
    assert w._trail == {} and w._kept_bytes == 0


def test_a_silent_bookie_behind_the_ack_quorum_is_noticed_and_lags():
    w = writer()  # b3 never answers; b1 and b2 acknowledge everything at once
    sends = {s.bookie_id: s for s in of(ev.SendAdd, w.add(b"0", 0))}
    ack(w, sends["b1"]) + ack(w, sends["b2"])
    resent = sends_to(w.handle(ev.TimerFired(w._tick, 100)), "b3")
    assert [s.entry_ids for s in resent] == [(0,)]  # the trailing entry is resent
    now = 100
    while 2 not in w._lagging and now < 1_000:
        now += 25
        w.handle(ev.TimerFired(w._tick, now))
    assert w._lagging == {2} and set(w._short["b3"]) == {0} and w.state == "open"


def test_close_waits_for_the_heal_then_closes():
    w = lag_b3(writer())
    assert not of(ev.WriteMetadata, w.close(30))  # entry 0 is short on b3: wait
    probe = sends_to(w.handle(ev.TimerFired(w._tick, 200)), "b3")
    close = one(ev.WriteMetadata, ack(w, probe[0], now_ms=210))
    assert close.metadata.state == "CLOSED" and close.metadata.last_entry_id == 0
    done = w.handle(ev.MetadataWritten(close.request_id, 1, OK, version=2))
    assert one(ev.CloseDone, done).code == OK and w.short_left == 0


def test_close_gives_up_waiting_after_heal_close_wait_ms():
    w = lag_b3(writer(heal_close_wait_ms=500))
    assert not of(ev.WriteMetadata, w.close(30))
    now, close = 30, []
    while not close and now < 2_000:
        now += 100
        close = of(ev.WriteMetadata, w.handle(ev.TimerFired(w._tick, now)))
    assert close and 530 <= now < 700
    w.handle(ev.MetadataWritten(close[0].request_id, 1, OK, version=2))
    assert w.short_left == 1


def test_off_no_spare_stops_the_writer():
    w = writer(delay_ensemble_change=False)
    s = of(ev.SendAdd, w.add(b"0", 0))[0]
    assert one(ev.FailAdds, ack(w, s, code=BookieIOError.code)).code == \
        NotEnoughBookiesError.code


def test_a_change_that_gives_way_to_the_close_still_waits_for_the_heal():
    w = writer(spares=("b4",))
    sends = {s.bookie_id: s for s in of(ev.SendAdd, w.add(b"0", 0))}
    ack(w, sends["b1"]) + ack(w, sends["b2"])  # entry 0 acknowledged, b3 to come
    change = one(ev.WriteMetadata, ack(w, sends["b3"], code=BookieIOError.code))
    assert set(w._short["b3"]) == {0}  # its trailing entry is short on it now
    assert w.close(10) == []  # the change is in flight: the close waits for it
    reread = one(ev.ReadMetadata, w.handle(ev.MetadataWritten(
        change.request_id, 1, MetadataVersionError.code)))
    out = w.handle(ev.MetadataRead(reread.request_id, 1, OK, w.metadata, 1, now_ms=20))
    assert not of(ev.WriteMetadata, out)  # b3 is still registered: wait for its heal
    probe = sends_to(w.handle(ev.TimerFired(w._tick, 200)), "b3")
    close = one(ev.WriteMetadata, ack(w, probe[0], now_ms=210))
    assert close.metadata.state == "CLOSED" and close.metadata.last_entry_id == 0


def test_the_third_ack_arriving_while_closing_ends_the_trail_without_a_resend():
    # b1 and b2 confirm entry 0; close() starts; only then does b3's ack come
    # (a slow third copy): it clears the trail, the close goes on at once and
    # nothing is sent to b3 again (before: the ack was dropped as stale while
    # CLOSING, and the heal resent every trailing entry to b3 an add timeout later)
    w = writer()
    sends = {s.bookie_id: s for s in of(ev.SendAdd, w.add(b"0", 0))}
    ack(w, sends["b1"]) + ack(w, sends["b2"])
    assert w._trail == {0: 0b100}
    assert not of(ev.WriteMetadata, w.close(10))  # waits for b3's copy
    close = one(ev.WriteMetadata, ack(w, sends["b3"], now_ms=20))
    assert w._trail == {} and close.metadata.last_entry_id == 0
    later = w.handle(ev.TimerFired(w._tick, 500)) if w._tick is not None else []
    assert not sends_to(later, "b3")
