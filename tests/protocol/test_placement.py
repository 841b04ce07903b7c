"""Host/rack-aware placement (appliance.protocol.placement): the rule, new
ensembles over many shapes, replacements and their fallback order."""

from __future__ import annotations

import itertools
import random

import pytest

from appliance.protocol.placement import (
    Location,
    choose_ensemble,
    choose_for_position,
    ensemble_possible,
    meets_rule,
    neighbours,
    replace_positions,
    replacement_possible,
    write_set_hosts,
)


def _cluster(per_host: list[int], racks: list[str] | None = None):
    """Bookies ``h<i>-b<j>``: ``per_host[i]`` of them on host ``h<i>``."""
    locations = {}
    for i, count in enumerate(per_host):
        for j in range(count):
            rack = racks[i] if racks else "default-rack"
            locations[f"h{i}-b{j}"] = Location(f"h{i}", rack)
    return sorted(locations), locations


def _feasible_by_search(writable, locations, size, qw) -> bool:
    hosts = sorted({locations[b].host for b in writable})
    counts = {h: sum(locations[b].host == h for b in writable) for h in hosts}
    for seq in itertools.product(hosts, repeat=size):
        if any(seq.count(h) > counts[h] for h in hosts):
            continue
        ring = [f"{h}#{i}" for i, h in enumerate(seq)]
        if meets_rule(ring, qw, {f"{h}#{i}": Location(h) for i, h in enumerate(seq)}):
            return True
    return False


def test_rule_is_about_every_write_set_not_the_ensemble():
    loc = {"a1": Location("A"), "a2": Location("A"), "b1": Location("B"), "b2": Location("B")}
    assert meets_rule(("a1", "b1", "a2", "b2"), 2, loc)
    assert not meets_rule(("a1", "a2", "b1", "b2"), 2, loc)  # spans 2 hosts, yet a1/a2 pair
    assert write_set_hosts(("a1", "a2", "b1", "b2"), 2, loc) == [1, 2, 1, 2]
    assert meets_rule(("x", "y", "z"), 3, {})  # unlabelled: each bookie its own host


@pytest.mark.parametrize("size", range(1, 8))
def test_every_shape_meets_the_rule_whenever_it_can(size):
    rng = random.Random(size)
    for qw in range(1, size + 1):
        for hosts in range(1, 5):
            for per_host in itertools.product(range(1, 4), repeat=hosts):
                writable, loc = _cluster(list(per_host))
                if len(writable) < size:
                    continue
                chosen = choose_ensemble(writable, loc, size, qw, rng)
                assert chosen is not None and len(set(chosen)) == size
                assert set(chosen) <= set(writable)
                possible = ensemble_possible(writable, loc, size, qw)
                assert meets_rule(chosen, qw, loc) == possible, (size, qw, per_host, chosen)
                if size <= 5 and hosts <= 3:
                    assert possible == _feasible_by_search(writable, loc, size, qw)


def test_two_hosts_alternate_in_an_e4_w2_ensemble():
    writable, loc = _cluster([3, 3])
    for seed in range(20):
        chosen = choose_ensemble(writable, loc, 4, 2, random.Random(seed))
        hosts = [loc[b].host for b in chosen]
        assert hosts[0] != hosts[1] and hosts == hosts[2:] + hosts[:2]


def test_too_few_hosts_still_gives_an_ensemble_spread_as_far_as_it_goes():
    writable, loc = _cluster([3, 3])  # 2 hosts, write quorum 3: the rule cannot hold
    chosen = choose_ensemble(writable, loc, 6, 3, random.Random(1))
    assert sorted(chosen) == writable
    assert not meets_rule(chosen, 3, loc)
    assert min(write_set_hosts(chosen, 3, loc)) == 2  # never all of a write set on one host


def test_one_host_many_bookies_keeps_working():
    writable, loc = _cluster([8])
    seen = {choose_ensemble(writable, loc, 3, 3, random.Random(s)) for s in range(30)}
    assert all(len(set(e)) == 3 for e in seen) and len(seen) > 5  # still random, not stuck


def test_read_only_and_missing_bookies_are_left_to_the_caller():
    writable, loc = _cluster([2, 2, 2])
    assert choose_ensemble(writable[:2], loc, 3, 3, random.Random(0)) is None


def test_rack_mode_spreads_racks_first_then_hosts():
    writable, loc = _cluster([2, 2, 2, 2], racks=["r1", "r1", "r2", "r3"])
    for seed in range(20):
        chosen = choose_ensemble(writable, loc, 3, 3, random.Random(seed), mode="rack")
        assert len({loc[b].rack for b in chosen}) == 3
    writable, loc = _cluster([2, 2, 2], racks=["r1", "r1", "r2"])  # 2 racks < Qw = 3
    chosen = choose_ensemble(writable, loc, 3, 3, random.Random(0), mode="rack")
    assert meets_rule(chosen, 3, loc)


def test_mode_none_is_a_plain_random_choice():
    writable, loc = _cluster([4])
    chosen = choose_ensemble(writable, loc, 3, 2, random.Random(3), mode="none")
    assert chosen == tuple(random.Random(3).sample(writable, 3))
    with pytest.raises(ValueError, match="placement must be one of"):
        choose_ensemble(writable, loc, 3, 2, random.Random(3), mode="zone")
    with pytest.raises(ValueError, match="write quorum 4"):
        choose_ensemble(writable, loc, 3, 4, random.Random(3))


def test_neighbours_are_the_positions_sharing_a_write_set():
    assert neighbours(5, 2, 0) == [1, 4]
    assert neighbours(5, 3, 0) == [1, 2, 3, 4]
    assert neighbours(4, 1, 2) == []


def test_replacement_avoids_the_hosts_of_its_write_sets():
    loc = {"a1": Location("A"), "a2": Location("A"), "b1": Location("B"),
           "c1": Location("C"), "c2": Location("C")}
    ensemble = ("a1", "b1", "c1")  # c1 at position 2 is lost
    assert choose_for_position(ensemble, 3, 2, ["a2", "c2"], loc) == "c2"
    assert replacement_possible(ensemble, 3, 2, ["a2", "c2"], loc)
    # no bookie on another host: fall back to any (never fail for placement)
    assert not replacement_possible(ensemble, 3, 2, ["a2"], loc)
    assert choose_for_position(ensemble, 3, 2, ["a2"], loc) == "a2"
    assert choose_for_position(ensemble, 3, 2, ["a1", "b1"], loc) is None


def test_replacement_only_looks_at_write_sets_holding_the_position():
    loc = {"a1": Location("A"), "a2": Location("A"), "b1": Location("B"),
           "b2": Location("B"), "c1": Location("C")}
    ensemble = ("a1", "b1", "a2", "b2")  # E=4, Qw=2: position 1's neighbours are 0 and 2
    assert choose_for_position(ensemble, 2, 1, ["a9", "c1"], {**loc, "a9": Location("A")}) \
        == "c1"
    assert choose_for_position(ensemble, 2, 1, ["b3"], {**loc, "b3": Location("B")}) == "b3"


def test_replacement_fallback_prefers_another_rack():
    loc = {"a1": Location("A", "r1"), "b1": Location("B", "r2"), "c1": Location("C", "r2"),
           "d1": Location("D", "r1"), "e1": Location("E", "r3"), "x": Location("B", "r3")}
    ensemble = ("a1", "b1", "c1")
    assert choose_for_position(ensemble, 3, 2, ["d1", "e1"], loc) == "e1"
    assert choose_for_position(ensemble, 3, 2, ["d1", "e1"], loc, mode="rack") == "e1"
    assert choose_for_position(ensemble, 3, 2, ["x", "d1"], loc) == "d1"  # host first
    assert choose_for_position(ensemble, 3, 2, ["d1", "e1"], loc, mode="none") == "d1"


def test_several_positions_replaced_see_each_other():
    loc = {"a1": Location("A"), "a2": Location("A"), "a3": Location("A"),
           "b1": Location("B"), "c1": Location("C"), "d1": Location("D")}
    out = replace_positions(("a1", "a2", "a3"), 3, [1, 2], ["b1", "c1", "d1"], loc)
    assert out is not None and meets_rule(out, 3, loc)
    assert replace_positions(("a1", "a2", "a3"), 3, [1, 2], ["b1"], loc) is None


# -- the cores: writer ensemble change, labels arriving by event --------------------------
def _writer_with_spares(spares, locations=None, event_locations=None, placement="host"):
    from appliance.errors import BookieIOError
    from appliance.protocol import events as ev
    from appliance.protocol.writer import LedgerWriter, WriterConfig
    from tests.protocol.helpers import DIGEST, KEY, metadata, of

    md = metadata(("a1", "b1", "c1"))
    w = LedgerWriter(md, 1, KEY, DIGEST, config=WriterConfig(placement=placement),
                     available_bookies=md.last_fragment[1] + tuple(spares), locations=locations)
    if event_locations is not None:
        w.handle(ev.AvailableBookies(md.last_fragment[1] + tuple(spares), 0, event_locations))
    seen = []
    w.on_placement = seen.append
    sends = {s.bookie_id: s for s in of(ev.SendAdd, w.add(b"x", 0))}
    failed = w.handle(ev.AddResponse(sends["b1"].request_id, "b1", 1, 0, BookieIOError.code))
    change = [a for a in failed if isinstance(a, ev.WriteMetadata)][0]
    return w, change.metadata.last_fragment[1], seen


LABELS = {"a1": Location("A"), "a2": Location("A"), "b1": Location("B"), "b2": Location("B"),
          "c1": Location("C"), "c2": Location("C")}


def test_the_writer_replaces_a_bookie_on_the_free_host():
    w, ensemble, seen = _writer_with_spares(["a2", "c2", "b2"], LABELS)
    assert ensemble == ("a1", "b2", "c1") and w.placement_degraded == 0
    (choice,) = seen
    assert choice.position == 1 and set(choice.candidates) == {"a2", "b2", "c2"}
    assert choice.problem() is None


def test_labels_can_arrive_with_available_bookies():
    _, ensemble, _ = _writer_with_spares(["a2", "c2", "b2"], event_locations=LABELS)
    assert ensemble == ("a1", "b2", "c1")


def test_without_a_free_host_the_writer_still_replaces_and_counts_it():
    w, ensemble, seen = _writer_with_spares(["a2", "c2"], LABELS)
    assert ensemble == ("a1", "a2", "c1") and w.placement_degraded == 1
    assert seen[0].degraded and seen[0].problem() is None  # nothing better was live


def test_placement_none_takes_the_first_spare_and_the_invariant_sees_it():
    w, ensemble, seen = _writer_with_spares(["a2", "c2", "b2"], LABELS, placement="none")
    assert ensemble == ("a1", "a2", "c1")
    assert "b2 (host B) was free" in seen[0].problem()


def test_recovery_write_back_replaces_a_silent_bookie_on_the_free_host():
    from appliance.errors import OK
    from appliance.protocol import events as ev
    from appliance.protocol.entry import pack_entry
    from appliance.protocol.recovery import LedgerRecovery, RecoveryConfig
    from tests.protocol.helpers import DIGEST, KEY, Loop, metadata

    md = metadata(("b1", "b2", "b3"), write_quorum=3, ack_quorum=3)
    loop = Loop(md, bookies=("b1", "b2", "b3", "b4", "b5", "b6"))
    record = pack_entry(1, 0, -1, 2, b"e0", DIGEST)
    for bookie in ("b1", "b2"):
        assert loop.bookies[bookie].add(1, 0, record, KEY).code == OK
    loop.down.add("b3")  # silent: its write-back times out and it is replaced
    labels = {"b1": Location("A"), "b2": Location("B"), "b3": Location("C"),
              "b4": Location("A"), "b5": Location("C"), "b6": Location("B")}
    core = LedgerRecovery(md, 1, KEY, DIGEST, config=RecoveryConfig(positive_min=1),
                          available_bookies=("b1", "b2", "b4", "b6", "b5"), locations=labels)
    loop.run(core, core.start(now_ms=0))
    for tick in range(1, 10):
        if loop.results:
            break
        loop.fire_timers(core, tick * 1_000)
    (done,) = loop.results
    assert isinstance(done, ev.OpenDone) and done.code == OK
    assert done.metadata.ensembles[-1] == (0, ("b1", "b2", "b5"))
    assert core.placement_degraded == 0
