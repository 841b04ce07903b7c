"""BookKeeper's own test-suite scenarios (REFERENCES.md), replayed as scripted
simulation runs.  Every run also has the invariant checker on: a scenario
passes only if nothing was violated along the way."""

import re

import pytest

from appliance.errors import (
    OK,
    LedgerClosedError,
    LedgerFencedError,
    MetadataVersionError,
    NotEnoughBookiesError,
    ReadOnlyError,
    UnauthorizedError,
)
from appliance.protocol import events as ev
from tests.sim.script import Script, message


def read_back(s: Script) -> int:
    """Read the closed ledger whole; returns how many entries came back."""
    reader = s.read_all()
    s.run(1_000)
    assert reader.done and reader.failed_code == OK
    return reader.next_entry


@pytest.mark.parametrize("count", [0, 1, 100])
def test_recover_after_n_entries(count):
    s = Script(3, 3, 2)
    s.add(count)
    s.run(200)
    assert s.writer_lac == count - 1
    s.kill_writer()
    s.recover()
    s.run(500)
    assert s.violation is None
    done = s.recovered()
    assert (done.code, done.last_add_confirmed) == (OK, count - 1)
    assert read_back(s) == count


def test_wrong_password_fails_the_open_and_fences_nothing():
    s = Script(3, 3, 2)
    s.add(3)
    s.run(50)
    s.recover(password=b"not the password")
    s.run(100)
    assert s.recovered().code == UnauthorizedError.code
    assert s.metadata().state == "OPEN"
    assert not any(b.storage.is_fenced(1) for b in s.cluster.bookies.values())
    s.add(1)  # the writer carries on untouched
    s.run(50)
    assert s.writer_lac == 3 and s.violation is None


def add_one_by_one(s: Script, count: int) -> None:
    """Each add waits for the previous one, so headers carry a moving LAC."""
    for _ in range(count):
        s.add(1)
        s.run(10)


def test_with_qw_3_and_one_bookie_dead_recovery_fails_until_it_returns():
    # BookKeeper's rule (one positive read recovers an entry): entry 5 must be
    # written back to all three bookies, and there is no spare for the dead one
    s = Script(3, 3, 3, timeout_ms=100, positive_min=1)
    add_one_by_one(s, 5)
    s.hold(message(ev.AddResponse, dst="writer", entry=5))
    s.add(1)  # entry 5 is on every bookie but never acknowledged: it must be written back
    s.run(10)
    s.kill_writer()
    s.crash("bookie-1")
    s.recover("first", attempts_max=1)
    s.run(2_000)
    assert s.recovered("first").code == NotEnoughBookiesError.code  # no spare for b1
    assert s.metadata().state == "IN_RECOVERY"
    s.restart("bookie-1")
    s.recover("second")
    s.run(2_000)
    assert s.recovered("second").last_add_confirmed == 5
    assert s.violation is None and read_back(s) == 6


def test_old_writer_is_fenced_and_both_agree_on_the_lac():
    s = Script(3, 3, 2)
    s.add(10)
    s.run(50)
    s.recover()
    s.run(100)
    s.add(1)
    s.run(50)
    failed = s.writer_results(ev.FailAdds)
    assert [f.code for f in failed] == [LedgerFencedError.code]
    assert s.recovered().last_add_confirmed == s.writer_lac == 9
    assert s.violation is None


def test_open_without_recovery_fences_nothing_and_reads_nothing_past_the_lac():
    s = Script(3, 3, 2)
    add_one_by_one(s, 5)
    host, reader = s.open_no_recovery()
    s.run(50)
    opened = [a for a in host.got if isinstance(a, ev.OpenDone)][0]
    assert opened.last_add_confirmed == 3  # the LAC stored with entry 4
    assert not any(b.storage.is_fenced(1) for b in s.cluster.bookies.values())
    host.call(reader, reader.read, 0, 4, s.world.now_ms)
    refused = [a for a in host.got if isinstance(a, ev.ReadDone)][0]
    assert refused.code != OK and refused.payloads == ()
    host.call(reader, reader.read, 0, 3, s.world.now_ms)
    s.run(50)
    read = [a for a in host.got if isinstance(a, ev.ReadDone)][1]
    assert [bytes(p) for p in read.payloads] == [b"entry-%d" % e for e in range(4)]
    s.add(1)  # the writer is unaffected
    s.run(50)
    assert s.writer_lac == 5 and s.violation is None


def test_fencing_survives_a_bookie_restart():
    s = Script(3, 3, 3)
    s.add(2)
    s.run(50)
    s.recover()
    s.run(100)
    for bookie in ("bookie-1", "bookie-2", "bookie-3"):
        s.crash(bookie)  # with a journal the acknowledged fence is durable
        s.restart(bookie)
        assert s.cluster.bookies[bookie].storage.is_fenced(1)
    s.add(1)
    s.run(50)
    assert [f.code for f in s.writer_results(ev.FailAdds)] == [LedgerFencedError.code]
    assert s.violation is None


def test_ten_parallel_recoveries_agree_and_keep_every_acknowledged_entry():
    s = Script(3, 3, 2)
    s.add(20)
    s.run(3)  # some entries still in flight
    for i in range(10):
        s.recover(f"recovery-{i}", attempts_max=3)
    s.run(2_000)
    ends = {s.recovered(f"recovery-{i}").last_add_confirmed for i in range(10)}
    assert len(ends) == 1 and ends.pop() >= s.writer_lac
    assert all(s.recovered_ok(f"recovery-{i}") for i in range(10))
    assert s.violation is None


def test_a_gap_after_the_lac_ends_the_ledger_before_it():
    s = Script(3, 3, 2)
    s.add(9)
    s.run(50)
    assert s.writer_lac == 8
    s.kill_writer()
    # entry 14 made with LAC 8 reached the bookies; entries 9..13 never did
    s.inject_entry(14, 8, ["bookie-1", "bookie-2", "bookie-3"])
    s.recover()
    s.run(200)
    assert s.recovered().last_add_confirmed == 8  # reading stops at the gap (entry 9)
    recovery_reads = [int(re.search(r"entry=(\d+)", line).group(1))
                      for line in s.world.trace_lines()
                      if "recovery->" in line and "SendRead(" in line and "fence=True" in line]
    assert min(recovery_reads) == 9  # forward from the LAC in entry 14's header
    assert s.violation is None and read_back(s) == 9


def test_close_racing_an_add_keeps_the_add_or_fails_it():
    s = Script(3, 3, 2)
    s.add(3)
    s.run(50)
    s.add(1)  # entry 3: still in flight when close() is called
    s.close()
    s.run(50)
    close = s.writer_results(ev.CloseDone)[0]
    assert (close.code, close.last_entry_id) == (OK, 2)
    assert [(f.first_entry_id, f.code) for f in s.writer_results(ev.FailAdds)] == \
        [(3, LedgerClosedError.code)]
    s.close()  # closing again at the same end succeeds
    assert s.writer_results(ev.CloseDone)[1].code == OK
    assert s.violation is None and read_back(s) == 3


@pytest.mark.parametrize("other_end,code", [(4, OK), (5, MetadataVersionError.code)])
def test_closes_with_the_same_end_agree_and_another_end_is_refused(other_end, code):
    s = Script(3, 3, 2)
    s.add(5)
    s.run(50)
    assert s.writer_lac == 4
    if other_end == 5:  # one more entry on two bookies, never acknowledged to the writer
        s.hold(message(ev.AddResponse, dst="writer", entry=5))
        s.add(1)
        s.run(20)
    s.stall_writer(300)
    s.recover()
    s.run(200)
    assert s.recovered().last_add_confirmed == other_end
    s.run(200)
    s.close()
    s.run(50)
    assert s.writer_results(ev.CloseDone)[0].code == code
    assert s.violation is None


def test_kill_three_of_five_ensemble_bookies_mid_write():
    s = Script(5, 3, 2, bookies=8, timeout_ms=100)
    s.add(30)
    s.run(5)
    for bookie in ("bookie-1", "bookie-3", "bookie-5"):
        s.crash(bookie)
    s.add(30)
    s.run(2_000)
    assert s.writer_lac == 59  # writes carried on with spares
    assert not {"bookie-1", "bookie-3", "bookie-5"} & set(s.metadata().last_fragment[1])
    s.close()
    s.run(100)
    assert s.violation is None and read_back(s) == 60


def test_all_bookies_down_fails_adds_with_not_enough_bookies():
    s = Script(3, 3, 2, timeout_ms=100)
    s.add(2)
    s.run(50)
    for bookie in ("bookie-1", "bookie-2", "bookie-3"):
        s.crash(bookie)
    s.add(1)
    s.run(1_000)
    assert [f.code for f in s.writer_results(ev.FailAdds)] == [NotEnoughBookiesError.code]
    s.add(1)
    assert s.writer_results(ev.FailAdds)[-1].code == NotEnoughBookiesError.code
    assert s.writer_lac == 1 and s.violation is None


def _replacement_after_crash(seed: int, disabled: tuple[str, ...] = ()) -> Script:
    """bookie-1..6 on host-1..3 twice; the ensemble bookie-1..3 is one per
    host; bookie-2 crashes: only bookie-5 keeps the write set on 3 hosts."""
    s = Script(3, 3, 3, bookies=6, hosts=3, timeout_ms=100, seed=seed, disabled=disabled)
    s.add(3)
    s.run(50)
    s.crash("bookie-2")
    s.add(3)
    s.run_until(lambda: len(s.metadata().ensembles) == 2 or s.violation is not None, 2_000)
    return s


def test_an_ensemble_change_takes_the_replacement_on_the_free_host():
    for seed in range(8):
        s = _replacement_after_crash(seed)
        assert s.violation is None
        assert s.metadata().last_fragment[1] == ("bookie-1", "bookie-5", "bookie-3")
        assert s.writer.core.placement_degraded == 0


def test_the_placement_invariant_catches_a_host_blind_replacement():
    names = set()
    for seed in range(8):
        s = _replacement_after_crash(seed, disabled=("placement",))
        if s.violation is not None:
            names.add(s.violation.name)
            assert "bookie-5" in s.violation.detail  # the bookie that was free
    assert names == {"placement"}
def run_wrong_key_reader(bookies_check_keys: bool = True) -> tuple[Script, object]:
    """A closed ledger read whole by a reader holding another password's key.
    The digest is crc32c, which any key verifies: only the bookies' read
    rule stands between that reader and the data."""
    s = Script(3, 3, 2)
    s.add(5)
    s.run(50)
    s.close()
    s.run(50)
    if not bookies_check_keys:  # BROKEN: bookies that serve whatever key a read carries
        for bookie in s.cluster.bookies.values():
            bookie.core.read_access = lambda ledger_id, key: OK
    thief = s.read_all("thief", password=b"not the password")
    s.run(2_000)
    return s, thief


def test_a_reader_with_a_wrong_key_is_refused_and_reads_nothing():
    s, thief = run_wrong_key_reader()
    assert thief.done and thief.failed_code == UnauthorizedError.code
    assert thief.next_entry == 0 and s.cluster.checker.reads_refused >= 3  # every replica
    assert s.violation is None
    assert read_back(s) == 5  # the ledger's own key still reads everything


def test_bookies_that_ignore_the_key_are_caught_by_the_checker():
    s, _ = run_wrong_key_reader(bookies_check_keys=False)
    assert s.violation is not None and s.violation.name == "read-needs-key"


@pytest.mark.parametrize("refusal_first", [False, True])
def test_a_bookie_refusing_adds_is_replaced_even_after_the_ack_quorum_confirmed_them(
        refusal_first):
    """E3/W3/A2: bookie-3 turns read-only.  Its refusals may reach the writer
    after bookie-1 and bookie-2 confirmed the entries (the usual order when
    it answers slowest) or before; either way the writer replaces it, so
    later entries get three copies again.  (A refusal that came after the
    ack quorum used to be dropped as stale: the ledger kept a bookie that
    stores nothing, every later entry one copy short.)"""
    s = Script(3, 3, 2, bookies=4, timeout_ms=100_000)
    s.add(5)
    s.run(50)
    s.refuse_adds("bookie-3", ReadOnlyError.code)
    if not refusal_first:  # bookie-3's answers arrive after the other two confirmed
        s.hold(lambda src, dst, m: src == "bookie-3")
    s.add(5)
    s.run(50)
    assert s.writer_lac == 9
    s.clear_rules()
    s.release()
    assert s.run_until(lambda: len(s.metadata().ensembles) == 2, 1_000)
    assert "bookie-3" not in s.metadata().last_fragment[1]
    s.add(5)
    s.run(200)
    assert s.writer_lac == 14 and s.violation is None
    md = s.metadata()
    copies = [sum(e in s.cluster.bookies[b].storage._get(md.ledger_id).entries
                  for b in md.last_fragment[1]) for e in range(10, 15)]
    assert copies == [3] * 5  # three copies again
    s.close()
    s.run(100)
    assert s.violation is None and read_back(s) == 15
