"""The pure rules for collecting over-replicated ledgers: which copies a
bookie still needs, how long a ledger must be seen over-replicated, and the
final check before the delete."""

from __future__ import annotations

from appliance.protocol.metadata import CLOSED, IN_RECOVERY, OPEN, LedgerMetadata
from appliance.protocol.overreplication import (
    PASSES_MIN,
    Sighting,
    final_verdict,
    keep_reason,
    observe,
)

ME = "b9"


def _md(ensembles, state=CLOSED, last=99, ledger_id=7):
    return LedgerMetadata(ledger_id=ledger_id, ensemble_size=3, write_quorum=3, ack_quorum=2,
                          ensembles=tuple((f, tuple(b)) for f, b in ensembles), state=state,
                          last_entry_id=last if state == CLOSED else -1)


MOVED = _md([(0, ["b1", "b2", "b3"])])                       # re-replicated away from me
NAMED = _md([(0, ["b1", "b2", ME]), (50, ["b1", "b2", "b3"])])  # I hold entries 0..49


def test_a_bookie_named_by_a_fragment_with_entries_keeps_its_copy():
    assert keep_reason(NAMED, ME) == "fragment at entry 0 names this bookie"
    assert keep_reason(MOVED, ME) is None
    later = _md([(0, ["b1", "b2", "b3"]), (50, ["b1", "b2", ME])], last=50)
    assert keep_reason(later, ME) is not None  # its fragment holds entry 50


def test_an_empty_trailing_fragment_needs_no_copy_but_an_open_ledger_keeps_every_one():
    # ensemble change at LAC + 1 = 100, then closed at 99: fragment 100 holds nothing
    trailing = _md([(0, ["b1", "b2", "b3"]), (100, ["b1", "b2", ME])], last=99)
    assert keep_reason(trailing, ME) is None
    empty = _md([(0, ["b1", "b2", ME])], last=-1)  # a closed empty ledger
    assert keep_reason(empty, ME) is None
    open_ = _md([(0, ["b1", "b2", "b3"]), (100, ["b1", "b2", ME])], state=OPEN)
    assert keep_reason(open_, ME) is not None  # its last fragment is being written


def test_in_recovery_or_unknown_metadata_keeps_the_copy():
    # a recovery writes to the bookies it names only at its close
    assert "recovery" in keep_reason(_md([(0, ["b1", "b2", "b3"])], state=IN_RECOVERY), ME)
    assert keep_reason(None, ME) is not None


def _run(sightings, views, now_ms, mark=0, marked=(), limbo=(), grace_ms=1000):
    return observe(sightings, ME, views, marked, limbo, now_ms, mark, grace_ms)


def test_due_only_after_the_grace_and_enough_consecutive_passes():
    s, due = _run({}, {7: MOVED}, now_ms=0, mark=11)
    assert due == [] and s[7] == Sighting(0, 11, 1)
    s, due = _run(s, {7: MOVED}, now_ms=5000, mark=12)  # time enough, passes not yet
    assert due == [] and s[7] == Sighting(0, 11, 2)     # the first mark is kept
    for _ in range(PASSES_MIN - 2):
        s, due = _run(s, {7: MOVED}, now_ms=5000)
    assert due == [7]
    # many passes but not the grace
    s = {}
    for now in range(0, 999, 100):
        s, due = _run(s, {7: MOVED}, now_ms=now)
        assert due == []
    s, due = _run(s, {7: MOVED}, now_ms=1000)
    assert due == [7]


def test_anything_that_keeps_the_copy_restarts_the_wait():
    start = {7: Sighting(0, 1, 5)}
    for kwargs in ({"views": {7: NAMED}}, {"views": {7: None}}, {"views": {}},
                   {"views": {7: MOVED}, "marked": {7}}, {"views": {7: MOVED}, "limbo": {7}},
                   {"views": {7: _md([(0, ["b1", "b2", "b3"])], state=IN_RECOVERY)}}):
        s, due = _run(start, now_ms=10_000, **kwargs)
        assert due == [] and 7 not in s, kwargs
        s, due = _run(s, {7: MOVED}, now_ms=10_001, mark=9)  # seen again: from zero
        assert due == [] and s[7] == Sighting(10_001, 9, 1)


def test_a_zero_grace_turns_the_collector_off():
    s, due = _run({7: Sighting(0, 1, 99)}, {7: MOVED}, now_ms=10**9, grace_ms=0)
    assert s == {} and due == []


def test_final_verdict_marker_first_then_metadata():
    assert final_verdict(MOVED, ME, marked=False) is None
    assert "re-replication" in final_verdict(MOVED, ME, marked=True)
    assert final_verdict(NAMED, ME, marked=False) is not None
    assert final_verdict(None, ME, marked=False) is not None  # deleted meanwhile: other path
