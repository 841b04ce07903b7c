"""Logs on ledgers (seed 003) with real bookie processes: writes read back
in order across segment rollovers, control entries never delivered, readers
from a DLSN or a txid and resumed exactly once, a tailing reader, writer
handover fencing the old writer, truncation and deletion."""

from __future__ import annotations

import threading

import pytest

import appliance
from appliance import DLSN
from appliance.errors import LogFencedError, LogTruncatedError, NoSuchLedgerError, NoSuchLogError
from tests.support.launch import wait_registered

SMALL_SEGMENTS = {"segment_records_max": 50, "flush_interval_us": 200,
                  "control_interval_ms": 2}


@pytest.fixture
def bk(make_cluster):
    cluster = make_cluster(3, quorums=(3, 3, 2), log=SMALL_SEGMENTS,
                           autorecovery={"enabled": False})
    with appliance.connect(str(cluster.config_path)) as client:
        wait_registered(client, 3)
        yield client


def _read_all(reader, expect: int, timeout_s: float = 30.0) -> list:
    out: list = []
    while len(out) < expect:
        got = reader.read(max_records=1000, timeout_s=timeout_s)
        assert got, f"stalled after {len(out)} of {expect} records"
        out += got
    return out


def test_records_read_back_in_order_across_segments_and_resume_exactly_once(bk):
    log = bk.log("orders")
    with log.writer() as w:
        futures = []
        for i in range(180):  # entries of 10 records: segments roll at entry bounds
            futures.append(w.write_async(b"r%d" % i))
            if i % 10 == 9:
                w.flush()
        positions = [f.result(timeout=30) for f in futures]
        last = w.write(b"tail", txid=1000)
    assert positions == sorted(positions) and len(set(positions)) == 180
    md = log.metadata()
    assert [s.state for s in md.segments] == ["COMPLETED"] * len(md.segments)
    assert len(md.segments) >= 4  # 50 records per segment
    assert md.records == 181 and md.last_txid == 1000
    assert bk.list_logs() == ["orders"]

    with log.reader() as r:
        records = _read_all(r, 181)
    assert [rec.payload for rec in records] == [b"r%d" % i for i in range(180)] + [b"tail"]
    assert [rec.txid for rec in records] == list(range(1, 181)) + [1000]
    assert [rec.dlsn for rec in records] == positions + [last]

    # from a txid; from a DLSN; resumed after the last delivered: no gap, no repeat
    with log.reader(start_txid=120) as r:
        assert [rec.txid for rec in _read_all(r, 62)] == list(range(120, 181)) + [1000]
    with log.reader(start=positions[77]) as r:
        first = r.read(max_records=10, timeout_s=5)
    assert [rec.payload for rec in first] == [b"r%d" % i for i in range(77, 87)]
    with log.reader(start=first[-1].dlsn.next()) as r:
        rest = _read_all(r, 181 - 87)
    assert [rec.payload for rec in rest] == [b"r%d" % i for i in range(87, 180)] + [b"tail"]
    with log.reader(start=str(positions[5])) as r:  # the string form round-trips
        assert r.read(max_records=1, timeout_s=5)[0].dlsn == positions[5]


def test_txids_must_increase_and_bad_arguments_are_refused_before_sending(bk):
    with bk.log("t").writer() as w:
        w.write(b"a", txid=10)
        with pytest.raises(ValueError, match="does not increase"):
            w.write(b"b", txid=10)
        with pytest.raises(TypeError):
            w.write("text")
        with pytest.raises(ValueError, match="record limit"):
            w.write(b"x" * (w.record_bytes_max + 1))
        assert w.write(b"c") > DLSN.FIRST  # previous + 1 = 11
    with bk.log("t").reader() as r:
        assert [rec.txid for rec in _read_all(r, 2)] == [10, 11]
    with pytest.raises(NoSuchLogError):
        bk.log("nope").reader()
    with pytest.raises(ValueError):
        DLSN.parse("1/2")
    with pytest.raises(ValueError):
        bk.log("bad name")


def test_a_tailing_reader_sees_new_records_and_no_control_record(bk):
    log = bk.log("tail")
    w = log.writer()
    try:
        w.write(b"first")
        got: list = []
        reader = log.reader()

        def tail():
            while len(got) < 21:
                got.extend(reader.read(timeout_s=10))

        t = threading.Thread(target=tail)
        t.start()
        for i in range(20):
            w.write(b"n%d" % i)  # one at a time: each is seen only via the next entry
        t.join(timeout=60)  # or a control entry
        assert not t.is_alive()
        assert [rec.payload for rec in got] == [b"first"] + [b"n%d" % i for i in range(20)]
        assert w.stats["control_entries"] >= 1  # idle moments were bridged by control entries
        reader.close()
    finally:
        w.close()


def test_a_new_writer_fences_the_old_one_and_keeps_everything_it_acknowledged(bk):
    log = bk.log("handover")
    old = log.writer()
    acked = [old.write(b"old%d" % i) for i in range(30)]
    new = log.writer()  # takes over: recovers the old segment
    with pytest.raises(LogFencedError):
        old.write(b"too late")
    with pytest.raises(LogFencedError):
        old.write(b"still too late")  # and never succeeds again
    with pytest.raises(LogFencedError):
        old.close()
    more = [new.write(b"new%d" % i) for i in range(10)]
    new.close()
    assert min(more) > max(acked)
    with log.reader() as r:
        records = _read_all(r, 40)
    assert [rec.payload for rec in records] == \
        [b"old%d" % i for i in range(30)] + [b"new%d" % i for i in range(10)]
    assert [rec.txid for rec in records] == list(range(1, 41))


def test_truncate_drops_whole_segments_and_their_ledgers_and_delete_removes_the_log(bk):
    log = bk.log("trim")
    with log.writer() as w:
        positions = []
        for i in range(200):
            positions.append(w.write_async(b"%d" % i))
            if i % 10 == 9:
                w.flush()
    positions = [f.result() for f in positions]
    md = log.metadata()
    cut = positions[120]
    holding = md.segment(cut.seq)
    doomed = [s for s in md.segments if s.seq < cut.seq]
    assert doomed
    dropped = log.truncate(before=cut)
    assert dropped == [s.seq for s in doomed]
    for seg in doomed:
        with pytest.raises(NoSuchLedgerError):
            bk.ledger_metadata(seg.ledger_id)
    assert log.metadata().segment(holding.seq) is not None  # the segment holding it stays
    with pytest.raises(LogTruncatedError):
        log.reader(start=positions[0])
    with log.reader() as r:  # from the start: the first record kept
        records = _read_all(r, 200 - holding.first_txid + 1)
    assert records[0].txid == holding.first_txid and records[-1].payload == b"199"

    ledgers = [s.ledger_id for s in log.metadata().segments]
    bk.delete_log("trim")
    assert "trim" not in bk.list_logs()
    for ledger_id in ledgers:
        with pytest.raises(NoSuchLedgerError):
            bk.ledger_metadata(ledger_id)
    with pytest.raises(NoSuchLogError):
        log.reader()
