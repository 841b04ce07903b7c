"""The cores' own safety checks (``invariant()``, docs/PROTOCOL_CORE.md "In-core
invariants"): each broken rule raises ``InvariantViolation`` where it breaks,
named after the simulation checker's rule when it is one; and a protection
the simulation switches off takes its own check with it, so the checker, not
the core, must find what breaks."""

import pytest

from appliance.errors import OK, MetadataVersionError, ReadOnlyError
from appliance.protocol import events as ev
from appliance.protocol.bookie import BookieCore
from appliance.protocol.entry import pack_entry
from appliance.protocol.invariant import InvariantViolation, invariant
from appliance.protocol.quorum import ALL_PROTECTIONS, Protections
from appliance.protocol.reader import LedgerReader
from appliance.protocol.recovery import LedgerRecovery, RecoveryConfig
from appliance.protocol.writer import LedgerWriter, WriterConfig
from tests.protocol.helpers import DIGEST, KEY, Loop, ack, metadata, of, one
from tests.sim.storage import MemStorage


def test_invariant_formats_its_message_only_when_it_fails_and_names_the_rule():
    invariant(True, "100% %d %s")  # holds: nothing formatted (no args needed)
    with pytest.raises(InvariantViolation) as caught:
        invariant(False, "ledger %d at %s", 7, "x", rule="no-divergence")
    assert (str(caught.value), caught.value.rule) == ("ledger 7 at x", "no-divergence")
    with pytest.raises(InvariantViolation) as caught:
        invariant(0, "100% plain")
    assert (str(caught.value), caught.value.rule) == ("100% plain", None)
    assert isinstance(caught.value, AssertionError)


# -- writer ------------------------------------------------------------------------------
def writer(md=None, protections=ALL_PROTECTIONS, **config):
    md = md or metadata()
    return LedgerWriter(md, 1, KEY, DIGEST, config=WriterConfig(**config),
                        available_bookies=md.last_fragment[1] + ("b4", "b5"),
                        protections=protections)


def test_an_ack_from_outside_the_write_set_is_caught_at_the_acknowledgement():
    w = writer(metadata(("b1", "b2", "b3", "b4"), write_quorum=2, ack_quorum=2))
    sends = {s.bookie_id: s for s in of(ev.SendAdd, w.add(b"a", 0))}
    assert ack(w, sends["b1"]) == []
    w._acks[0] |= 1 << 2  # a bug: position 2 (b3) is not in entry 0's write set
    with pytest.raises(InvariantViolation, match="outside their write sets"):
        ack(w, sends["b2"])


def test_a_writer_that_sees_its_ledger_closed_below_its_lac_fails_there():
    w = writer()
    sends = of(ev.SendAdd, w.add_many([b"a", b"b"], 0))
    for send in sends:  # every bookie: nothing left for the close to wait for
        ack(w, send)
    assert w.last_add_confirmed == 1
    write = one(ev.WriteMetadata, w.close(0))
    reread = one(ev.ReadMetadata, w.handle(ev.MetadataWritten(
        write.request_id, 1, MetadataVersionError.code)))
    closed_low = metadata().to_closed(0, 1)  # someone closed it at 0: divergence
    with pytest.raises(InvariantViolation) as caught:
        w.handle(ev.MetadataRead(reread.request_id, 1, OK, closed_low, 3))
    assert caught.value.rule == "no-divergence"


def _acks_during_a_change(protections):
    """E3/W3/A2: b3 refuses entry 0 after b1 acked it; b2's ack arrives while
    the ensemble change is in flight, then the change completes."""
    w = writer(protections=protections)
    sends = {s.bookie_id: s for s in of(ev.SendAdd, w.add(b"a", 0))}
    ack(w, sends["b1"])
    change = one(ev.WriteMetadata, ack(w, sends["b3"], code=ReadOnlyError.code))
    during = ack(w, sends["b2"])
    after = w.handle(ev.MetadataWritten(change.request_id, 1, OK, 2))
    return w, during, after


def test_with_change_holds_acks_nothing_is_acknowledged_during_a_change():
    w, during, after = _acks_during_a_change(ALL_PROTECTIONS)
    assert of(ev.CompleteAdds, during) == []
    # once the change is done: resent to the replacement first, then confirmed
    assert [type(a).__name__ for a in after if isinstance(a, ev.SendAdd | ev.CompleteAdds)] \
        == ["SendAdd", "CompleteAdds"]
    assert one(ev.SendAdd, after).bookie_id == "b4" and w.last_add_confirmed == 0


def test_switching_change_holds_acks_off_switches_its_check_off_too():
    """The simulation's mutation: the core acknowledges during the change and
    raises nothing, so the checker's ``acked-sent`` must catch it."""
    w, during, _ = _acks_during_a_change(Protections.without("change-holds-acks"))
    assert one(ev.CompleteAdds, during).last_entry_id == 0


# -- reader --------------------------------------------------------------------------------
def test_a_reader_told_a_lac_above_the_closed_end_fails_at_the_metadata():
    loop = Loop(metadata())
    for e in range(3):
        record = pack_entry(1, e, e - 1, e + 1, b"e%d" % e, DIGEST)
        for b in ("b1", "b2", "b3"):
            loop.bookies[b].add(1, e, record, KEY)
    r = LedgerReader(loop.meta[1][0], DIGEST, master_key=KEY)
    loop.run(r, r.open(0))
    assert r.last_add_confirmed == 1
    with pytest.raises(InvariantViolation) as caught:
        r.update_metadata(metadata().to_closed(0, 1))
    assert caught.value.rule == "no-divergence"


# -- recovery ------------------------------------------------------------------------------
def test_recovery_refuses_to_close_below_an_acknowledged_entry_it_read():
    """Entry 2 (on b1 only) carries LAC 1, so 1 was acknowledged; yet every
    bookie answers "no such entry" for 1 (a broken bookie rule): recovery
    must fail there rather than CAS CLOSED at 0."""
    loop = Loop(metadata())
    for e, lac, bookies in ((0, -1, ("b1", "b2", "b3")), (2, 1, ("b1",))):
        record = pack_entry(1, e, lac, e + 1, b"e%d" % e, DIGEST)
        for b in bookies:
            loop.bookies[b].add(1, e, record, KEY)
    # b1's fence reply (its LAC 1) is lost; entry 1's reads wait
    loop.drop = lambda a: (isinstance(a, ev.SendReadLac) and a.bookie_id == "b1") or (
        isinstance(a, ev.SendRead) and a.entry_id == 1)
    md, version = loop.meta[1]
    core = LedgerRecovery(md, version, KEY, DIGEST, config=RecoveryConfig(retry_backoff_ms=10),
                          available_bookies=("b1", "b2", "b3"))
    loop.run(core, core.start(0))
    assert core.fenced_lac == -1 and core._tail.lac_seen == 1 and core._tail.end == 2
    loop.drop = lambda a: False
    with pytest.raises(InvariantViolation) as caught:
        loop.fire_timers(core, now_ms=5_000)  # 1 times out: unknown, retried ...
        loop.fire_timers(core, now_ms=5_100)  # ... and now negative everywhere
    assert caught.value.rule == "no-divergence"
    assert loop.meta[1][0].state == "IN_RECOVERY"  # nothing was closed


# -- bookie --------------------------------------------------------------------------------
class _FenceForgetting(MemStorage):
    """A broken storage: fences are accepted and not kept."""

    def is_fenced(self, ledger_id: int) -> bool:
        return False


def test_a_fence_that_does_not_hold_is_caught_before_the_reply():
    bookie = BookieCore(_FenceForgetting())
    with pytest.raises(InvariantViolation, match="not fenced after a fence"):
        bookie.read_lac(1, fence=True, master_key=KEY)
    with pytest.raises(InvariantViolation, match="boot rule"):
        bookie.boot([(1, False)], possible_data_loss=True)


def test_a_record_a_vouching_check_misfiled_is_caught_before_it_is_stored():
    bookie = BookieCore(MemStorage())
    record = pack_entry(1, 7, -1, 1, b"x", DIGEST)  # names entry 7
    with pytest.raises(InvariantViolation, match="vouched record filed as entry 0"):
        bookie.add_packed(1, [0], [len(record)], record, KEY,
                          records_match=lambda *args: True)
    assert not bookie.storage.ledger_exists(1) or not bookie.storage.has(1, 0)
