"""LedgerWriter decisions, event by event."""

import dataclasses

import pytest

from appliance.errors import (
    OK,
    BookieIOError,
    LedgerClosedError,
    LedgerFencedError,
    MetadataUnavailableError,
    MetadataVersionError,
    NotEnoughBookiesError,
    TooManyRequestsError,
)
from appliance.protocol import events as ev
from appliance.protocol.entry import unpack_header
from appliance.protocol.metadata import IN_RECOVERY
from appliance.protocol.writer import LedgerWriter, WriterConfig
from tests.protocol.helpers import DIGEST, KEY, ack, adds_by_bookie, metadata, of, one


def writer(md=None, spares=("b4", "b5"), **config):
    md = md or metadata()
    return LedgerWriter(md, 1, KEY, DIGEST, config=WriterConfig(**config),
                        available_bookies=md.last_fragment[1] + tuple(spares))


def test_an_add_goes_to_its_write_set_and_completes_at_ack_quorum():
    w = writer(metadata(("b1", "b2", "b3", "b4"), write_quorum=2, ack_quorum=2))
    sends = of(ev.SendAdd, w.add_many([b"a", b"b"], now_ms=0))
    assert {s.bookie_id: s.entry_ids for s in sends} == {"b1": (0,), "b2": (0, 1), "b3": (1,)}
    b1, b2, b3 = sorted(sends, key=lambda s: s.bookie_id)
    assert ack(w, b2) == []  # one ack each: below Qa
    done = ack(w, b3) + ack(w, b1)
    assert [(c.first_entry_id, c.last_entry_id) for c in of(ev.CompleteAdds, done)] == [(0, 1)]
    assert w.last_add_confirmed == 1


def test_acknowledgement_is_in_entry_order():
    w = writer()
    sends = {s.bookie_id: s for s in of(ev.SendAdd, w.add_many([b"0", b"1"], 0))}
    assert ack(w, sends["b1"], entries=[1]) + ack(w, sends["b2"], entries=[1]) == []
    done = ack(w, sends["b1"], entries=[0]) + ack(w, sends["b2"], entries=[0])
    assert one(ev.CompleteAdds, done).last_entry_id == 1


def test_every_entry_carries_the_lac_of_its_moment():
    w = writer()
    sends = of(ev.SendAdd, w.add(b"0", 0))
    for s in sends:
        ack(w, s)
    record = of(ev.SendAdd, w.add(b"1", 0))[0].datas[0]
    assert unpack_header(record)[:3] == (1, 1, 0)


def test_duplicate_and_foreign_acks_do_not_count():
    w = writer()
    s = of(ev.SendAdd, w.add(b"x", 0))[0]
    assert ack(w, s) + ack(w, s) == []  # the same bookie twice is one ack
    stranger = ev.AddResponse(s.request_id, "b9", 1, 0, OK)
    assert w.handle(stranger) == [] and w.last_add_confirmed == -1


def test_error_triggers_an_ensemble_change_from_lac_plus_one():
    w = writer()
    first = {s.bookie_id: s for s in of(ev.SendAdd, w.add(b"0", 0))}
    ack(w, first["b1"]), ack(w, first["b2"])
    sends = {s.bookie_id: s for s in of(ev.SendAdd, w.add(b"1", 0))}
    ack(w, sends["b1"])
    change = one(ev.WriteMetadata, ack(w, sends["b3"], code=BookieIOError.code))
    assert change.metadata.ensembles == ((0, ("b1", "b2", "b3")), (1, ("b1", "b2", "b4")))
    assert change.expected_version == 1
    held = of(ev.SendAdd, w.add(b"2", 0))
    assert held == []  # adds wait for the new fragment
    applied = w.handle(ev.MetadataWritten(change.request_id, 1, OK, version=2))
    # entry 1 goes to the replacement only; the held entry 2 to its whole write set
    assert adds_by_bookie(applied) == {"b4": [1, 2], "b1": [2], "b2": [2]}
    resend = [s for s in of(ev.SendAdd, applied) if s.entry_ids == (1,)][0]
    assert resend.bookie_id == "b4"
    assert one(ev.CompleteAdds, ack(w, resend, entries=[1])).last_entry_id == 1


def test_acks_of_a_replaced_bookie_are_forgotten():
    w = writer(metadata(ack_quorum=3))
    sends = {s.bookie_id: s for s in of(ev.SendAdd, w.add(b"0", 0))}
    ack(w, sends["b1"]), ack(w, sends["b2"])
    change = one(ev.WriteMetadata, ack(w, sends["b2"], code=BookieIOError.code))
    assert ack(w, sends["b3"]) == []  # b1 + b3: b2's ack no longer counts
    applied = w.handle(ev.MetadataWritten(change.request_id, 1, OK, version=2))
    late = ev.AddResponse(sends["b2"].request_id, "b2", 1, 0, OK)
    assert w.handle(late) == []
    b4 = [s for s in of(ev.SendAdd, applied) if s.bookie_id == "b4"][0]
    assert one(ev.CompleteAdds, ack(w, b4)).last_entry_id == 0


def test_timeout_replaces_a_silent_bookie():
    w = writer(metadata(ack_quorum=3), add_timeout_ms=100, add_retries_max=0)
    actions = w.add(b"0", now_ms=0)
    timer = one(ev.SetTimer, actions)
    for s in of(ev.SendAdd, actions):
        if s.bookie_id != "b3":
            ack(w, s)
    assert w.last_add_confirmed == -1
    early = w.handle(ev.TimerFired(timer.timer_id, now_ms=50))
    assert of(ev.WriteMetadata, early) == []  # not yet timed out: the tick re-arms
    change = one(ev.WriteMetadata, w.handle(ev.TimerFired(one(ev.SetTimer, early).timer_id,
                                                          now_ms=150)))
    # nothing acknowledged yet: the new fragment replaces the one at entry 0
    assert change.metadata.ensembles == ((0, ("b1", "b2", "b4")),)


def test_conflict_with_a_recovery_fences_the_writer():
    w = writer()
    s = of(ev.SendAdd, w.add(b"0", 0))[0]
    change = one(ev.WriteMetadata, ack(w, s, code=BookieIOError.code))
    reread = one(ev.ReadMetadata, w.handle(ev.MetadataWritten(
        change.request_id, 1, MetadataVersionError.code)))
    md = metadata().to_in_recovery()
    failed = one(ev.FailAdds, w.handle(ev.MetadataRead(reread.request_id, 1, OK, md, 2)))
    assert (failed.first_entry_id, failed.last_entry_id, failed.code) == \
        (0, 0, LedgerFencedError.code)
    assert one(ev.FailAdds, w.add(b"later", 0)).code == LedgerFencedError.code


def test_an_unreachable_store_fails_the_adds_with_its_own_error():
    """A writer cut off from the metadata store (a partitioned host) fails
    with MetadataUnavailableError once its retries are used, not with a
    conflict it never saw."""
    w = writer(metadata_retries_max=2)
    s = of(ev.SendAdd, w.add(b"0", 0))[0]
    change = one(ev.WriteMetadata, ack(w, s, code=BookieIOError.code))
    unavailable = MetadataUnavailableError.code
    for _ in range(3):
        reread = one(ev.ReadMetadata, w.handle(ev.MetadataWritten(
            change.request_id, 1, unavailable)))
        actions = w.handle(ev.MetadataRead(reread.request_id, 1, unavailable))
        change = next(iter(of(ev.WriteMetadata, actions)), None)
        if change is None:
            break
    assert one(ev.FailAdds, actions).code == unavailable and w.state == "failed"
    assert one(ev.FailAdds, w.add(b"later", 0)).code == unavailable


def test_a_fenced_reply_stops_the_writer():
    w = writer()
    s = of(ev.SendAdd, w.add_many([b"0", b"1"], 0))[0]
    failed = one(ev.FailAdds, ack(w, s, code=LedgerFencedError.code, entries=[0]))
    assert failed.code == LedgerFencedError.code and w.state == "fenced"


def test_not_enough_bookies():
    w = writer(spares=(), delay_ensemble_change=False)
    s = of(ev.SendAdd, w.add(b"0", 0))[0]
    failed = one(ev.FailAdds, ack(w, s, code=BookieIOError.code))
    assert failed.code == NotEnoughBookiesError.code
    assert one(ev.FailAdds, w.add(b"1", 0)).code == NotEnoughBookiesError.code
    close = one(ev.WriteMetadata, w.close(0))  # closing at the LAC still works
    assert close.metadata.last_entry_id == -1


def test_close_freezes_the_lac_and_fails_pending_adds():
    w = writer()
    sends = of(ev.SendAdd, w.add_many([b"0", b"1"], 0))
    for s in sends:
        ack(w, s, entries=[0])
    close = one(ev.WriteMetadata, w.close(0))
    assert (close.metadata.state, close.metadata.last_entry_id) == ("CLOSED", 0)
    assert close.metadata.length == 1
    for s in sends:  # acks arriving after close() never move the LAC
        ack(w, s, entries=[1])
    done = w.handle(ev.MetadataWritten(close.request_id, 1, OK, version=2))
    assert one(ev.FailAdds, done).code == LedgerClosedError.code
    assert one(ev.CloseDone, done).code == OK and w.last_add_confirmed == 0
    assert one(ev.CloseDone, w.close(0)).code == OK  # closing twice is fine


@pytest.mark.parametrize("state,last,code", [
    ("CLOSED", -1, OK),
    ("CLOSED", 4, MetadataVersionError.code),
    (IN_RECOVERY, -1, LedgerFencedError.code),
])
def test_close_conflicts(state, last, code):
    w = writer()
    close = one(ev.WriteMetadata, w.close(0))
    reread = one(ev.ReadMetadata, w.handle(ev.MetadataWritten(
        close.request_id, 1, MetadataVersionError.code)))
    md = metadata().to_in_recovery()
    if state == "CLOSED":
        md = md.to_closed(last)
    done = w.handle(ev.MetadataRead(reread.request_id, 1, OK, md, 3))
    assert one(ev.CloseDone, done).code == code


def test_bad_input_is_refused_before_anything_is_sent():
    w = writer(entry_bytes_max=4, pending_adds_max=2)
    with pytest.raises(ValueError, match="entry_bytes_max"):
        w.add(b"12345", 0)
    with pytest.raises(TypeError):
        w.add("text", 0)
    w.add_many([b"a", b"b"], 0)
    with pytest.raises(TooManyRequestsError):
        w.add(b"c", 0)
    assert w.last_add_pushed == 1


def test_idle_writer_publishes_its_lac():
    w = writer(explicit_lac_interval_ms=50)
    actions = w.add(b"0", 0)
    for s in of(ev.SendAdd, actions):
        ack(w, s, now_ms=5)
    timer = one(ev.SetTimer, actions)
    out = w.handle(ev.TimerFired(timer.timer_id, now_ms=60))
    assert {a.bookie_id for a in of(ev.SendWriteLac, out)} == {"b1", "b2", "b3"}
    assert all(a.lac == 0 for a in of(ev.SendWriteLac, out)) and w.lac_written == 0


def test_an_idle_writers_lac_goes_out_one_interval_after_it_moved():
    """The tick that finds the LAC idle for less than the interval comes back
    when the interval is up (not a whole tick later): readers of an idle
    ledger wait explicit_lac_interval_ms, as documented, not up to twice it."""
    w = writer(explicit_lac_interval_ms=50, add_timeout_ms=400)  # ticks every 50 ms
    actions = w.add(b"0", 0)
    first = one(ev.SetTimer, actions)
    assert first.delay_ms == 50
    for s in of(ev.SendAdd, actions):
        ack(w, s, now_ms=5)  # the LAC moves at 5 ms
    out = w.handle(ev.TimerFired(first.timer_id, now_ms=50))  # idle 45 ms: not yet
    assert of(ev.SendWriteLac, out) == []
    again = one(ev.SetTimer, out)
    assert again.delay_ms == 5  # 5 + 50 - 50: when the writer will have been idle 50 ms
    out = w.handle(ev.TimerFired(again.timer_id, now_ms=55))
    assert {a.lac for a in of(ev.SendWriteLac, out)} == {0} and w.lac_written == 0
    assert of(ev.SetTimer, out) == []  # nothing left to do: no tick
    # adds pending: the tick keeps its period (their timeouts), LAC or not
    actions = w.add(b"1", 60)
    assert one(ev.SetTimer, actions).delay_ms == 50


def batch_ack(core, send: ev.SendAdd, codes=None):
    codes = codes or (OK,) * len(send.entry_ids)
    return core.handle(ev.AddResponses(send.request_id, send.bookie_id, send.ledger_id,
                                       send.entry_ids, tuple(codes)))


def test_batched_replies_count_like_single_ones():
    w = writer(metadata(("b1", "b2", "b3", "b4"), write_quorum=3, ack_quorum=2))
    sends = {s.bookie_id: s for s in of(ev.SendAdd, w.add_many([b"%d" % i for i in range(8)], 0))}
    assert batch_ack(w, sends["b1"]) == []
    done = batch_ack(w, sends["b2"]) + batch_ack(w, sends["b3"]) + batch_ack(w, sends["b4"])
    assert [(c.first_entry_id, c.last_entry_id) for c in of(ev.CompleteAdds, done)][-1][1] == 7
    assert w.last_add_confirmed == 7 and w.pending_count == 0


def test_an_error_inside_a_batch_stops_counting_that_bookie():
    w = writer(metadata(ack_quorum=3))
    sends = {s.bookie_id: s for s in of(ev.SendAdd, w.add_many([b"0", b"1", b"2"], 0))}
    batch_ack(w, sends["b1"]), batch_ack(w, sends["b2"])
    out = batch_ack(w, sends["b3"], codes=(OK, BookieIOError.code, OK))
    # b3 failed on entry 1: the new fragment starts at entry 0 without b3, so its
    # ack of entry 0 is forgotten too and its ack of entry 2 never counts
    change = one(ev.WriteMetadata, out)
    assert change.metadata.ensembles == ((0, ("b1", "b2", "b4")),)
    assert of(ev.CompleteAdds, out) == [] and w.last_add_confirmed == -1
    applied = w.handle(ev.MetadataWritten(change.request_id, 1, OK, version=2))
    resend = one(ev.SendAdd, applied)
    assert (resend.bookie_id, resend.entry_ids) == ("b4", (0, 1, 2))
    assert one(ev.CompleteAdds, batch_ack(w, resend)).last_entry_id == 2


def test_a_sealed_fragment_re_pointed_meanwhile_is_adopted_and_kept():
    # two fragments: (0: b1 b2 b3), (1: b1 b2 b4); re-replication re-points the
    # sealed first one from b3 to b5 while the writer goes on
    w = writer()
    first = {s.bookie_id: s for s in of(ev.SendAdd, w.add(b"0", 0))}
    ack(w, first["b1"]), ack(w, first["b2"])
    sends = {s.bookie_id: s for s in of(ev.SendAdd, w.add(b"1", 0))}
    change = one(ev.WriteMetadata, ack(w, sends["b3"], code=BookieIOError.code))
    w.handle(ev.MetadataWritten(change.request_id, 1, OK, version=2))
    md = change.metadata
    rereplicated = dataclasses.replace(md, ensembles=((0, ("b1", "b2", "b5")),
                                                      md.ensembles[1]))
    close = one(ev.WriteMetadata, w.close(0))
    reread = one(ev.ReadMetadata, w.handle(ev.MetadataWritten(
        close.request_id, 2, MetadataVersionError.code)))
    retry = one(ev.WriteMetadata, w.handle(ev.MetadataRead(reread.request_id, 1, OK,
                                                          rereplicated, 3)))
    assert retry.expected_version == 3
    assert retry.metadata.ensembles[0] == (0, ("b1", "b2", "b5"))  # kept, not overwritten
    assert retry.metadata.state == "CLOSED"
    done = w.handle(ev.MetadataWritten(retry.request_id, 1, OK, version=4))
    assert one(ev.CloseDone, done).code == OK


def test_a_changed_last_fragment_still_fences_the_writer():
    w = writer()
    close = one(ev.WriteMetadata, w.close(0))
    reread = one(ev.ReadMetadata, w.handle(ev.MetadataWritten(
        close.request_id, 1, MetadataVersionError.code)))
    meddled = dataclasses.replace(metadata(), ensembles=((0, ("b1", "b2", "b5")),))
    done = w.handle(ev.MetadataRead(reread.request_id, 1, OK, meddled, 3))
    assert one(ev.CloseDone, done).code == MetadataVersionError.code


def test_a_successful_close_sends_write_close_to_the_current_ensemble_after_close_done():
    """BP-32: advisory WRITE_CLOSE to the bookies of the last fragment, after
    the close completed (nothing waits for it), once."""
    w = writer()
    first = {s.bookie_id: s for s in of(ev.SendAdd, w.add(b"0", 0))}
    change = one(ev.WriteMetadata, ack(w, first["b3"], code=BookieIOError.code))
    applied = w.handle(ev.MetadataWritten(change.request_id, 1, OK, version=2))
    for s in of(ev.SendAdd, applied) + [first["b1"], first["b2"]]:
        ack(w, s)
    close = one(ev.WriteMetadata, w.close(0))
    done = w.handle(ev.MetadataWritten(close.request_id, 1, OK, version=3))
    kinds = [type(a) for a in done]
    assert kinds.index(ev.CloseDone) < kinds.index(ev.SendWriteClose)
    sent = of(ev.SendWriteClose, done)
    assert sorted(a.bookie_id for a in sent) == ["b1", "b2", "b4"]  # b3 was replaced
    assert all(a.ledger_id == 1 and a.master_key == KEY for a in sent)
    assert len({a.request_id for a in sent}) == 3
    assert of(ev.SendWriteClose, w.close(0)) == []  # closing again sends nothing more


@pytest.mark.parametrize("state,last,sends", [
    ("CLOSED", -1, 3),  # someone closed it at our LAC: our close succeeded
    ("CLOSED", 4, 0),
    (IN_RECOVERY, -1, 0),  # fenced: the recovery's fencing reads rotate instead
])
def test_write_close_only_follows_a_successful_close(state, last, sends):
    w = writer()
    close = one(ev.WriteMetadata, w.close(0))
    reread = one(ev.ReadMetadata, w.handle(ev.MetadataWritten(
        close.request_id, 1, MetadataVersionError.code)))
    md = metadata().to_in_recovery()
    if state == "CLOSED":
        md = md.to_closed(last)
    done = w.handle(ev.MetadataRead(reread.request_id, 1, OK, md, 3))
    assert len(of(ev.SendWriteClose, done)) == sends
