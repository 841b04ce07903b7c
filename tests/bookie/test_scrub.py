"""The bookie's scrub against a real storage and a scripted metadata store:
a closed ledger missing part of this bookie's share goes into limbo and the
repair loop is woken; a whole one is looked at once; the cost of a pass."""

from __future__ import annotations

import pytest

from appliance.bookie.scrub import Scrubber
from appliance.errors import MetadataUnavailableError, NoSuchLedgerError
from appliance.protocol.metadata import LedgerMetadata
from storage import LedgerStorage
from tests.storage.conftest import small_options


class FakeLedgers:
    """Ledger metadata by id; counts reads; ``fail`` makes every call fail."""

    def __init__(self):
        self.mds: dict[int, LedgerMetadata] = {}
        self.reads = 0
        self.fail = False

    def list_ledgers(self):
        if self.fail:
            raise MetadataUnavailableError("metadata store unreachable")
        return sorted(self.mds)

    def read_ledger(self, ledger_id):
        self.reads += 1
        if self.fail:
            raise MetadataUnavailableError("metadata store unreachable")
        if ledger_id not in self.mds:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist")
        return self.mds[ledger_id], 1


def md(ledger_id, ensemble="bxy", last=None, w=3) -> LedgerMetadata:
    m = LedgerMetadata(ledger_id=ledger_id, ensemble_size=3, write_quorum=w, ack_quorum=2,
                       ensembles=((0, tuple(ensemble)),))
    return m if last is None else m.to_closed(last)


@pytest.fixture
def storage(tmp_path):
    j, d = tmp_path / "j", tmp_path / "d"
    LedgerStorage.format("b", j, d, small_options())
    st = LedgerStorage.open("b", j, d, small_options())
    yield st
    st.abort()


def put(st, ledger_id, entry_ids):
    ids = list(entry_ids)
    st.wait_durable(st.add_entries([ledger_id] * len(ids), ids, [b"x" * 50] * len(ids)), 10)


def scrubber(st, ledgers, per_pass=100):
    woken = []
    s = Scrubber("b", st, ledgers, interval_ms=1000, ledgers_per_pass=per_pass,
                 wake_repair=lambda: woken.append(1), clock=iter(range(10**6)).__next__)
    return s, woken


def test_present_count_is_an_index_lookup_over_runs(storage):
    put(storage, 1, [0, 1, 2, 5, 9000])
    assert storage.present_count(1, [(0, 9)]) == 4
    assert storage.present_count(1, [(1, 1), (3, 5), (8999, 9001)]) == 3
    assert storage.present_count(2, [(0, 9)]) == 0


def test_a_short_closed_ledger_goes_into_limbo_and_wakes_the_repair(storage):
    ledgers = FakeLedgers()
    ledgers.mds = {1: md(1, last=99), 2: md(2, last=99), 3: md(3), 4: md(4, "xyz", last=9)}
    put(storage, 1, range(100))
    put(storage, 2, [e for e in range(100) if e not in (40, 41, 77)])
    put(storage, 3, range(10))
    s, woken = scrubber(storage, ledgers)
    assert s.run_once() == [2]
    assert storage.is_limbo(2) and not storage.is_limbo(1) and woken == [1]
    assert s.stats["entries_missing"] == 3 and s.stats["ledgers_whole"] == 2  # 1, and 4
    # a ledger this bookie never got an entry of is short too (limbo creates it)
    ledgers.mds[5] = md(5, last=4)
    assert s.run_once() == [5] and storage.is_limbo(5)


def test_whole_ledgers_are_looked_at_once_open_and_busy_ones_again(storage):
    ledgers = FakeLedgers()
    ledgers.mds = {1: md(1, last=9), 2: md(2)}
    put(storage, 1, range(10))
    put(storage, 2, range(5))
    s, _ = scrubber(storage, ledgers)
    s.run_once()
    assert ledgers.reads == 2
    s.run_once()
    assert ledgers.reads == 3  # only the open one
    ledgers.mds[2] = md(2, last=9)  # closed short: limbo, then busy until repaired
    assert s.run_once() == [2]
    assert s.run_once() == [] and storage.is_limbo(2)
    put(storage, 2, range(5, 10))
    storage.wait_durable(storage.clear_limbo(2))  # what the repair loop does
    s.run_once()
    before = ledgers.reads
    s.run_once()
    assert ledgers.reads == before  # every ledger whole: a pass reads no metadata


def test_a_pass_is_bounded_and_a_failed_look_is_retried(storage):
    ledgers = FakeLedgers()
    ledgers.mds = {i: md(i, last=-1) for i in range(10)}
    s, _ = scrubber(storage, ledgers, per_pass=4)
    s.run_once()
    assert ledgers.reads == 4 and s.stats["pending"] == 6
    ledgers.fail = True
    with pytest.raises(MetadataUnavailableError):
        s.run_once()  # the listing failed: nothing changed
    assert s.stats["pending"] == 6
    ledgers.fail = False
    s.run_once()
    s.run_once()
    assert s.stats["pending"] == 0 and s.stats["ledgers_whole"] == 10


def test_a_read_only_bookie_skips_its_passes(storage):
    ledgers = FakeLedgers()
    ledgers.mds = {1: md(1, last=9)}
    s = Scrubber("b", storage, ledgers, interval_ms=1000, ledgers_per_pass=10,
                 wake_repair=lambda: None, writable=lambda: False)
    assert s.run_once() == [] and ledgers.reads == 0 and not storage.is_limbo(1)


def test_a_failed_metadata_read_changes_nothing_and_is_looked_at_again(storage):
    ledgers = FakeLedgers()
    ledgers.mds = {1: md(1, last=9)}
    s, woken = scrubber(storage, ledgers)
    failing = ledgers.read_ledger

    def read_fails(ledger_id):
        raise MetadataUnavailableError("metadata store unreachable")

    ledgers.read_ledger = read_fails
    assert s.run_once() == [] and not storage.is_limbo(1) and s.stats["pending"] == 1
    ledgers.read_ledger = failing
    assert s.run_once() == [1] and storage.is_limbo(1) and woken == [1]


def test_interval_zero_turns_the_scrub_off(storage):
    s = Scrubber("b", storage, FakeLedgers(), interval_ms=0, ledgers_per_pass=10,
                 wake_repair=lambda: None)
    s.start()
    assert s._thread is None
    s.stop()
