"""Cold storage with real bookie processes: sealed segments moved by
``bkctl log offload`` while a writer keeps writing, read back through the
API and the CLI exactly once with the same DLSNs and txids; the moved
ledgers deleted after ``delete_after_ms``; truncation and deletion remove
the files; a corrupted file is refused naming its segment; a mover killed
(SIGKILL) at each step loses nothing, duplicates nothing and leaves no
orphan after the next pass."""

from __future__ import annotations

import base64
import json
import os

import pyarrow.parquet as pq
import pytest

import appliance
from appliance.cold.segment_file import CorruptColdSegmentError
from appliance.errors import NoSuchLedgerError
from tests.cold.offload_proc import offload_killed_at
from tests.support.bkctl import bkctl
from tests.support.launch import wait_for, wait_registered
from tests.support.logs import read_now

SMALL_SEGMENTS = {"segment_records_max": 50, "flush_interval_us": 200,
                  "control_interval_ms": 2}


def _cluster(make_cluster, **cold):
    section = {"uri": "cold", "offload_after_ms": 0, "delete_after_ms": 0,
               "orphan_grace_ms": 0, **cold}
    return make_cluster(3, quorums=(3, 3, 2), log=SMALL_SEGMENTS,
                        autorecovery={"enabled": False}, cold_storage=section)


@pytest.fixture
def cluster(make_cluster):
    return _cluster(make_cluster)


def _write(log, n: int, start: int = 0) -> list:
    with log.writer() as w:
        futures = []
        for i in range(start, start + n):  # entries of 10: segments roll at entry bounds
            futures.append(w.write_async(b"r%06d" % i))
            if i % 10 == 9:
                w.flush()
        w.flush()
        return [f.result(timeout=60) for f in futures]


def _offload(config, name: str, *args: str, env=None) -> dict:
    done = bkctl("log", "offload", name, "--json", *args, config=config, text=True, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_offloaded_segments_read_back_once_through_api_and_cli(cluster):
    config = cluster.config_path
    with appliance.connect(str(config)) as bk:
        wait_registered(bk, 3)
        log = bk.log("orders")
        positions = _write(log, 260)
        hot = read_now(log)
        assert [r.dlsn for r in hot] == positions
        w = log.writer()  # a writer keeps writing the in-progress segment meanwhile
        w.write(b"live-0")
        moved = _offload(config, "orders")
        assert moved["moved"] >= 5
        md = log.metadata()
        tiers = [s.tier for s in md.live_segments]
        assert tiers.count("cold") == moved["moved"] and tiers[-1] == "hot"
        later = [w.write(b"live-%d" % i) for i in range(1, 4)]
        w.close()
        records = read_now(log)
        assert [(r.dlsn, r.txid, r.payload) for r in records][:260] == \
            [(r.dlsn, r.txid, r.payload) for r in hot]
        assert [r.payload for r in records[260:]] == [b"live-%d" % i for i in range(4)]
        assert records[-1].dlsn == later[-1]
        # the same from a position inside a cold segment, and by txid
        with log.reader(start=positions[123]) as r:
            assert r.read(max_records=5, timeout_s=5)[0].dlsn == positions[123]
        with log.reader(start_txid=200) as r:
            assert r.read(max_records=1, timeout_s=5)[0].txid == 200
        cold_segs = [s for s in log.metadata().segments if s.tier == "cold"]
        # delete_after_ms = 0: the pass deleted the moved ledgers after the move
        assert sorted(moved["ledgers_deleted"]) == sorted(s.ledger_id for s in cold_segs)
        again = _offload(config, "orders")  # the segment the writer's close sealed
        assert again["moved"] == 1 and len(again["ledgers_deleted"]) == 1
        for seg in cold_segs:
            with pytest.raises(NoSuchLedgerError):
                bk.ledger_metadata(seg.ledger_id)
        assert [r.dlsn for r in read_now(log)] == [r.dlsn for r in records]
        # Parquet readable as is: the same rows; owner-only like the bookies' data
        path = cold_segs[0].cold.uri.removeprefix("file://")
        assert os.stat(path).st_mode & 0o077 == 0
        assert os.stat(os.path.dirname(path)).st_mode & 0o077 == 0
        table = pq.read_table(path)
        assert table.column("dlsn").to_pylist() == [str(p) for p in positions[:50]]
    out = bkctl("log", "read", "orders", "--json", config=config, text=True)
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert [d["dlsn"] for d in lines] == [str(r.dlsn) for r in records]
    assert [base64.b64decode(d["payload"]) for d in lines] == [r.payload for r in records]
    described = json.loads(bkctl("log", "describe", "orders", "--json", config=config,
                                 text=True).stdout)
    assert {s["tier"] for s in described["segments"]} == {"cold"}  # the writer closed
    assert all(s["cold"]["uri"].startswith("file://") for s in described["segments"])
    status = json.loads(bkctl("status", "--json", config=config, text=True).stdout)
    assert status["tiers"]["cold_segments"] == len(described["segments"])
    assert status["tiers"]["cold_bytes"] == sum(s["cold"]["bytes"]
                                                for s in described["segments"])


def test_truncate_and_delete_remove_cold_files(cluster):
    config = cluster.config_path
    with appliance.connect(str(config)) as bk:
        wait_registered(bk, 3)
        log = bk.log("t")
        positions = _write(log, 200)
        _offload(config, "t")
        files = [s.cold.uri.removeprefix("file://") for s in log.metadata().segments
                 if s.cold is not None]
        from pathlib import Path
        assert all(Path(f).exists() for f in files)
        log.truncate(positions[100])
        assert [Path(f).exists() for f in files] == [False, False, True, True]
        assert read_now(log)[0].dlsn == positions[100]
        bk.delete_log("t")
        assert not any(Path(f).exists() for f in files)


def test_corrupted_cold_file_is_refused_naming_the_segment(cluster):
    config = cluster.config_path
    with appliance.connect(str(config)) as bk:
        wait_registered(bk, 3)
        log = bk.log("c")
        _write(log, 120)
        _offload(config, "c")
        seg = next(s for s in log.metadata().segments if s.tier == "cold")
        path = seg.cold.uri.removeprefix("file://")
        data = bytearray(open(path, "rb").read())
        data[len(data) // 3] ^= 0xFF
        open(path, "wb").write(bytes(data))
        with log.reader() as r, pytest.raises(CorruptColdSegmentError,
                                              match=f"segment {seg.seq}"):
            r.read(max_records=10, timeout_s=1)
    done = bkctl("log", "read", "c", config=config, text=True)
    assert done.returncode != 0 and f"segment {seg.seq}" in done.stderr


@pytest.mark.parametrize("step", ["written", "verified", "cas", "delete"])
def test_mover_killed_at_each_step_loses_and_repeats_nothing(make_cluster, step):
    cluster = _cluster(make_cluster)
    config = cluster.config_path
    with appliance.connect(str(config)) as bk:
        wait_registered(bk, 3)
        log = bk.log("k")
        positions = _write(log, 120)
        done = offload_killed_at(config, "k", step)
        assert done.returncode == -9, done.stderr
        assert [r.dlsn for r in read_now(log)] == positions
        # the killed mover's lease lapses with its metadata session
        wait_for(lambda: bkctl("log", "offload", "k", config=config).returncode == 0, 60,
                 what="a pass after the killed mover")
        _offload(config, "k")  # deletes the ledgers (grace 0)
        md = log.metadata()
        assert all(s.tier == "cold" and s.ledger_deleted for s in md.segments
                   if s.state == "COMPLETED")
        records = read_now(log)
        assert [r.dlsn for r in records] == positions
        assert [r.payload for r in records] == [b"r%06d" % i for i in range(120)]
        named = {s.cold.uri for s in md.segments if s.cold is not None}
        from appliance.cold.store import ColdStore
        store = ColdStore.from_config(bk.cold_config)
        assert {uri for uri, _ in store.files("k")} == named  # no orphan left


def test_auditor_moves_old_segments_while_a_writer_writes(make_cluster):
    """offload_after_ms: the auditor moves sealed segments by itself, keeps
    their ledgers delete_after_ms, then deletes them; a writer goes on
    writing the in-progress segment, and every record is read once."""
    cluster = make_cluster(3, quorums=(3, 3, 2), log=SMALL_SEGMENTS,
                           autorecovery={"enabled": True},
                           cold_storage={"uri": "cold", "offload_after_ms": 1,
                                         "delete_after_ms": 1500, "orphan_grace_ms": 0,
                                         "check_interval_ms": 100})
    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 3)
        log = bk.log("auto")
        with log.writer() as w:
            positions = []
            for i in range(300):
                positions.append(w.write_async(b"a%06d" % i))
                if i % 10 == 9:
                    w.flush()
                if i == 150:  # some segments moved while the writer writes on
                    wait_for(lambda: any(s.tier == "cold" for s in log.metadata().segments),
                             60, what="a segment moved by the auditor")
                    moved = [s for s in log.metadata().segments if s.tier == "cold"]
                    assert not any(s.ledger_deleted for s in moved)  # within the grace
                    assert bk.ledger_metadata(moved[0].ledger_id)  # still on the bookies
            positions = [f.result(timeout=60) for f in positions]
        wait_for(lambda: all(s.tier == "cold" and s.ledger_deleted
                             for s in log.metadata().segments), 60,
                 what="every sealed segment moved and its ledger deleted")
        records = read_now(log)
        assert [r.dlsn for r in records] == positions
        assert [r.payload for r in records] == [b"a%06d" % i for i in range(300)]
        for seg in log.metadata().segments:
            with pytest.raises(NoSuchLedgerError):
                bk.ledger_metadata(seg.ledger_id)
        # a file left by a deletion cut short: the auditor's pass removes it
        leftover = cluster.root / "cold" / "gone-log" / "1-99-abc.parquet"
        leftover.parent.mkdir(parents=True)
        leftover.write_bytes(b"not a segment")
        wait_for(lambda: not leftover.exists(), 60, what="the deleted log's file removed")


def test_a_reader_on_a_hot_segment_goes_on_from_the_file_once_its_ledger_is_gone(cluster):
    config = cluster.config_path
    with appliance.connect(str(config)) as bk:
        wait_registered(bk, 3)
        log = bk.log("switch")
        positions = _write(log, 150)
        with log.reader() as r:
            first = r.read(max_records=25, timeout_s=5)  # half-way into segment 1, hot
            assert [x.dlsn for x in first] == positions[:25]
            moved = _offload(config, "switch")  # delete_after_ms = 0: ledgers deleted
            assert moved["moved"] == 3 and len(moved["ledgers_deleted"]) == 3
            rest = []
            while got := r.read(max_records=1000, timeout_s=0):
                rest += got
        assert [x.dlsn for x in first + rest] == positions
        assert [x.payload for x in first + rest] == [b"r%06d" % i for i in range(150)]


def test_a_cold_log_still_needs_its_password(cluster):
    """The ledger's password record moves with the segment: a reader, a
    deletion and an offload with a wrong password are refused after the
    ledgers are gone too."""
    from appliance.errors import UnauthorizedError

    config = cluster.config_path
    with appliance.connect(str(config)) as bk:
        wait_registered(bk, 3)
        log = bk.log("secret", b"pw")
        positions = _write(log, 60)
        moved = _offload(config, "secret", env={"BKCTL_PASSWORD": "pw"})
        assert moved["moved"] == 2 and len(moved["ledgers_deleted"]) == 2
        with bk.log("secret", b"wrong").reader() as r, \
                pytest.raises(UnauthorizedError, match="wrong password for log 'secret'"):
            r.read(max_records=10, timeout_s=1)
        with pytest.raises(UnauthorizedError):
            bk.delete_log("secret", b"wrong")
        assert [r.dlsn for r in read_now(log)] == positions
        bk.delete_log("secret", b"pw")
