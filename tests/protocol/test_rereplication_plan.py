"""Pure re-replication planning: which entries, which replacement, which CAS."""

from __future__ import annotations

import dataclasses

import pytest

from appliance.protocol.keys import master_key, password_hash
from appliance.protocol.metadata import CLOSED, IN_RECOVERY, OPEN, LedgerMetadata
from appliance.protocol.quorum import write_set_positions
from appliance.protocol.rereplication_plan import (
    RECOVER,
    RECOVER_OPEN,
    SKIP_OPEN,
    FragmentPlan,
    StalePlanError,
    choose_replacement,
    ledger_action,
    matching_key,
    plan_ledger,
    plan_sealed,
    plan_settle,
    replace_bookie,
    runs_to_copy,
)


def _closed(ensembles, last_entry_id, e=3, w=3, a=2, **kw) -> LedgerMetadata:
    return LedgerMetadata(ledger_id=7, ensemble_size=e, write_quorum=w, ack_quorum=a,
                          ensembles=tuple((f, tuple(b)) for f, b in ensembles),
                          state=CLOSED, last_entry_id=last_entry_id, **kw)


def _expand(runs) -> list[int]:
    return [e for first, last in runs for e in range(first, last + 1)]


@pytest.mark.parametrize("e,w", [(3, 3), (3, 2), (5, 3), (5, 2), (4, 1), (1, 1)])
@pytest.mark.parametrize("first,last", [(0, 40), (7, 23), (5, 5), (9, 8)])
def test_runs_are_exactly_the_entries_whose_write_set_holds_the_position(e, w, first, last):
    for position in range(e):
        expected = [x for x in range(first, last + 1)
                    if position in write_set_positions(x, e, w)]
        runs = list(runs_to_copy(first, last, e, w, position))
        assert _expand(runs) == expected
        # maximal runs: no two touch (else they would have been merged)
        assert all(a[1] + 1 < b[0] for a, b in zip(runs, runs[1:], strict=False))


def test_full_stripe_is_one_run():
    assert list(runs_to_copy(10, 1_000_000, 3, 3, 1)) == [(10, 1_000_000)]


def test_runs_reject_a_position_outside_the_ensemble():
    with pytest.raises(ValueError):
        list(runs_to_copy(0, 10, 3, 3, 3))


def test_plan_covers_only_fragments_naming_the_lost_bookie_bounded_by_last_entry():
    md = _closed([(0, "abc"), (10, "abd"), (20, "ebd"), (30, "ebf")], last_entry_id=24)
    plans = plan_ledger(md, "a")
    assert [(p.first_entry_id, p.last_entry_id) for p in plans] == [(0, 9), (10, 19)]
    plans = plan_ledger(md, "b")
    # the last fragment starts after the last entry: nothing to copy, metadata to fix
    assert [(p.first_entry_id, p.last_entry_id) for p in plans] == [
        (0, 9), (10, 19), (20, 24), (30, 24)]
    assert [p.entry_count() for p in plans] == [10, 10, 5, 0]
    assert plan_ledger(md, "z") == []


def test_plan_counts_only_the_lost_bookies_share_when_e_exceeds_w():
    md = _closed([(0, "abcde")], last_entry_id=9, e=5, w=2, a=2)
    (plan,) = plan_ledger(md, "c")  # position 2 stores entries 1, 2, 6, 7
    assert _expand(plan.runs()) == [1, 2, 6, 7]
    assert plan.sources(1) == ("b",) and plan.sources(2) == ("d",)


def test_empty_closed_ledger_plans_no_entries():
    (plan,) = plan_ledger(_closed([(0, "abc")], last_entry_id=-1), "b")
    assert plan.entry_count() == 0


def test_sources_are_the_write_set_without_the_lost_bookie():
    md = _closed([(0, "abc")], last_entry_id=5)
    (plan,) = plan_ledger(md, "b")
    assert plan.sources(0) == ("a", "c")
    assert plan.sources(1) == ("c", "a")


def test_replacement_excludes_the_ensemble_the_lost_and_read_only_bookies():
    live = {"a": False, "b": False, "d": True, "e": False, "f": False}
    picks = {choose_replacement("abc", "b", live, {}, salt=s) for s in range(10)}
    assert picks == {"e", "f"}
    assert choose_replacement("abc", "b", {"a": False, "c": False, "d": True}, {}) is None


def test_replacement_prefers_the_least_loaded():
    live = {"d": False, "e": False, "f": False}
    assert choose_replacement("abc", "a", live, {"d": 2, "e": 0, "f": 1}, salt=0) == "e"
    assert choose_replacement("abc", "a", live, {"d": 2, "e": 3, "f": 1}, salt=1) == "f"


def test_replace_bookie_changes_one_fragment_only():
    md = _closed([(0, "abc"), (10, "abd")], last_entry_id=15)
    first, second = plan_ledger(md, "a")
    updated = replace_bookie(md, second, "e")
    assert updated.ensembles == ((0, ("a", "b", "c")), (10, ("e", "b", "d")))
    assert updated.last_entry_id == 15 and updated.state == CLOSED
    # already re-pointed (e.g. by an earlier run): no change
    assert replace_bookie(updated, second, "f") is None


def test_replace_bookie_refuses_a_stale_plan():
    md = _closed([(0, "abc"), (10, "abd")], last_entry_id=15)
    plan = plan_ledger(md, "b")[1]
    changed = dataclasses.replace(md, ensembles=((0, ("a", "b", "c")), (10, ("a", "b", "e"))))
    with pytest.raises(StalePlanError):
        replace_bookie(changed, plan, "f")
    gone = dataclasses.replace(md, ensembles=((0, ("a", "b", "c")),))
    with pytest.raises(StalePlanError):
        replace_bookie(gone, plan, "f")
    reopened = dataclasses.replace(md, state=IN_RECOVERY)
    with pytest.raises(StalePlanError):
        replace_bookie(reopened, plan, "f")


def test_ledger_action_skips_open_ledgers_unless_asked():
    md = _closed([(0, "abc")], last_entry_id=3)
    assert ledger_action(md, recover_open=False) == RECOVER
    for state in (OPEN, IN_RECOVERY):
        opened = dataclasses.replace(md, state=state)
        assert ledger_action(opened, recover_open=False) == SKIP_OPEN
        assert ledger_action(opened, recover_open=True) == RECOVER_OPEN


def test_matching_key_picks_the_password_whose_hash_matches():
    good, bad = master_key(b"secret"), master_key(b"other")
    md = _closed([(0, "abc")], last_entry_id=3, password_hash=password_hash(good))
    assert matching_key(md, [bad, good]) == good
    assert matching_key(md, [bad]) is None
    assert matching_key(_closed([(0, "abc")], last_entry_id=3), [bad]) == bad


@pytest.mark.parametrize("e,w", [(3, 3), (4, 2), (5, 3)])
def test_every_planned_entry_is_in_the_lost_bookies_write_set_and_sources_are_the_rest(e, w):
    names = "abcdefgh"
    md = _closed([(0, names[:e]), (17, names[1:e + 1])], last_entry_id=40, e=e, w=w, a=1)
    for plan in plan_ledger(md, "b"):
        planned = _expand(plan.runs())
        in_range = range(plan.first_entry_id, plan.last_entry_id + 1)
        assert planned == [x for x in in_range if "b" in md.write_set(x)]
        for entry_id in planned:
            assert plan.sources(entry_id) == tuple(
                b for b in md.write_set(entry_id) if b != "b")


def test_sealed_fragments_of_an_open_ledger_are_planned_and_re_pointed_not_the_last():
    md = dataclasses.replace(_closed([(0, "abc"), (10, "abd"), (20, "aed")], -1), state=OPEN)
    plans = plan_sealed(md, "b")
    assert [(p.first_entry_id, p.last_entry_id) for p in plans] == [(0, 9), (10, 19)]
    assert plan_sealed(md, "e") == []  # only in the last fragment: its writer's business
    updated = replace_bookie(md, plans[0], "x")
    assert updated.state == OPEN and updated.ensembles[0] == (0, ("a", "x", "c"))
    assert md.sealed_bookies_replaced(updated)
    last = FragmentPlan(7, 20, 25, ("a", "e", "d"), 3, "e")
    with pytest.raises(StalePlanError):
        replace_bookie(md, last, "x")


def test_settle_plans_the_share_a_recovery_gave_the_bookie_that_replaced_the_lost_one():
    # open: b in a sealed fragment and in the last one; the recovery's
    # write-back failed on b at entry 14 and put x in its place
    before = dataclasses.replace(_closed([(0, "abc"), (10, "dbc")], -1), state=OPEN)
    after = _closed([(0, "abc"), (10, "dbc"), (14, "dxc")], 17)
    (plan,) = plan_settle(before, after, "b")
    assert (plan.first_entry_id, plan.last_entry_id, plan.lost) == (14, 17, "x")
    assert plan.ensemble == ("d", "x", "c") and plan.entry_count() == 4
    assert {b for e in range(14, 18) for b in plan.sources(e)} == {"d", "c"}
    # a fragment replaced in place (LAC never published: from entry 0)
    before = dataclasses.replace(_closed([(0, "abc")], -1), state=OPEN)
    after = _closed([(0, "axc")], 5)
    (plan,) = plan_settle(before, after, "b")
    assert (plan.first_entry_id, plan.last_entry_id, plan.lost) == (0, 5, "x")
    # the recovery changed nothing about b (sealed fragments keep it): nothing
    before = dataclasses.replace(_closed([(0, "abc"), (10, "adc")], -1), state=OPEN)
    assert plan_settle(before, _closed([(0, "abc"), (10, "adc")], 12), "b") == []
    # E > W: only the entries whose write set holds the replacement's position
    before = dataclasses.replace(_closed([(0, "abcde")], -1, e=5, w=2), state=OPEN)
    (plan,) = plan_settle(before, _closed([(0, "axcde")], 9, e=5, w=2), "b")
    assert _expand(plan.runs()) == [0, 1, 5, 6]
