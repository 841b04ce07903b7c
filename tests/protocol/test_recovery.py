"""LedgerRecovery against real bookie cores (tests.protocol.helpers.Loop)."""

from appliance.checks.digest import master_key
from appliance.errors import (
    OK,
    BKTimeoutError,
    BookieUnavailableError,
    NotEnoughBookiesError,
    UnauthorizedError,
)
from appliance.protocol import events as ev
from appliance.protocol.entry import pack_entry
from appliance.protocol.invariant import InvariantViolation
from appliance.protocol.quorum import ALL_PROTECTIONS, Protections
from appliance.protocol.recovery import LedgerRecovery, RecoveryConfig
from tests.protocol.helpers import DIGEST, KEY, Loop, metadata, of, one


def store(loop, bookies, entry_id, lac, length=None):
    record = pack_entry(1, entry_id, lac, length or entry_id + 1, b"e%d" % entry_id, DIGEST)
    for bookie in bookies:
        assert loop.bookies[bookie].add(1, entry_id, record, KEY).code == OK


def recover(loop, md=None, key=KEY, spares=("b4", "b5"), protections=ALL_PROTECTIONS, **config):
    md, version = loop.meta[1] if md is None else (md, 1)
    core = LedgerRecovery(md, version, key, DIGEST, config=RecoveryConfig(**config),
                          protections=protections,
                          available_bookies=md.last_fragment[1] + tuple(spares))
    loop.run(core, core.start(now_ms=0))
    return core


def test_recovers_entries_beyond_the_lac_and_closes():
    loop = Loop(metadata())
    store(loop, ["b1", "b2", "b3"], 0, -1)
    store(loop, ["b1", "b2", "b3"], 1, 0)
    store(loop, ["b1", "b2"], 2, 0, length=7)  # written, never acknowledged: still recovered
    core = recover(loop)
    done = one(ev.OpenDone, loop.results)
    assert (done.code, done.last_add_confirmed, done.metadata.length) == (OK, 2, 7)
    md, version = loop.meta[1]
    assert (md.state, md.last_entry_id, version) == ("CLOSED", 2, 3)
    # the fence came first, every recovery read carried the fence flag
    assert all(r.fence for r in of(ev.SendRead, loop.sent))
    assert core.fenced_lac == 0
    # entry 2 was written back to its whole write set with recovery adds
    write_back = [a for a in of(ev.SendAdd, loop.sent) if 2 in a.entry_ids]
    assert {a.bookie_id for a in write_back} == {"b1", "b2", "b3"}
    assert all(a.recovery for a in write_back)
    assert loop.bookies["b3"].read(1, 2, master_key=KEY).code == OK


def test_wrong_password_fails_before_anything_is_sent():
    loop = Loop(metadata())
    recover(loop, key=master_key(b"wrong"))
    assert one(ev.OpenDone, loop.results).code == UnauthorizedError.code
    assert loop.sent == []


def test_a_closed_ledger_is_just_opened():
    loop = Loop(metadata().to_in_recovery().to_closed(5, 50))
    recover(loop)
    done = one(ev.OpenDone, loop.results)
    assert (done.code, done.last_add_confirmed) == (OK, 5) and loop.sent == []


SIX = ("b1", "b2", "b3", "b4", "b5", "b6")


def test_reading_starts_at_the_last_fragment():
    md = metadata().with_fragment(10, ("b4", "b5", "b6"))
    loop = Loop(md, SIX)
    for e in range(10):
        store(loop, md.write_set(e), e, e - 1)
    recover(loop)  # the new fragment's bookies answer LAC -1
    reads = {r.entry_id for r in of(ev.SendRead, loop.sent) if r.fence}
    assert min(reads) == 10
    assert one(ev.OpenDone, loop.results).last_add_confirmed == 9


def test_without_the_fragment_start_rule_recovery_reads_old_fragments():
    md = metadata().with_fragment(10, ("b4", "b5", "b6"))
    loop = Loop(md, SIX)
    for e in range(10):
        store(loop, md.write_set(e), e, e - 1)
    recover(loop, protections=Protections.without("fragment-start"))
    assert min(r.entry_id for r in of(ev.SendRead, loop.sent)) == 0


def test_unknown_entry_is_retried_never_guessed():
    loop = Loop(metadata())
    store(loop, ["b1"], 0, -1)
    loop.down.add("b3")  # b1 positive, b2 negative, b3 silent: neither Qa nor QC
    core = recover(loop, rounds_max=2)
    assert loop.results == []
    rereads = 0
    for now_ms in range(5_000, 60_000, 5_000):  # timeouts, back-off, a second round
        loop.fire_timers(core, now_ms)
        rereads = max(rereads, sum(1 for r in of(ev.SendRead, loop.sent) if r.entry_id == 0))
        if loop.results:
            break
    assert rereads == 6  # two rounds of three reads of entry 0
    done = one(ev.OpenDone, loop.results)
    assert done.code == BKTimeoutError.code
    # the failure says which entry stopped it and why, for the user's error
    assert done.detail.startswith("entry 0 undecided after 2 reads of its write set: "
                                  "1 had it, 1 did not, 1 unknown (no answer, an error or "
                                  "a bad copy); keeping it needs 2 that have it, ending the "
                                  "ledger before it needs 2 "), \
        done.detail
    assert loop.meta[1][0].state == "IN_RECOVERY"  # nothing was decided


def test_a_fence_that_cannot_cover_the_ensemble_fails_and_says_so():
    loop = Loop(metadata())
    store(loop, ["b1", "b2", "b3"], 0, -1)
    loop.down.update({"b2", "b3"})  # one reply of three: an ack quorum may be unfenced
    core = recover(loop, rounds_max=2)
    for now_ms in range(5_000, 60_000, 5_000):
        loop.fire_timers(core, now_ms)
        if loop.results:
            break
    done = one(ev.OpenDone, loop.results)
    assert done.code == BKTimeoutError.code
    assert done.detail == ("fencing its last fragment failed 2 rounds: the last had 1 OK "
                           "of 3 bookies, it needs 2"), done.detail
    assert not of(ev.SendRead, loop.sent)  # nothing read before the fence held


def test_a_failed_write_back_moves_the_tail_to_a_new_fragment():
    loop = Loop(metadata(ack_quorum=3))
    store(loop, ["b1", "b2", "b3"], 0, -1)
    store(loop, ["b1", "b2", "b3"], 1, -1)
    loop.drop = lambda a: isinstance(a, ev.SendAdd) and a.bookie_id == "b3"
    core = recover(loop)
    loop.fire_timers(core, now_ms=5_000)  # b3 never acknowledges the write-back
    md = loop.meta[1][0]
    assert md.state == "CLOSED" and md.last_entry_id == 1
    # nothing was written back yet: the local fragment replaces the one at 0
    assert md.ensembles == ((0, ("b1", "b2", "b4")),)
    b4 = loop.bookies["b4"]
    assert b4.read(1, 0, master_key=KEY).code == OK and b4.read(1, 1, master_key=KEY).code == OK


def test_no_spare_bookie_for_the_write_back():
    loop = Loop(metadata(ack_quorum=3))
    store(loop, ["b1", "b2", "b3"], 0, -1)
    loop.down.add("b3")
    core = recover(loop, spares=(), positive_min=1)
    # without a spare b3 is asked again, rounds_max times, then the recovery fails
    for now_ms in range(5_000, 5_000 * (core.config.rounds_max + 3), 5_000):
        loop.fire_timers(core, now_ms)
    assert one(ev.OpenDone, loop.results).code == NotEnoughBookiesError.code
    resent = [a for a in loop.sent if isinstance(a, ev.SendAdd) and a.bookie_id == "b3"]
    assert len(resent) == 1 + core.config.rounds_max


def _unavailable_for_adds(loop, bookie):
    """``bookie`` answers every add with BookieUnavailable (it left the
    registry: the driver refuses at once instead of timing out)."""
    core = loop.bookies[bookie]
    core.add_batch = lambda ledger, ids, datas, key, recovery: (
        [BookieUnavailableError.code] * len(ids), None)


def test_a_refused_write_back_with_no_spare_completes_at_the_ack_quorum():
    # E3/W3/A2, no spare: b3 refuses the write-back at once; b1 and b2 are
    # the ack quorum, so the recovery closes the ledger (before: NotEnoughBookies)
    loop = Loop(metadata())
    store(loop, ["b1", "b2", "b3"], 0, -1)
    store(loop, ["b1", "b2"], 1, 0)
    _unavailable_for_adds(loop, "b3")
    core = recover(loop, spares=())
    for now_ms in range(5_000, 5_000 * (core.config.rounds_max + 3), 5_000):
        loop.fire_timers(core, now_ms)
    done = one(ev.OpenDone, loop.results)
    assert (done.code, done.last_add_confirmed) == (OK, 1)
    assert loop.meta[1][0].state == "CLOSED"


def test_a_refused_write_back_the_ack_quorum_needs_is_asked_again_then_fails():
    # E3/W3/A3: b3's ack is needed; it is asked again after each back-off,
    # rounds_max times, then the recovery fails instead of waiting forever
    loop = Loop(metadata(ack_quorum=3))
    store(loop, ["b1", "b2", "b3"], 0, -1)
    _unavailable_for_adds(loop, "b3")
    core = recover(loop, spares=(), positive_min=1)
    for now_ms in range(5_000, 5_000 * (core.config.rounds_max + 3), 5_000):
        loop.fire_timers(core, now_ms)
    assert one(ev.OpenDone, loop.results).code == NotEnoughBookiesError.code
    sent = [a for a in loop.sent if isinstance(a, ev.SendAdd) and a.bookie_id == "b3"]
    assert len(sent) == 1 + core.config.rounds_max


def test_concurrent_recoveries_converge_on_one_end():
    loop = Loop(metadata())
    store(loop, ["b1", "b2", "b3"], 0, -1)
    md, version = loop.meta[1]
    first = LedgerRecovery(md, version, KEY, DIGEST)
    second = LedgerRecovery(md, version, KEY, DIGEST)
    pending = second.start(0)  # second marks IN_RECOVERY first ...
    loop.run(first, first.start(0))  # ... but first runs to the close
    loop.run(second, pending)
    ends = [r.last_add_confirmed for r in of(ev.OpenDone, loop.results)]
    assert ends == [0, 0] and loop.meta[1][0].last_entry_id == 0


def test_an_invalid_fragment_is_an_invariant_violation_not_a_silent_change():
    md = metadata(ack_quorum=3).with_fragment(5, ("b1", "b2", "b4"))
    loop = Loop(md)
    for e in range(5):
        store(loop, md.write_set(e), e, e - 1)
    loop.drop = lambda a: isinstance(a, ev.SendAdd) and a.bookie_id == "b4"
    core = recover(loop, protections=Protections.without("fragment-start"))
    try:
        loop.fire_timers(core, now_ms=5_000)
    except InvariantViolation as exc:
        assert "2615" in str(exc)
    else:
        raise AssertionError("recovery built a fragment before the last one")
