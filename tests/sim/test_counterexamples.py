"""The four counterexamples BookKeeper's TLA+ model found, and two of the
writer's replacement rules, replayed step by step: each produces a
violation with its protection switched off and none with it on (the checker
can fail, and the protection is what prevents it)."""

import pytest

from appliance.errors import OK, ReadOnlyError
from appliance.protocol import events as ev
from tests.sim.script import Script, message

ON, OFF = "on", "off"


def run_2614(protection: str) -> Script:
    """Issue 2614: one fence message lost; non-fencing recovery reads close the
    ledger empty; the old writer then reaches Qa on entry 0."""
    s = Script(3, 3, 2, disabled=("recovery-read-fence",) if protection == OFF else ())
    s.drop(message(ev.SendAdd, dst="bookie-1", entry=0))  # w1 --x b1: e0
    s.hold(message(ev.SendAdd, dst="bookie-3", entry=0))  # e0 to b3 is slow
    s.add(1)
    s.run(10)  # b2 has e0 and acknowledged it: one ack of two
    s.drop(message(ev.SendReadLac, dst="bookie-3", fence=True))  # the fence to b3 is lost
    s.recover()
    s.run(50)
    assert s.recovered_ok() and s.metadata().last_entry_id == -1  # closed empty
    s.release()  # e0 finally reaches b3
    s.run(50)
    return s


def run_2615(protection: str) -> Script:
    """Issue 2615: the last fragment answers LAC -1; recovery rereads entries of
    an earlier fragment and, when a write-back fails, tries to add a fragment
    that starts before the last one."""
    s = Script(2, 2, 2, bookies=5, positive_min=1, timeout_ms=100,
               disabled=("fragment-start",) if protection == OFF else ())
    s.add(5)
    s.run(20)
    assert s.writer_lac == 4
    s.crash("bookie-2")
    s.drop(message(ev.SendAdd, src="writer", entry=5))  # entry 5 reaches nobody
    s.add(1)

    def fresh_fragment() -> bool:  # both bookies replaced from entry 5
        first, bookies = s.metadata().last_fragment
        return first == 5 and not {"bookie-1", "bookie-2"} & set(bookies)
    assert s.run_until(fresh_fragment)
    s.kill_writer()
    fragment = s.metadata().last_fragment
    s.drop(message(ev.SendAdd, src="recovery", dst=fragment[1][0]))  # a write-back fails
    s.recover()
    s.run(2_000)
    return s


def run_bp46_1(protection: str) -> Script:
    """BP-46 scenario 1: a bookie loses its fence flag in a crash after the
    close; the stalled writer wakes up and commits an entry past the end."""
    s = Script(3, 3, 2, journal=False,
               disabled=("fence-on-boot",) if protection == OFF else ())
    s.add(1)
    s.run(10)
    s.stall_writer(200)
    s.drop(lambda src, dst, m: src == "recovery" and dst == "bookie-3")  # b3 never fenced
    s.recover()
    s.run(50)
    assert s.recovered_ok() and s.metadata().last_entry_id == 0
    s.crash("bookie-2")  # the fence was never flushed: lost
    s.run(5)
    s.restart("bookie-2")
    s.hold(message(ev.SendAdd, src="writer", dst="bookie-1"))  # b1 (fenced) answers late
    s.run(200)
    s.add(1)  # the writer wakes up and carries on
    s.run(50)
    return s


def run_bp46_2(protection: str) -> Script:
    """BP-46 scenario 2: a bookie loses an acknowledged entry; its explicit
    negative plus one from a bookie that never had it truncate the ledger."""
    s = Script(3, 3, 2, journal=False, positive_min=1,
               disabled=("limbo",) if protection == OFF else ())
    s.drop(message(ev.SendAdd, dst="bookie-2", entry=0))
    s.add(1)
    s.run(10)
    assert s.writer_lac == 0  # acknowledged by b1 and b3
    s.kill_writer()
    s.crash("bookie-1")  # e0 was never flushed: lost
    s.restart("bookie-1")
    s.hold(message(ev.ReadResponse, src="bookie-3", entry=0))  # b3's copy answers last
    s.recover()
    s.run(50)
    s.release()
    s.run(100)
    return s


def run_change_acks(protection: str) -> Script:
    """Acks during an ensemble change (not from the TLA+ model: found by
    reading the writer).  E3/W3/A2: bookie-3 turns read-only while entries
    5-9 are in flight, and bookie-1 and bookie-2's acks for them arrive while
    the writer's metadata write for the new fragment (from 5, bookie-4 for
    bookie-3) is still in flight.  Confirmed then, they leave the writer's
    pending set unsent to bookie-4, which the metadata names for them: each
    a copy short for good.  BookKeeper holds its add callbacks during the
    change; so does the writer (``change-holds-acks``)."""
    s = Script(3, 3, 2, bookies=4, timeout_ms=100_000,
               disabled=("change-holds-acks",) if protection == OFF else ())
    s.add(5)
    s.run(50)
    assert s.writer_lac == 4
    s.refuse_adds("bookie-3", ReadOnlyError.code)
    s.hold(lambda src, dst, m: src in ("bookie-1", "bookie-2"))  # their acks for 5-9
    s.cluster.meta.delay_ms = (30, 30)  # a slow metadata store: the change takes ~60 ms
    s.add(5)
    assert s.run_until(lambda: s.writer.core._op is not None, 500)  # the change is in flight
    s.clear_rules()
    s.release()  # bookie-1 and bookie-2's acks for 5-9 arrive during the change
    s.run(300)
    s.close()
    s.run(200)
    return s


def run_late_refusal(protection: str) -> Script:
    """A refusal after the ack quorum (not from the TLA+ model: found by
    tests/integration/test_read_only.py under load).  E3/W3/A2: bookie-3
    turns read-only and its refusals of 5-9 reach the writer after bookie-1
    and bookie-2 confirmed them.  Dropped as stale replies, they left a
    bookie that stores nothing in the ensemble, every later entry a copy
    short; the writer replaces it (``late-refusal``)."""
    s = Script(3, 3, 2, bookies=4, timeout_ms=100_000,
               disabled=("late-refusal",) if protection == OFF else ())
    s.add(5)
    s.run(50)
    s.refuse_adds("bookie-3", ReadOnlyError.code)
    s.hold(lambda src, dst, m: src == "bookie-3")  # its answers come after the quorum's
    s.add(5)
    s.run(50)
    assert s.writer_lac == 9
    s.release()  # its refusals of 5-9 (the rule stays: later answers wait too)
    s.run(100)
    s.add(5)  # off: sent to bookie-3 again, confirmed by bookie-1 and bookie-2
    s.run(200)
    s.clear_rules()
    s.release()
    s.run(100)
    s.close()
    s.run(200)
    return s


SCENARIOS = {
    "2614 (recovery-read-fence)": (run_2614, "ack-after-close"),
    "2615 (fragment-start)": (run_2615, "core-invariant"),
    "BP-46 scenario 1 (fence-on-boot)": (run_bp46_1, "ack-after-close"),
    "BP-46 scenario 2 (limbo)": (run_bp46_2, "no-divergence"),
    "acks during an ensemble change (change-holds-acks)": (run_change_acks, "acked-sent"),
    "a refusal after the ack quorum (late-refusal)": (run_late_refusal, "refused-kept"),
}


@pytest.mark.parametrize("name", SCENARIOS)
def test_counterexample_is_found_with_the_protection_off(name):
    run, expected = SCENARIOS[name]
    s = run(OFF)
    assert s.violation is not None, f"{name}: no violation with the protection off"
    assert s.violation.name == expected, s.violation


@pytest.mark.parametrize("name", SCENARIOS)
def test_counterexample_is_harmless_with_the_protection_on(name):
    run, _ = SCENARIOS[name]
    s = run(ON)
    assert s.violation is None, s.violation
    assert s.metadata().state == "CLOSED"
    # and the ledger reads back whole: every entry 0..last, as the writer wrote it
    reader = s.read_all()
    s.run(500)
    assert reader.done and reader.failed_code == OK
    assert reader.next_entry == s.metadata().last_entry_id + 1
    assert s.writer_lac <= s.metadata().last_entry_id


def test_entries_confirmed_during_a_change_reach_the_replacement():
    """``run_change_acks`` with the rule: nothing is confirmed until the new
    fragment is in place; then 5-9 go to bookie-4 and are confirmed (the two
    acks they had count), so each has its three copies."""
    s = run_change_acks(ON)
    md = s.metadata()
    assert md.ensembles[1] == (5, ("bookie-1", "bookie-2", "bookie-4"))
    assert md.last_entry_id == 9 and s.writer_lac == 9
    holders = [[b for b in md.write_set(e) if s.cluster.bookies[b].storage.has(md.ledger_id, e)]
               for e in range(5, 10)]
    assert all(len(h) == 3 for h in holders), holders
