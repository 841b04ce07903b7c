"""The pure parts of the streaming source (no Spark session, no appliance):
its options and offsets, the driver's view of a log (positions, counts and
cuts from entry headers) over a fake log, and the clipping of entries to a
batch's DLSN bounds."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

from appliance.client.calls import Entry
from appliance.protocol.log_entry import EntryHeader, pack_entry
from appliance.protocol.logs import COMPLETED, DLSN, LogMetadata, Segment
from appliance.spark.logs import _slots
from appliance.spark.stream_options import offset_json, offset_position, parse_stream_options
from appliance.spark.stream_view import LogView

# segment 1 (COMPLETED): records per entry; 0 is a control entry
SEG1 = [3, 0, 2, 5]
# segment 2 (IN_PROGRESS): entries up to the LAC (2) are readable; 3 is not yet
SEG2 = [4, 1, 0, 6]
LAC2 = 2


def _entries(seq: int, counts: list[int], txid0: int):
    """Packed entries and [(dlsn, txid, payload)] of their records."""
    out, records, txid, total, last = [], [], txid0, 0, (-1, 0)
    for entry_id, count in enumerate(counts):
        txids = [txid + 10 * k for k in range(count)]
        payloads = [b"r%d-%d-%d" % (seq, entry_id, k) * (k + 1) for k in range(count)]
        txid += 10 * count
        total += count
        if count:
            last = (entry_id, count - 1)
        records += [(DLSN(seq, entry_id, k), t, p)
                    for k, (t, p) in enumerate(zip(txids, payloads, strict=True))]
        header = EntryHeader(count == 0, count, total, txid0, txid - 10, *last)
        out.append(pack_entry(header, txids, payloads))
    return out, records


ENTRIES1, RECORDS1 = _entries(1, SEG1, 10)
ENTRIES2, RECORDS2 = _entries(2, SEG2, 1000)
READABLE = RECORDS1 + [r for r in RECORDS2 if r[0].entry_id <= LAC2]


class FakeHandle:
    def __init__(self, entries, lac, reads):
        self.entries, self.lac, self.reads = entries, lac, reads

    def read(self, first, last):
        assert last <= self.lac
        self.reads.append((first, last))
        return [Entry(0, i, self.entries[i]) for i in range(first, last + 1)]

    def read_lac(self):
        return self.lac

    def learn_lac(self, entry_id):
        self.lac = max(self.lac, entry_id)
        return self.lac

    def close(self):
        pass


@pytest.fixture
def view():
    md = LogMetadata(name="orders", segments=(
        Segment(1, 101, COMPLETED, records=10, first_txid=10, last_txid=100,
                last_dlsn=DLSN(1, 3, 4), last_entry_id=3),
        Segment(2, 102)), next_seq=3)
    reads: list = []
    handles = {101: (ENTRIES1, 3), 102: (ENTRIES2, LAC2)}
    client = SimpleNamespace(
        logs=SimpleNamespace(read_log=lambda name: (md, 1)),
        ledger_metadata=lambda ledger_id: SimpleNamespace(password_hash=None),  # no password
        open_ledger=lambda ledger_id, password, recovery: FakeHandle(*handles[ledger_id], reads))
    v = LogView(client, "orders", b"", confirmed_end=lambda client, name: None)
    v.refresh()
    v.reads = reads
    return v


def test_the_log_end_is_after_the_last_readable_record(view):
    assert view.data_end() == READABLE[-1][0].next() == DLSN(2, 1, 1)


def test_the_log_end_reaches_what_the_owner_says_is_acknowledged():
    """Read your writes: the in-progress segment's entry 3 is past the
    bookies' LAC (2), but its owner says it is acknowledged; an answer about
    another segment changes nothing."""
    md = LogMetadata(name="orders", segments=(
        Segment(1, 101, COMPLETED, records=10, first_txid=10, last_txid=100,
                last_dlsn=DLSN(1, 3, 4), last_entry_id=3),
        Segment(2, 102)), next_seq=3)
    handles = {101: (ENTRIES1, 3), 102: (ENTRIES2, LAC2)}
    view = _fake_view(md, handles, confirmed=(2, 3))
    view.refresh()
    assert view.data_end() == RECORDS2[-1][0].next() == DLSN(2, 3, 6)
    view = _fake_view(md, {101: (ENTRIES1, 3), 102: (ENTRIES2, LAC2)}, confirmed=(1, 3))
    view.refresh()
    assert view.data_end() == DLSN(2, 1, 1)


def test_counts_and_cuts_by_records_from_every_position(view):
    positions = [DLSN(1, 0, 0)] + [r[0].next() for r in READABLE]
    for i, start in enumerate(positions):
        assert view.count(start, view.data_end()) == len(READABLE) - i
        for n in range(1, len(READABLE) - i + 1):
            assert view.after_records(start, n) == READABLE[i + n - 1][0].next()
        assert view.after_records(start, len(READABLE) - i + 1) is None


def test_headers_are_read_once(view):
    view.after_records(DLSN(1, 0, 0), 12)
    before = len(view.reads)
    for _ in range(3):
        view.refresh()
        view.data_end()
        view.after_records(DLSN(1, 0, 0), 12)
    assert len(view.reads) == before


def test_cuts_by_bytes_take_whole_entries_and_at_least_one_record(view):
    start, end = DLSN(1, 0, 0), view.data_end()
    sizes = [len(p) for _, _, p in READABLE]
    assert view.after_bytes(start, end, 10**9) == end
    assert view.after_bytes(start, end, 1) == DLSN(1, 0, 3)  # entry 0 whole, over budget
    first_two = sum(sizes[:5])  # entries 0 and 2 of segment 1 (1 is a control entry)
    assert view.after_bytes(start, end, first_two) == DLSN(1, 2, 2)
    assert view.after_bytes(DLSN(1, 2, 1), end, 1) == DLSN(1, 2, 2)  # from inside an entry


def test_txid_positions(view):
    assert view.txid_position(0) == DLSN(1, 0, 0)
    for position, txid, _ in READABLE:
        assert view.txid_position(txid) == position
        assert view.txid_position(txid - 5) == position  # no such txid: the next one
    assert view.txid_position(READABLE[-1][1] + 1) is None


@pytest.mark.parametrize("bounds", [(DLSN(1, 0, 1), DLSN(1, 3, 2)), (DLSN(1, 2, 0), DLSN(2, 0, 0)),
                                    (DLSN(1, 3, 4), DLSN(2, 1, 1))])
def test_entries_clip_to_a_batchs_bounds(bounds):
    start, end = bounds
    kept = []
    for (seq, entry_id), group in itertools.groupby(READABLE, key=lambda r: r[0][:2]):
        group = list(group)
        first, stop = _slots(bounds, seq, entry_id, len(group))
        kept += group[first:stop]
    assert kept == [r for r in READABLE if start <= r[0] < end]


def test_stream_options_and_offsets():
    o = parse_stream_options({"config": "x.toml", "log": "orders"})
    assert (o.starting, o.max_records, o.max_bytes, o.fail_on_data_loss) == \
        ("earliest", None, None, True)
    o = parse_stream_options({"metadata": "sqlite:///m", "LOG": "orders",
                              "startingPosition": "3/12/0", "maxRecordsPerTrigger": "400",
                              "maxBytesPerTrigger": "1000", "failOnDataLoss": "FALSE"})
    assert (o.starting, o.max_records, o.max_bytes, o.fail_on_data_loss) == \
        (DLSN(3, 12, 0), 400, 1000, False)
    assert parse_stream_options({"config": "x", "log": "a",
                                 "startingPosition": "txid:-5"}).starting == -5
    assert parse_stream_options({"config": "x", "log": "a",
                                 "startingPosition": "Latest"}).starting == "latest"
    for bad, match in (({"startingPosition": "3/x"}, "startingPosition"),
                       ({"startingPosition": "txid:x"}, "txid:N"),
                       ({"maxRecordsPerTrigger": "0"}, "maxRecordsPerTrigger"),
                       ({"failOnDataLoss": "1"}, "failOnDataLoss"),
                       ({"log": None}, "set option log")):
        raw = {"config": "x", "log": "a", **bad}
        with pytest.raises(ValueError, match=match):
            parse_stream_options({k: v for k, v in raw.items() if v is not None})
    doc = offset_json("orders", DLSN(3, 12, 0))
    assert doc == {"log": "orders", "dlsn": "3/12/0"}
    assert offset_position("orders", doc) == DLSN(3, 12, 0)
    with pytest.raises(ValueError, match="offsets of log 'orders'.*new checkpointLocation"):
        offset_position("other", doc)
    with pytest.raises(ValueError, match="not one of ours"):
        offset_position("orders", {"index": 3})


def _reader(view, **options):
    from appliance.spark.stream import BookKeeperStreamReader

    reader = BookKeeperStreamReader({"config": "x.toml", "log": "orders", **options})
    reader._view = view  # the fake log instead of a connection
    return reader


def _fake_view(md, handles, confirmed=None):
    client = SimpleNamespace(
        logs=SimpleNamespace(read_log=lambda name: (md, 1)),
        ledger_metadata=lambda ledger_id: SimpleNamespace(password_hash=None),  # no password
        open_ledger=lambda ledger_id, password, recovery: FakeHandle(*handles[ledger_id], []))
    return LogView(client, md.name, b"", confirmed_end=lambda client, name: confirmed)


def test_starting_positions_of_a_log_with_no_record_are_its_first_segment():
    md = LogMetadata(name="orders", segments=(Segment(4, 104),), next_seq=5)
    view = _fake_view(md, {104: ([], -1)})
    for starting in ("earliest", "latest", "txid:7"):
        assert _reader(view, startingPosition=starting).initialOffset() == \
            {"log": "orders", "dlsn": "4/0/0"}


def test_initial_and_latest_offsets(view):
    def initial(starting):
        return _reader(view, startingPosition=starting).initialOffset()["dlsn"]

    assert initial("earliest") == "1/0/0"
    assert initial("latest") == "2/1/1"
    assert initial(f"txid:{READABLE[-1][1] + 1}") == "2/1/1"  # no such record yet: the end
    assert initial(f"txid:{READABLE[5][1]}") == str(READABLE[5][0])
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    reader = _reader(view, maxRecordsPerTrigger="4")
    assert reader.getDefaultReadLimit() == ReadMaxRows(4)
    start = {"log": "orders", "dlsn": "1/0/0"}
    assert reader.latestOffset(start, ReadMaxRows(4))["dlsn"] == str(READABLE[3][0].next())
    assert reader.reportLatestOffset() == {"log": "orders", "dlsn": "2/1/1",
                                           "recordsBehind": len(READABLE) - 4}
    assert reader.latestOffset(start, ReadAllAvailable())["dlsn"] == "2/1/1"
    end = {"log": "orders", "dlsn": "2/1/1"}
    assert reader.latestOffset(end, ReadMaxRows(4)) == end  # nothing new: the same offset
    assert reader.reportLatestOffset()["recordsBehind"] == 0
    reader._target = READABLE[2][0].next()  # availableNow: not past its target
    assert reader.latestOffset(start, ReadMaxRows(4))["dlsn"] == str(READABLE[2][0].next())


def test_truncated_positions_fail_or_are_skipped():
    from appliance.errors import LogTruncatedError

    md = LogMetadata(name="orders", segments=(
        Segment(1, 101, "TRUNCATED"),
        Segment(2, 102)), next_seq=3, truncated_before=DLSN(2, 0, 0))
    view = _fake_view(md, {102: (ENTRIES2, LAC2)})
    lost = "records from 1/2/0 to 2/0/0 .*failOnDataLoss is true"
    with pytest.raises(LogTruncatedError, match=lost):
        _reader(view).latestOffset({"log": "orders", "dlsn": "1/2/0"}, None)
    assert _reader(view, failOnDataLoss="false").latestOffset(
        {"log": "orders", "dlsn": "1/2/0"}, None) == {"log": "orders", "dlsn": "2/1/1"}
    assert _reader(view, startingPosition="earliest").initialOffset()["dlsn"] == "2/0/0"


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_segment_truncated_while_a_task_reads_it(monkeypatch, fail_on_data_loss):
    """A task whose segment read fails and that finds the segment truncated
    since planning: fails naming the DLSN, or skips that segment only."""
    from appliance.errors import LogTruncatedError, NoSuchEntryError
    from appliance.spark import stream
    from appliance.spark.planner import LedgerRange

    def read(part, password):
        (r,) = part.ranges
        if r.metadata.ledger_id == 101:
            yield "row of 101"
            raise NoSuchEntryError("ledger 101 entry 3: no replica served it")
        yield "row of 102"

    monkeypatch.setattr(stream, "read_log_partition", read)
    monkeypatch.setattr(stream, "_truncated", lambda options, seq: seq == 1)
    ranges = tuple(LedgerRange(SimpleNamespace(ledger_id=i), 0, 3) for i in (101, 102))
    part = stream.BookKeeperPartition(0, ranges, {}, None, {101: 1, 102: 2})
    part.bounds = (DLSN(1, 2, 1), DLSN(2, 3, 0))
    options = parse_stream_options({"config": "x", "log": "orders",
                                    "failOnDataLoss": str(fail_on_data_loss)})
    rows = stream.read_stream_partition(part, options)
    if fail_on_data_loss:
        assert next(rows) == "row of 101"
        with pytest.raises(LogTruncatedError, match="records from 1/2/1 on .*truncated"):
            next(rows)
    else:
        assert list(rows) == ["row of 101", "row of 102"]
    monkeypatch.setattr(stream, "_truncated", lambda options, seq: False)
    with pytest.raises(NoSuchEntryError):  # not truncated: the read's own error
        list(stream.read_stream_partition(part, options))
