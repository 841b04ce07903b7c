"""The delayed ensemble change, scripted: a bookie of a three-bookie E3/W3/A2
ledger is cut off or stalled past the add timeout while no spare exists; the
writer goes on at the ack quorum and heals the bookie once it answers; when
the writer dies first, the bookie's scrub heals it after the ledger closes."""

import pytest

from appliance.errors import NotEnoughBookiesError
from appliance.protocol import events as ev
from tests.sim.nodes import SCRUB_INTERVAL_MS
from tests.sim.script import Script
from tests.sim.world import Violation

TIMEOUT_MS = 100


def holds_all(s: Script, bookie: str, last: int) -> bool:
    storage = s.cluster.bookies[bookie].storage
    return all(storage.has(s.cluster.ledger_id, e) for e in range(last + 1))


def write_through_a_cut(s: Script, bookie: str, count: int = 30) -> None:
    s.add(5)
    s.run(50)
    s.world.net.cut("writer", bookie)
    for _ in range(count // 5):  # adds over more than three add timeouts
        s.add(5)
        s.run(TIMEOUT_MS)


def test_a_cut_off_bookie_without_a_spare_does_not_stop_the_writer():
    s = Script(3, 3, 2, timeout_ms=TIMEOUT_MS)
    write_through_a_cut(s, "bookie-3")
    assert s.violation is None and s.writer_lac == 34
    assert s.metadata().ensembles == ((0, ("bookie-1", "bookie-2", "bookie-3")),)
    assert 2 in s.writer.core._lagging and not holds_all(s, "bookie-3", 34)
    s.world.net.heal("writer", "bookie-3")
    assert s.run_until(lambda: holds_all(s, "bookie-3", 34), 5 * TIMEOUT_MS)
    assert not s.writer.core._lagging  # it rejoined: later adds reach it directly
    s.add(5)
    s.run(50)
    s.close()
    s.run(200)
    assert s.violation is None and s.metadata().last_entry_id == 39
    assert holds_all(s, "bookie-3", 39)


def test_a_stalled_bookie_is_healed_after_it_wakes_up():
    """SIGSTOP-like: bookie-3 gets the adds but answers nothing, then wakes."""
    s = Script(3, 3, 2, timeout_ms=TIMEOUT_MS)
    s.add(5)
    s.run(50)
    s.hold(lambda src, dst, m: "bookie-3" in (src, dst))
    for _ in range(8):
        s.add(5)
        s.run(TIMEOUT_MS)
    assert s.writer_lac == 44 and 2 in s.writer.core._lagging
    s.clear_rules()
    s.release()
    assert s.run_until(lambda: holds_all(s, "bookie-3", 44), 5 * TIMEOUT_MS)
    s.close()
    s.run(200)
    assert s.violation is None and s.metadata().state == "CLOSED"


def test_close_waits_for_the_lagging_bookie_then_closes_healed():
    s = Script(3, 3, 2, timeout_ms=TIMEOUT_MS)
    write_through_a_cut(s, "bookie-3", 15)
    s.close()
    s.run(3 * TIMEOUT_MS)
    assert s.metadata().state == "OPEN"  # still waiting for bookie-3
    s.world.net.heal("writer", "bookie-3")
    assert s.run_until(lambda: s.metadata().state == "CLOSED", 5 * TIMEOUT_MS)
    assert s.violation is None and holds_all(s, "bookie-3", s.metadata().last_entry_id)


def test_without_healing_the_invariant_catches_the_short_copies():
    s = Script(3, 3, 2, timeout_ms=TIMEOUT_MS, disabled=("heal-short",))
    write_through_a_cut(s, "bookie-3", 15)
    s.world.net.heal("writer", "bookie-3")
    s.run(3 * TIMEOUT_MS)
    s.close()
    s.run(200)
    assert s.violation is not None and s.violation.name == "short-healed", s.violation


def test_losing_the_ack_quorum_still_fails_the_adds():
    s = Script(3, 3, 2, timeout_ms=TIMEOUT_MS)
    write_through_a_cut(s, "bookie-3", 10)
    s.world.net.cut("writer", "bookie-2")
    s.add(5)
    s.run(5 * TIMEOUT_MS)
    failed = s.writer_results(ev.FailAdds)
    assert failed and failed[-1].code == NotEnoughBookiesError.code
    assert s.violation is None


def test_a_spare_that_comes_back_replaces_the_lagging_bookie():
    s = Script(3, 3, 2, bookies=4, timeout_ms=TIMEOUT_MS)
    s.crash("bookie-4")  # no spare while bookie-3 is cut off
    write_through_a_cut(s, "bookie-3", 15)
    assert len(s.metadata().ensembles) == 1
    s.restart("bookie-4")
    assert s.run_until(lambda: len(s.metadata().ensembles) == 2, 5 * TIMEOUT_MS)
    start, ensemble = s.metadata().last_fragment
    assert ensemble == ("bookie-1", "bookie-2", "bookie-4")
    s.world.net.heal("writer", "bookie-3")  # what it missed of the first fragment
    assert s.run_until(lambda: holds_all(s, "bookie-3", start - 1), 5 * TIMEOUT_MS)
    assert s.violation is None


def scrubbed_after_the_writer_dies(disabled: tuple[str, ...] = ()) -> Script:
    """bookie-3 is cut off while the writer adds at the ack quorum, the writer
    dies holding the short entries, a recovery closes the ledger, the cut
    heals: only the bookie's scrub can give bookie-3 what it missed."""
    s = Script(3, 3, 2, timeout_ms=TIMEOUT_MS, disabled=disabled)
    for bookie in s.cluster.bookies.values():
        bookie.start_scrub()
    write_through_a_cut(s, "bookie-3", 15)
    s.kill_writer()
    s.recover()
    assert s.run_until(lambda: s.recovered_ok(), 10 * TIMEOUT_MS)
    s.world.net.heal("writer", "bookie-3")
    return s


def test_entries_a_dead_writer_left_short_are_healed_by_the_scrub():
    s = scrubbed_after_the_writer_dies()
    last = s.metadata().last_entry_id
    assert s.metadata().state == "CLOSED" and last >= 19 and not holds_all(s, "bookie-3", last)
    assert s.run_until(lambda: holds_all(s, "bookie-3", last), 5 * SCRUB_INTERVAL_MS)
    assert s.cluster.bookies["bookie-3"].repair_stats["scrubbed"] == 1
    assert s.run_until(lambda: not s.cluster.storage_limbo(s.cluster.bookies["bookie-3"]),
                       5 * SCRUB_INTERVAL_MS)
    s.cluster.checker.check_scrubbed(s.metadata())
    assert s.violation is None


def test_without_the_scrub_the_invariant_catches_the_short_copies():
    s = scrubbed_after_the_writer_dies(disabled=("scrub-short",))
    s.run(5 * SCRUB_INTERVAL_MS)
    with pytest.raises(Violation, match="bookie-3 still lacks"):
        s.cluster.checker.check_scrubbed(s.metadata())
