"""Logs on ledgers (seed 003) with real bookie processes: writes read back
in order across segment rollovers, control entries never delivered, readers
from a DLSN or a txid and resumed exactly once, a tailing reader, writer
handover fencing the old writer, truncation and deletion."""

from __future__ import annotations

import contextlib
import threading

import pytest

import appliance
from appliance import DLSN
from appliance.errors import (
    BKError,
    LogFencedError,
    LogTruncatedError,
    NoSuchLedgerError,
    NoSuchLogError,
)
from tests.support.launch import wait_for, wait_registered

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
    early = log.reader()  # from the start, nothing read yet when the truncation comes
    dropped = log.truncate(before=cut)
    assert dropped == [s.seq for s in doomed]
    with early:  # follows the truncation to the first record kept
        assert early.read(max_records=1, timeout_s=30.0)[0].txid == holding.first_txid
    for seg in doomed:
        with pytest.raises(NoSuchLedgerError):
            bk.ledger_metadata(seg.ledger_id)
    assert log.metadata().segment(holding.seq) is not None  # the segment holding it stays
    with pytest.raises(LogTruncatedError):
        log.reader(start=positions[0])
    with log.reader() as r:  # from the start: the first record kept
        records = _read_all(r, 200 - holding.first_txid + 1)
    assert records[0].txid == holding.first_txid and records[-1].payload == b"199"
    with log.reader(start=DLSN.FIRST) as r:  # before every record: the first kept, too
        assert r.read(max_records=1, timeout_s=30.0)[0].txid == holding.first_txid

    ledgers = [s.ledger_id for s in log.metadata().segments]
    bk.delete_log("trim")
    assert "trim" not in bk.list_logs()
    for ledger_id in ledgers:
        with pytest.raises(NoSuchLedgerError):
            bk.ledger_metadata(ledger_id)
    with pytest.raises(NoSuchLogError):
        log.reader()


def test_delete_log_with_a_wrong_password_leaves_the_log_and_its_writer_alone(bk):
    from appliance.errors import UnauthorizedError

    log = bk.log("guarded", password=b"pw")
    with log.writer() as w:
        w.write(b"before")
        with pytest.raises(UnauthorizedError, match="wrong password for log guarded"):
            bk.delete_log("guarded", password=b"wrong")
        w.write(b"after")  # still the owner: not fenced by the refused delete
    with log.reader() as r:
        assert [rec.payload for rec in _read_all(r, 2)] == [b"before", b"after"]
    bk.delete_log("guarded", password=b"pw")
    assert "guarded" not in bk.list_logs()


def test_bkctl_log_commands(make_cluster):
    import json
    import os
    import signal
    import subprocess
    import sys

    from tests.support.bkctl import REPO, bkctl

    cluster = make_cluster(3, quorums=(3, 3, 2), log=SMALL_SEGMENTS,
                           autorecovery={"enabled": False})
    config = cluster.config_path
    with appliance.connect(str(config)) as client:
        wait_registered(client, 3)
    lines = b"".join(b"line %d\n" % i for i in range(120))
    result = bkctl("log", "append", "events", "-", "--txid-from", "500", config=config,
                   input=lines)
    assert result.returncode == 0, result.stderr
    last = DLSN.parse(result.stdout.decode().strip())
    assert b"120 record(s)" in result.stderr

    result = bkctl("log", "list", "--json", config=config, text=True)
    assert json.loads(result.stdout) == ["events"]
    result = bkctl("log", "describe", "events", "--json", config=config, text=True)
    doc = json.loads(result.stdout)
    assert doc["records"] == 120 and doc["last_txid"] == 619
    assert doc["segments"][-1]["last_dlsn"] == str(last)

    result = bkctl("log", "read", "events", config=config)
    assert result.returncode == 0 and result.stdout == lines
    result = bkctl("log", "read", "events", "--from-txid", "610", "--json", config=config,
                   text=True)
    docs = [json.loads(line) for line in result.stdout.splitlines()]
    assert [d["txid"] for d in docs] == list(range(610, 620))
    assert docs[-1]["dlsn"] == str(last)

    # --follow tails: records appended later show up; Ctrl-C ends it cleanly
    follow = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "log", "read", "events", "--from", str(last),
         "--follow", "--config", str(config)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert follow.stdout.readline() == b"line 119\n"
        assert bkctl("log", "append", "events", "-", config=config,
                     input=b"later 1\nlater 2\n").returncode == 0
        assert follow.stdout.readline() == b"later 1\n"
        assert follow.stdout.readline() == b"later 2\n"
        follow.send_signal(signal.SIGINT)
        assert follow.wait(timeout=30) == 0
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.wait()

    # bad input: one clear line, non-zero exit
    result = bkctl("log", "read", "events", "--from", "1/x/0", config=config, text=True)
    assert result.returncode != 0 and "bad DLSN" in result.stderr
    result = bkctl("log", "read", "nope", config=config, text=True)
    assert result.returncode != 0 and "NoSuchLogError" in result.stderr

    result = bkctl("log", "truncate", "events", "--before", str(last), config=config, text=True)
    assert result.returncode == 0 and "segment(s) dropped" in result.stdout
    result = bkctl("log", "delete", "events", config=config, text=True)
    assert result.returncode == 0, result.stderr
    assert json.loads(bkctl("log", "list", "--json", config=config, text=True).stdout) == []


def test_read_handle_waits_for_the_lac_with_long_polls(bk):
    lh = bk.create_ledger(3, 3, 2)
    lh.add(b"zero")
    lh.add(b"one")  # carries LAC 0 to the bookies
    rh = bk.open_ledger(lh.id, recovery=False)
    assert rh.last_add_confirmed == 0
    assert rh.wait_for_lac(0, timeout_s=0.2) == 0  # nothing new: times out, LAC unchanged
    waited: list = []
    t = threading.Thread(target=lambda: waited.append(rh.wait_for_lac(0, timeout_s=30)))
    t.start()
    lh.add(b"two")  # carries LAC 1: the long polls answer
    t.join(timeout=60)
    assert waited == [1] and rh.read(1, 1)[0].payload == b"one"
    with pytest.raises(ValueError):
        rh.wait_for_lac(-2, timeout_s=1)
    rh.close()
    lh.close()


def test_two_writers_racing_to_open_exactly_one_owns_the_log(bk):
    """Ownership passes by epoch: of two writers opening at once, the one
    that took the log first is fenced once the other has (at its open, its
    write or its close); every write that returned a DLSN is in the log, once."""
    from concurrent.futures import ThreadPoolExecutor

    log = bk.log("race")
    acked: dict[bytes, DLSN] = {}
    fenced = 0
    for round_no in range(4):
        barrier = threading.Barrier(2)

        def open_and_write(tag, barrier=barrier):
            barrier.wait(timeout=30)
            try:
                w = log.writer()
            except LogFencedError:
                return "fenced", None
            try:
                return "wrote", w.write(tag)
            except LogFencedError:
                return "fenced", None
            finally:
                try:
                    w.close()
                except LogFencedError:
                    pass

        tags = [b"a%d" % round_no, b"b%d" % round_no]
        with ThreadPoolExecutor(2) as pool:
            results = list(pool.map(open_and_write, tags))
        assert any(r[0] == "wrote" for r in results), results
        fenced += sum(r[0] == "fenced" for r in results)
        acked.update((tag, pos) for tag, (what, pos) in zip(tags, results, strict=True)
                     if what == "wrote")
    md = log.metadata()
    assert md.epoch == 8 and md.in_progress is None  # 8 takeovers, every segment closed
    with log.reader() as r:
        records = r.read(max_records=100, timeout_s=5)
    got = {rec.payload: rec.dlsn for rec in records}
    assert len(got) == len(records)  # no record twice
    assert {tag: got.get(tag) for tag in acked} == acked


def test_write_many_async_gives_each_record_its_position_and_checks_first(bk):
    log = bk.log("many")
    with log.writer() as w:
        futures = w.write_many_async([b"m%d" % i for i in range(2500)])
        with pytest.raises(ValueError, match="strictly increase"):
            w.write_many_async([b"x", b"y"], txids=[5000, 5000])
        with pytest.raises(TypeError):
            w.write_many_async([b"x", "not bytes"])
        w.write_many_async([b"t1", b"t2"], txids=[9000, 9001])
        w.flush()
        positions = [f.result() for f in futures]
    assert positions == sorted(positions) and len(set(positions)) == 2500
    with log.reader() as r:
        records = _read_all(r, 2502)
    assert [rec.payload for rec in records] == [b"m%d" % i for i in range(2500)] + [b"t1", b"t2"]
    assert [rec.txid for rec in records][-3:] == [2500, 9000, 9001]
    assert [rec.dlsn for rec in records[:2500]] == positions


@contextlib.contextmanager
def _ten_record_segments(make_cluster, name: str, **log_options):
    """(cluster, the log ``name``): three bookies (E3/W3/A2, no
    autorecovery) and segments of 10 records."""
    cluster = make_cluster(3, quorums=(3, 3, 2), autorecovery={"enabled": False},
                           log={"segment_records_max": 10, **log_options})
    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 3)
        yield cluster, bk.log(name)


def test_flush_and_close_wait_for_the_rollover_they_start(make_cluster):
    # a record buffered when the segment is full rolls it over (on the roll's
    # thread) when flush() or close() sends it: both wait for that roll, so
    # the record is durable in the next segment when they return, and a
    # reader opened at once reads every segment (before, close() could mark
    # the segment completed while the roll still closed its ledger: the
    # reader failed, "segment 1 should end at entry 9, its ledger ends at 8")
    with _ten_record_segments(make_cluster, "full", flush_interval_us=60_000_000) as (_, log):
        with log.writer() as w:
            first = [w.write(b"a%d" % i) for i in range(10)]  # segment 1 is full
            flushed = w.write_async(b"flushed")  # buffered: no flush timer for a minute
            w.flush()
            assert flushed.result(timeout=0) == DLSN(2, 0, 0)
            second = [w.write(b"b%d" % i) for i in range(9)]  # segment 2 is full
            closed = w.write_async(b"closed")
        assert closed.result(timeout=0) == DLSN(3, 0, 0)
        assert {d.seq for d in first} == {1} and {d.seq for d in second} == {2}
        with log.reader() as r:
            records = _read_all(r, 21)
        assert [rec.payload for rec in records] == [b"a%d" % i for i in range(10)] + \
            [b"flushed"] + [b"b%d" % i for i in range(9)] + [b"closed"]
        assert [(s.seq, s.state) for s in log.metadata().live_segments] == \
            [(1, "COMPLETED"), (2, "COMPLETED"), (3, "COMPLETED")]


def test_a_tailing_reader_rides_out_bookies_it_cannot_reach(make_cluster):
    # two of the three bookies die while the log's second segment is in
    # progress: a read returns the first segment's records (read from the
    # third bookie), the next read says the bookies are out of reach, and a
    # read waiting through their restart goes on from its position (before:
    # opening the segment raised and lost the records read before it in that
    # read, and the reader was left unusable)
    with _ten_record_segments(make_cluster, "outage", control_interval_ms=2) as (cluster, log):
        with log.writer() as w:
            first = [w.write(b"a%d" % i) for i in range(10)]
            controls = w.stats["control_entries"]
            second = w.write(b"b0")  # segment 2, in progress
            # its control entry tells the bookies the LAC: b0 is readable
            wait_for(lambda: w.stats["control_entries"] > controls, 30,
                     what="the control entry after b0")
            w.flush()  # returns once the last entry sent (that control entry) is acknowledged
            for victim in ("bookie-2", "bookie-3"):
                cluster.kill(victim)
            with log.reader(via_service=False) as r:
                got = r.read(max_records=100, timeout_s=0)
                assert [rec.dlsn for rec in got] == first
                with pytest.raises(BKError) as outage:
                    r.read(timeout_s=0)
                assert outage.value.retryable, outage.value
                later: list = []
                waiting = threading.Thread(target=lambda: later.extend(r.read(timeout_s=120)))
                waiting.start()
                try:
                    for victim in ("bookie-2", "bookie-3"):
                        cluster.start_bookie(victim)
                finally:
                    waiting.join(timeout=150)
                assert not waiting.is_alive()
                assert [(rec.dlsn, rec.payload) for rec in later] == [(second, b"b0")]
