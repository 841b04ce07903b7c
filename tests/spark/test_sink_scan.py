"""``sink_scan.stored_rows`` over a fake log (no Spark, no bookies): what a
replayed micro-batch skips - its producer's run of rows from the recorded
position, among other producers' rows; a run whose start was truncated away;
a gap is refused; a cold segment without its ledger is skipped."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from appliance.protocol.invariant import InvariantViolation
from appliance.protocol.log_entry import EntryHeader, pack_entry
from appliance.protocol.logs import COMPLETED, DLSN, IN_PROGRESS
from appliance.spark.sink_scan import stored_rows

MINE, OTHER = b"m" * 16, b"o" * 16


def entry(tags) -> SimpleNamespace:
    n = len(tags)
    head = EntryHeader(False, n, n, 1, n, 0, n - 1)
    return SimpleNamespace(payload=pack_entry(head, list(range(1, n + 1)),
                                              [b"row"] * n, tags))


class FakeClient:
    """Segments as lists of entries (each a list of (producer, seq) tags)."""

    def __init__(self, segments, truncated_before=DLSN.FIRST, deleted=()):
        self.entries = {seq: [entry(tags) for tags in seg] for seq, seg in segments.items()}
        live = [SimpleNamespace(seq=seq, ledger_id=seq, last_entry_id=len(self.entries[seq]) - 1,
                                state=COMPLETED if seq != max(segments) else IN_PROGRESS,
                                ledger_deleted=seq in deleted) for seq in sorted(segments)]
        md = SimpleNamespace(live_segments=live, truncated_before=truncated_before)
        self.logs = SimpleNamespace(read_log=lambda name: (md, 1))

    def open_ledger(self, ledger_id, password, recovery):
        entries = self.entries[ledger_id]
        return SimpleNamespace(read_lac=lambda: len(entries) - 1, close=lambda: None,
                               read=lambda a, b: entries[a:b + 1])


def test_the_producers_run_from_the_recorded_position_among_other_rows():
    log = FakeClient({1: [[(MINE, 1), (MINE, 2)], [(MINE, 3), (OTHER, 1)]],
                      2: [[(OTHER, 2), (MINE, 4)], [(MINE, 5)]]})
    assert stored_rows(log, "l", MINE, 3, DLSN(1, 1, 0)) == 3  # rows 3, 4, 5
    assert stored_rows(log, "l", MINE, 6, DLSN(2, 2, 0)) == 0  # nothing after the end
    assert stored_rows(log, "l", OTHER, 3, DLSN(1, 1, 0)) == 0


def test_a_run_whose_start_was_truncated_counts_from_the_batch_start():
    log = FakeClient({2: [[(MINE, 6), (MINE, 7)]]}, truncated_before=DLSN(2, 0, 0))
    assert stored_rows(log, "l", MINE, 4, DLSN(1, 3, 0)) == 4  # 4, 5 stored then truncated


def test_a_gap_or_a_missing_start_without_truncation_is_refused():
    gap = FakeClient({1: [[(MINE, 1), (MINE, 3)]]})
    with pytest.raises(InvariantViolation):
        stored_rows(gap, "l", MINE, 1, DLSN(1, 0, 0))
    late = FakeClient({1: [[(MINE, 2), (MINE, 3)]]})
    with pytest.raises(InvariantViolation):
        stored_rows(late, "l", MINE, 1, DLSN(1, 0, 0))


def test_a_cold_segment_without_its_ledger_is_skipped_with_a_warning(caplog):
    log = FakeClient({1: [[(MINE, 1)]], 2: [[(MINE, 2)]]}, deleted={1})
    assert stored_rows(log, "l", MINE, 1, DLSN(1, 0, 0)) == 2  # row 2 found: 1 was before it
    assert "segment 1 moved to cold storage and its ledger is gone" in caplog.text
