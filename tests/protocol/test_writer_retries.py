"""LedgerWriter timeouts: a silent bookie gets its unacknowledged adds resent
(``add_retries_max`` times in a row) before an ensemble change replaces it;
a bookie that answers again is kept."""

from appliance.errors import BKTimeoutError
from appliance.protocol import events as ev
from appliance.protocol.writer import LedgerWriter, WriterConfig
from tests.protocol.helpers import DIGEST, KEY, ack, metadata, of, one


def writer(md=None, **config):
    md = md or metadata()
    return LedgerWriter(md, 1, KEY, DIGEST, config=WriterConfig(add_timeout_ms=100, **config),
                        available_bookies=md.last_fragment[1] + ("b4", "b5"))


def tick(w, actions, now_ms):
    return w.handle(ev.TimerFired(one(ev.SetTimer, actions).timer_id, now_ms))


def test_a_silent_bookie_is_resent_its_adds_then_replaced():
    w = writer(metadata(ack_quorum=3), add_retries_max=2)
    actions = w.add_many([b"0", b"1"], now_ms=0)
    for s in of(ev.SendAdd, actions):
        if s.bookie_id != "b3":
            ack(w, s)
    now, resends = 0, []
    for _ in range(2):  # time out twice: two resends of both entries to b3, nothing else
        now += 110
        actions = tick(w, actions, now)
        resends += of(ev.SendAdd, actions)
        assert of(ev.WriteMetadata, actions) == []
    assert [(s.bookie_id, s.entry_ids) for s in resends] == [("b3", (0, 1))] * 2
    assert w.add_retries == 2 and w.last_add_confirmed == -1
    now += 110
    change = one(ev.WriteMetadata, tick(w, actions, now))  # the third timeout replaces it
    assert change.metadata.ensembles == ((0, ("b1", "b2", "b4")),)


def test_a_bookie_that_answers_a_resend_is_kept_and_its_count_resets():
    w = writer(metadata(ack_quorum=3), add_retries_max=1)
    actions = w.add(b"0", now_ms=0)
    for s in of(ev.SendAdd, actions):
        if s.bookie_id != "b3":
            ack(w, s)
    actions = tick(w, actions, 110)
    resend = one(ev.SendAdd, actions)
    assert one(ev.CompleteAdds, ack(w, resend, now_ms=120)).last_entry_id == 0
    # b3 stalls again later: with its one resend answered, it gets another one first
    later = w.add(b"1", now_ms=130)
    for s in of(ev.SendAdd, later):
        if s.bookie_id != "b3":
            ack(w, s)
    actions = tick(w, actions, 140)
    for now_ms in (240, 250):
        assert of(ev.WriteMetadata, actions) == []
        actions = tick(w, actions, now_ms)
    assert (resend.bookie_id, resend.entry_ids) == ("b3", (0,))
    assert w.add_retries == 2 and w.metadata.ensembles == ((0, ("b1", "b2", "b3")),)


def test_a_transport_timeout_is_no_answer_not_an_error():
    w = writer(metadata(ack_quorum=2))
    sends = of(ev.SendAdd, w.add(b"0", now_ms=0))
    b1, b2, b3 = sorted(sends, key=lambda s: s.bookie_id)
    assert ack(w, b3, code=BKTimeoutError.code) == []  # no ensemble change
    assert one(ev.CompleteAdds, ack(w, b1) + ack(w, b2)).last_entry_id == 0
    assert w.metadata.ensembles == ((0, ("b1", "b2", "b3")),)


def test_only_the_write_sets_of_the_silent_bookie_are_resent():
    w = writer(metadata(("b1", "b2", "b3", "b4"), write_quorum=2, ack_quorum=2))
    actions = w.add_many([b"%d" % e for e in range(4)], now_ms=0)
    for s in of(ev.SendAdd, actions):
        if s.bookie_id != "b2":
            ack(w, s)
    actions = tick(w, actions, 110)
    resend = one(ev.SendAdd, actions)
    assert (resend.bookie_id, resend.entry_ids) == ("b2", (0, 1))


def test_a_caught_up_bookie_is_never_timed_out():
    w = writer()
    actions = w.add_many([b"0", b"1", b"2"], now_ms=0)
    for s in of(ev.SendAdd, actions):
        ack(w, s)
    assert w.pending_count == 0
    w.add(b"3", now_ms=500)  # its batch is young; the acked ones are forgotten
    assert of(ev.SendAdd, w.handle(ev.TimerFired(one(ev.SetTimer, actions).timer_id, 550))) \
        == []


def test_the_timeout_runs_from_the_oldest_batch_a_bookie_has_not_fully_answered():
    # Qa=3: nothing completes without b3.  While b3 has not answered all of
    # the first batch, that batch's send time counts; once it has, the
    # second batch's (later) time counts, from that batch's first entry.
    w = writer(metadata(ack_quorum=3), add_retries_max=0)
    first = w.add_many([b"0", b"1", b"2"], now_ms=0)
    second = w.add_many([b"3", b"4"], now_ms=60)
    b3 = {}
    for s in of(ev.SendAdd, first + second):
        if s.bookie_id == "b3":
            b3[s.entry_ids] = s
        else:
            ack(w, s)
    ack(w, b3[(0, 1, 2)], entries=[0, 1])
    assert w.last_add_confirmed == 1
    actions = tick(w, first, 90)  # entry 2, sent at 0, is 90 ms old
    assert of(ev.WriteMetadata, actions) == []
    ack(w, b3[(0, 1, 2)], entries=[2])
    assert w.last_add_confirmed == 2
    actions = tick(w, actions, 150)  # entry 3, sent at 60, is 90 ms old
    assert of(ev.SendAdd, actions) == [] and of(ev.WriteMetadata, actions) == []
    actions = tick(w, actions, 165)  # 105 ms: b3 is replaced from entry 3 on
    assert one(ev.WriteMetadata, actions).metadata.ensembles == \
        ((0, ("b1", "b2", "b3")), (3, ("b1", "b2", "b4")))


def test_the_last_reply_of_a_wider_write_quorum_counts_as_late_and_changes_nothing():
    w = writer()  # E3/W3/A2
    sends = {s.bookie_id: s for s in of(ev.SendAdd, w.add_many([b"0", b"1", b"2"], now_ms=0))}
    w.handle(ev.AddResponses(sends["b1"].request_id, "b1", 1, (0, 1, 2), (0, 0, 0)))
    done = w.handle(ev.AddResponses(sends["b2"].request_id, "b2", 1, (0, 1, 2), (0, 0, 0)))
    assert one(ev.CompleteAdds, done).last_entry_id == 2
    late = w.handle(ev.AddResponses(sends["b3"].request_id, "b3", 1, (0, 1, 2), (0, 0, 0)))
    # late for the ack quorum, not stale: the entries stop trailing (writer_heal)
    assert late == [] and w.last_add_confirmed == 2 and w._trail == {}
    assert w.metadata.ensembles == ((0, ("b1", "b2", "b3")),)
