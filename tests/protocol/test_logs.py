"""The log layer's pure rules: positions, metadata transitions (ownership
epochs fence older writers), truncation, rollover, the entry format."""

from __future__ import annotations

import pytest

from appliance.errors import (
    CorruptMetadataError,
    CorruptRecordError,
    LogFencedError,
    LogTruncatedError,
)
from appliance.protocol.log_entry import EntryHeader, pack_entry, read_header, unpack_entry
from appliance.protocol.logs import (
    COMPLETED,
    DLSN,
    IN_PROGRESS,
    NO_TXID,
    TRUNCATED,
    LogMetadata,
    RolloverPolicy,
    SegmentEnd,
    check_log_name,
    complete_segment,
    drop_truncated,
    new_log,
    start_segment,
    take_ownership,
    truncate,
)


def test_dlsn_orders_parses_and_round_trips():
    a, b, c = DLSN(1, 0, 5), DLSN(1, 1, 0), DLSN(2, 0, 0)
    assert DLSN.FIRST < a < b < c and sorted([c, a, b]) == [a, b, c]
    assert DLSN.parse(str(b)) == b and str(b) == "1/1/0" and hash(b) == hash(DLSN(1, 1, 0))
    assert a.next() == DLSN(1, 0, 6) and a < a.next() < b
    for bad in ("1/2", "1/2/3/4", "a/b/c", "-1/0/0", "", "1/2/ 3x", None, 7):
        with pytest.raises(ValueError):
            DLSN.parse(bad)
    with pytest.raises(ValueError):
        DLSN(0, -1, 0)


def test_log_names():
    assert check_log_name("orders.v2_eu-1") == "orders.v2_eu-1"
    for bad in ("", ".hidden", "-x", "a/b", "a b", "x" * 201):
        with pytest.raises(ValueError):
            check_log_name(bad)
    with pytest.raises(TypeError):
        check_log_name(3)


def _owned(epochs: int = 1) -> LogMetadata:
    md = new_log("orders", ctime_ms=1)
    for i in range(epochs):
        md = take_ownership(md, f"w{i + 1}")
    return md


def test_a_newer_owner_fences_every_change_of_the_older_one():
    md = start_segment(_owned(), 1, ledger_id=10, ctime_ms=2)
    assert md.in_progress.seq == 1 and md.in_progress.ledger_id == 10
    taken = take_ownership(md, "w2")
    assert taken.epoch == 2 and taken.owner == "w2"
    with pytest.raises(LogFencedError):
        complete_segment(taken, 1, 1, SegmentEnd(records=3, first_txid=1, last_txid=3,
                                                 last_dlsn=DLSN(1, 0, 2), last_entry_id=0))
    with pytest.raises(LogFencedError):
        start_segment(taken, 1, ledger_id=11, ctime_ms=3)
    # the new owner completes the old segment (recovered) and starts its own
    done = complete_segment(taken, 2, 1, SegmentEnd(3, 1, 3, DLSN(1, 0, 2), 0))
    assert done.segment(1).state == COMPLETED and done.last_txid == 3 and done.records == 3
    md = start_segment(done, 2, ledger_id=11, ctime_ms=4)
    assert [s.seq for s in md.segments] == [1, 2] and md.in_progress.epoch == 2


def test_one_segment_in_progress_at_a_time_and_txids_keep_increasing():
    md = start_segment(_owned(), 1, 10, 0)
    with pytest.raises(ValueError, match="still in progress"):
        start_segment(md, 1, 11, 0)
    md = complete_segment(md, 1, 1, SegmentEnd(2, 5, 6, DLSN(1, 0, 1), 0))
    md = start_segment(md, 1, 11, 0)
    with pytest.raises(ValueError, match="txid"):
        complete_segment(md, 1, 2, SegmentEnd(1, 6, 6, DLSN(2, 0, 0), 0))
    with pytest.raises(ValueError, match="already holds"):
        start_segment(complete_segment(md, 1, 2, SegmentEnd()), 1, 10, 0)
    # an empty segment completes without touching the last txid
    empty = complete_segment(md, 1, 2, SegmentEnd())
    assert empty.last_txid == 6 and empty.segment(2).records == 0


def _three_segments() -> LogMetadata:
    md = _owned()
    for seq, (ledger, first, last) in enumerate([(10, 1, 10), (11, 11, 20), (12, 21, 30)], 1):
        md = start_segment(md, 1, ledger, 0)
        md = complete_segment(md, 1, seq, SegmentEnd(10, first, last, DLSN(seq, 0, 9), 0))
    return start_segment(md, 1, 13, 0)


def test_truncate_drops_whole_completed_segments_before_the_point_only():
    md = _three_segments()
    cut = truncate(md, DLSN(3, 0, 4))
    assert [s.state for s in cut.segments] == [TRUNCATED, TRUNCATED, COMPLETED, IN_PROGRESS]
    assert cut.truncated_before == DLSN(3, 0, 0)
    with pytest.raises(LogTruncatedError):
        cut.check_readable(DLSN(2, 0, 9))
    cut.check_readable(DLSN(3, 0, 0))
    cut.check_readable(DLSN.FIRST)  # before every record: never inside the dropped range
    assert truncate(cut, DLSN(1, 0, 0)) == cut  # never backwards
    # past the in-progress segment: it stays
    everything = truncate(md, DLSN(9, 0, 0))
    assert [s.state for s in everything.live_segments] == [IN_PROGRESS]
    dropped = drop_truncated(cut, {1, 2})
    assert [s.seq for s in dropped.segments] == [3, 4]
    assert LogMetadata.from_bytes(dropped.to_bytes()) == dropped


def test_metadata_round_trips_and_damage_is_refused():
    md = _three_segments()
    assert LogMetadata.from_bytes(md.to_bytes()) == md
    for bad in (b"{", b"[]", md.to_bytes().replace(b'"format":1', b'"format":9'),
                md.to_bytes().replace(b'"COMPLETED"', b'"DONE"')):
        with pytest.raises(CorruptMetadataError):
            LogMetadata.from_bytes(bad, where="/logs/orders")


def test_rollover_policy():
    p = RolloverPolicy(bytes_max=100, records_max=10, age_ms=1000)
    assert not p.due(99, 9, 999)
    assert p.due(100, 0, 0) and p.due(0, 10, 0) and p.due(1, 1, 1000)
    assert not p.due(0, 0, 5000)  # an empty segment never rolls for age
    assert not RolloverPolicy(0, 0, 0).due(10**12, 10**9, 10**9)


def test_entry_format_round_trips_and_rejects_damage():
    header = EntryHeader(False, 3, 13, 1, 9, 4, 2)
    data = pack_entry(header, [7, 8, 9], [b"a", b"", b"ccc"])
    got, txids, payloads = unpack_entry(data)
    assert got == header and txids == [7, 8, 9] and payloads == [b"a", b"", b"ccc"]
    control = pack_entry(EntryHeader(True, 0, 13, 1, 9, 4, 2), [], [])
    assert read_header(control).control and unpack_entry(control)[1] == []
    with pytest.raises(ValueError):
        pack_entry(EntryHeader(True, 1, 1, 1, 1, 0, 0), [1], [b"x"])
    for damaged in (data[:-1], data + b"x", data[:10], b"\x09" + data[1:]):
        with pytest.raises(CorruptRecordError):
            unpack_entry(damaged)
    assert NO_TXID < -(2**62)
