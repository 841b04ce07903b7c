"""What an operator controls about compaction: its copy rate (on an
injected clock: nothing sleeps), suspending the automatic runs, and the
deleted-ledger collection a requested run does first."""

from __future__ import annotations

import time

import pytest

from appliance.errors import ClientClosedError, MetadataUnavailableError
from storage import LedgerStorage
from tests.support.launch import wait_for

from .conftest import small_options
from .test_compaction import LEDGERS, _interleaved, _reads_back
from .test_throttle import FakeTime

RATE = 100_000  # bytes/s: a run of this test copies ~0.8 MB


@pytest.fixture
def make_storage(tmp_path):
    """``make_storage(**options)``: an interleaved storage (its logs mix every
    ledger), aborted at teardown."""
    opened = []

    def make(**overrides):
        options = small_options(entry_log_per_ledger=False, **overrides)
        dirs = (tmp_path / "j", tmp_path / "l")
        LedgerStorage.format("bookie-1", *dirs, options)
        st = LedgerStorage.open("bookie-1", *dirs, options)
        opened.append(st)
        return st

    yield make
    for st in opened:
        st.abort()


def _doomed(st, keep: int = 3) -> dict:
    """Ten ledgers interleaved, all but ``keep`` deleted; the kept data."""
    data = _interleaved(st, LEDGERS, 300)
    for led in LEDGERS[keep:]:
        st.delete_ledger(led)
    return {led: data[led] for led in LEDGERS[:keep]}


def test_copies_are_held_to_the_rate(make_storage):
    st = make_storage(compaction_rate_bytes_per_s=RATE)
    t = FakeTime()
    st._compactor.clock, st._compactor.sleep = t.clock, t.sleep
    keep = _doomed(st)
    result = st.compact(major=True)
    copied = result["bytes_copied"]
    assert copied > 5 * RATE and result["logs_compacted"] >= 4
    elapsed = t.now - 100.0  # only the throttle moves this clock
    # at the rate from the start; the bucket also counts record headers (~3%)
    assert copied / RATE <= elapsed <= 1.05 * copied / RATE
    assert result["throttled_s"] == pytest.approx(elapsed, abs=1e-3)
    assert st.compaction_status()["throttled_s_total"] == pytest.approx(elapsed, abs=1e-3)
    assert st.compaction_status()["rate_bytes_per_s"] == RATE
    _reads_back(st, keep)


def test_no_rate_limit_copies_without_waiting(make_storage):
    st = make_storage(compaction_rate_bytes_per_s=0)
    t = FakeTime()
    st._compactor.clock, st._compactor.sleep = t.clock, t.sleep
    keep = _doomed(st)
    result = st.compact(major=True)
    assert result["bytes_copied"] > 5 * RATE and t.sleeps == [] and result["throttled_s"] == 0
    _reads_back(st, keep)


def test_a_stop_during_a_throttled_wait_ends_the_run_and_loses_nothing(make_storage):
    st = make_storage(compaction_rate_bytes_per_s=RATE)
    t = FakeTime()

    def sleep(seconds):  # close() asks the compactor to stop while it waits
        st._compactor._stop = True
        t.sleep(seconds)
    st._compactor.clock, st._compactor.sleep = t.clock, sleep
    keep = _doomed(st)
    with pytest.raises(ClientClosedError, match="stopped"):
        st.compact(major=True)
    assert st.compaction_status()["failures"] == 1
    _reads_back(st, keep)
    st._compactor._stop = False
    st._compactor.sleep = t.sleep
    assert st.compact(major=True)["logs_compacted"] >= 4  # the next run does it all
    _reads_back(st, keep)


def test_suspending_stops_an_automatic_run_after_its_current_log(make_storage):
    st = make_storage(compaction_rate_bytes_per_s=RATE)
    t = FakeTime()

    def sleep(seconds):  # the operator suspends while the run copies its first log
        st.suspend_compaction()
        t.sleep(seconds)
    st._compactor.clock, st._compactor.sleep = t.clock, sleep
    keep = _doomed(st)
    st._compactor._auto_run = True  # as the compactor thread marks a scheduled run
    result = st.compact(major=True)
    assert result["stopped"] == "suspended" and result["logs_compacted"] == 1
    assert result["logs_removed"] == 1  # what it did is kept and given back
    _reads_back(st, keep)
    st._compactor._auto_run = False  # a requested run goes on while suspended
    result = st.compact(major=True)
    assert result["stopped"] is None and result["logs_compacted"] >= 3
    _reads_back(st, keep)


def test_suspended_automatic_runs_wait_for_resume_and_requests_still_run(make_storage):
    st = make_storage(compaction_minor_interval_s=1.0)
    st.suspend_compaction()
    t = FakeTime()
    # the thread took its first due times from the real monotonic clock
    # before this one replaces it: start from there, or the test depends on
    # how long the machine has been up (it failed once that passed ~8 h)
    t.now = time.monotonic()

    def clock():  # an hour passes at every look: a minor run is always due
        t.now += 3600.0
        return t.now
    st._compactor.clock = clock
    runs = st.compaction_status()["runs"]
    for _ in range(2):
        ticket = st.request_compaction()
        wait_for(lambda t=ticket: st.compaction_status()["requests_done"] >= t, 30,
                 what="requested compaction while suspended")
    # not suspended, the thread would have run a minor one right after each
    assert st.compaction_status()["runs"] == runs + 2
    assert st.compaction_status()["suspended"]
    st.resume_compaction()
    assert not st.compaction_status()["suspended"]
    wait_for(lambda: st.compaction_status()["runs"] >= runs + 4, 30,
             what="automatic runs after resume")


def test_a_requested_run_collects_deleted_ledgers_first(make_storage):
    st = make_storage()
    data = _interleaved(st, LEDGERS, 300)
    keep = {led: data[led] for led in LEDGERS[:3]}

    def collect():  # what the bookie's GC does: the metadata of the rest is gone
        for led in LEDGERS[3:]:
            st.delete_ledger(led)
        return LEDGERS[3:]
    st.set_deleted_ledger_collector(collect)
    assert st.compact(major=True)["logs_compacted"] == 0  # not asked to collect: all live
    result = st.compact(major=True, collect=True)
    assert result["ledgers_forgotten"] == 7 and result["gc_error"] is None
    assert result["logs_compacted"] >= 4
    usage = st.disk_usage(max_age_s=0)
    assert usage["entry_log_bytes"] <= 1.3 * usage["live_bytes"]
    _reads_back(st, keep)


def test_a_failed_collection_is_reported_and_the_run_goes_on(make_storage):
    st = make_storage()
    keep = _doomed(st)

    def collect():
        raise MetadataUnavailableError("metadata store unreachable")
    st.set_deleted_ledger_collector(collect)
    result = st.compact(major=True, collect=True)
    assert result["ledgers_forgotten"] is None
    assert "unreachable" in result["gc_error"] and result["logs_compacted"] >= 4
    _reads_back(st, keep)


def test_a_log_without_live_entries_is_not_read_and_a_scan_ends_at_its_last_live_one(
        make_storage, monkeypatch):
    from storage import compaction

    st = make_storage()
    early = _interleaved(st, LEDGERS[:2], 150)  # the first log: both ledgers, then
    _interleaved(st, LEDGERS[2:4], 600)  # these two (deleted below) fill it and more logs
    for led in LEDGERS[1:4]:
        st.delete_ledger(led)
    holding = {log_id for log_id, per in st._logs.ledger_bytes.items() if LEDGERS[0] in per}
    assert len(holding) == 1
    (first,) = holding
    blocks_in_first = [0]
    compaction.scan_log(str(st.ledger_dir), first, 0,
                        lambda *a: blocks_in_first.__setitem__(0, blocks_in_first[0] + 1))
    scanned: dict[int, int] = {}
    real_scan = compaction.scan_log

    def counting_scan(directory, log_id, start, on_block):
        def counted(offset, info, raw):
            scanned[log_id] = scanned.get(log_id, 0) + 1
            on_block(offset, info, raw)
        return real_scan(directory, log_id, start, counted)
    monkeypatch.setattr(compaction, "scan_log", counting_scan)
    result = st.compact(major=True)
    assert result["logs_compacted"] >= 3 and result["logs_removed"] == result["logs_compacted"]
    assert set(scanned) == {first}  # the others hold nothing live: not read
    # read up to LEDGERS[0]'s last entry: its 150 blocks (one per batch), not the rest
    assert scanned[first] == 150 < blocks_in_first[0]
    _reads_back(st, {LEDGERS[0]: early[LEDGERS[0]]})
