"""A stalled bookie (SIGSTOP: it takes nothing in until it runs again) during
reads and recovery, as scripted simulation runs with the invariant checker
on.  Reads go around it by speculative reads (apache/bookkeeper #1489),
a negative still needs every replica's own "no" (BP-46), and recovery
finishes without it when the quorum rules allow (#1067)."""

import pytest

from appliance.errors import OK
from appliance.protocol import events as ev
from tests.sim.script import Script, message

TIMEOUT_MS = 400  # the readers' read timeout; their speculative timeout is a quarter


def closed_ledger(entries: int, **kw) -> Script:
    s = Script(3, 3, 2, timeout_ms=TIMEOUT_MS, **kw)
    s.add(entries)
    s.run(50)
    assert s.writer_lac == entries - 1
    s.close()
    s.run(50)
    assert s.metadata().state == "CLOSED"
    return s


def test_reads_of_a_closed_ledger_go_around_a_stalled_bookie():
    s = closed_ledger(30)
    s.cluster.stall_bookie("bookie-1", 100_000)
    started = s.world.now_ms
    reader = s.read_all()
    assert s.run_until(lambda: reader.done, ms=5_000)
    assert reader.failed_code == OK and reader.next_entry == 30 and s.violation is None
    # answered by the other replicas, never after waiting out a read timeout
    assert s.world.now_ms - started < TIMEOUT_MS
    assert reader.core.speculative_reads > 0
    assert reader.health.quarantined(s.world.now_ms) == ("bookie-1",)


@pytest.mark.parametrize("disabled", [(), ("read-negative-all",)])
def test_a_speculative_negative_does_not_end_a_read(disabled):
    """Entry 0 is on bookie-1 and bookie-3 only (acknowledged by both);
    bookie-1, asked first for it, is stalled, so the speculative read goes to
    bookie-2, which answers "no such entry".  The read must go on to
    bookie-3; trusting that negative is caught by the checker.  (The writer
    dies and a recovery closes the ledger: a writer's own close would wait
    to heal bookie-2, which is what the delayed ensemble change does.)"""
    s = Script(3, 3, 2, timeout_ms=TIMEOUT_MS, disabled=disabled)
    s.drop(message(ev.SendAdd, dst="bookie-2"))
    s.add(2)
    s.run(50)
    assert s.writer_lac == 1
    s.kill_writer()
    s.recover()
    assert s.run_until(lambda: s.recovered_ok(), ms=5_000)
    assert s.metadata().state == "CLOSED" and s.metadata().last_entry_id == 1
    s.cluster.stall_bookie("bookie-1", 100_000)
    reader = s.read_all()
    s.run_until(lambda: reader.done or s.violation is not None, ms=5_000)
    if disabled:
        assert s.violation is not None and s.violation.name == "read-negative"
    else:
        assert s.violation is None
        assert reader.failed_code == OK and reader.next_entry == 2
        assert reader.core.speculative_reads >= 1


@pytest.mark.parametrize("stall_before_last_adds", [False, True])
def test_recovery_finishes_with_a_stalled_bookie(stall_before_last_adds):
    """E3/Qw3/Qa2, the writer gone and bookie-1 stopped for good: the fence
    needs E - Qa + 1 = 2 answers, each entry Qa = 2 positive reads (or
    Qw - Qa + 1 = 2 negatives for the end) and Qa write-backs, so the other
    two are enough; the stopped one is timed out, never waited for."""
    s = Script(3, 3, 2, timeout_ms=TIMEOUT_MS)
    s.add(10)
    s.run(50)
    if stall_before_last_adds:  # entries 10..19 never reach it
        s.cluster.stall_bookie("bookie-1", 100_000)
    s.add(10)
    s.run(50)
    assert s.writer_lac == 19
    s.kill_writer()
    s.cluster.stall_bookie("bookie-1", 100_000)
    s.recover()
    assert s.run_until(lambda: s.recovered() is not None, ms=10_000)
    assert s.recovered_ok() and s.recovered().last_add_confirmed == 19
    reader = s.read_all()
    assert s.run_until(lambda: reader.done, ms=5_000)
    assert reader.failed_code == OK and reader.next_entry == 20 and s.violation is None


def test_recovery_waits_for_a_slow_bookie_when_the_stopped_one_has_no_spare():
    """bookie-1 is stopped for good and bookie-3's write-backs are held past
    the request timeout: with no spare bookie, recovery asks bookie-3 again
    instead of giving up (NotEnoughBookies), and closes once it answers."""
    s = Script(3, 3, 2, timeout_ms=TIMEOUT_MS, positive_min=1)
    s.add(10)
    s.run(50)
    s.cluster.stall_bookie("bookie-1", 100_000)
    s.add(5)  # entries 10..14: on bookie-2 and bookie-3 only
    s.run(50)
    assert s.writer_lac == 14
    s.kill_writer()
    s.hold(message(ev.SendAdd, src="recovery", dst="bookie-3"))
    s.recover()
    s.run(3 * TIMEOUT_MS)  # two timeouts of the write-back to bookie-3
    assert s.recovered() is None
    s.clear_rules()
    s.release(message(ev.SendAdd, src="recovery", dst="bookie-3"))
    assert s.run_until(lambda: s.recovered() is not None, ms=10_000)
    assert s.recovered_ok() and s.recovered().last_add_confirmed == 14
    reader = s.read_all()
    assert s.run_until(lambda: reader.done, ms=5_000)
    assert reader.failed_code == OK and reader.next_entry == 15 and s.violation is None
