"""Looking at what is being written, as a newcomer does: `bkctl ledger read`
and `bkctl ledger meta` of an open ledger leave its writer writing (real
subprocesses and click's runner), `--recover` fences it; `bkctl log read`
from the start of a truncated log; `bkctl up --detach` writes its log
owner-only."""

from __future__ import annotations

import base64
import json
import os
import stat

import pytest
from click.testing import CliRunner

import appliance
from appliance import DLSN
from appliance.config import load_config
from appliance.errors import LedgerFencedError
from cli.main import cli
from tests.support.bkctl import bkctl
from tests.support.launch import supervisor_pids, wait_registered


def _run(*args: str, config) -> object:
    """bkctl in this process (click's runner)."""
    return CliRunner().invoke(cli, [*args, "--config", str(config)],
                              env={"BKCTL_PASSWORD": None}, catch_exceptions=False)


def _seen_by_readers(lh) -> tuple[int, int]:
    """The LACs a reader may see: the writer's, or one less while the
    writer has not yet told the bookies its last one."""
    return lh.last_add_confirmed - 1, lh.last_add_confirmed


def test_reading_an_open_ledger_leaves_its_writer_writing_and_recover_fences_it(make_cluster):
    cluster = make_cluster(3, quorums=(3, 3, 2), autorecovery={"enabled": False})
    config = cluster.config_path
    with appliance.connect(str(config)) as bk:
        wait_registered(bk, 3)
        lh = bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, password=b"pw")
        written = [b"entry %d" % i for i in range(20)]
        for payload in written:
            lh.add(payload)

        low, high = _seen_by_readers(lh)
        read = bkctl("ledger", "read", str(lh.id), "--password", "pw", config=config)
        assert read.returncode == 0, read.stderr.decode()
        lines = read.stdout.splitlines()
        assert low + 1 <= len(lines) <= high + 1 and lines == written[:len(lines)]
        written.append(b"after a subprocess read")
        lh.add(written[-1])  # the writer goes on

        low, high = _seen_by_readers(lh)
        got = _run("ledger", "read", str(lh.id), "--password", "pw", "--json", "--no-recovery",
                   config=config)
        assert got.exit_code == 0, got.output
        payloads = [base64.b64decode(doc["payload"]) for doc in json.loads(got.stdout)]
        assert low + 1 <= len(payloads) <= high + 1 and payloads == written[:len(payloads)]
        written.append(b"after an in-process read")
        lh.add(written[-1])

        past = bkctl("ledger", "read", str(lh.id), "--password", "pw", "--last", "999",
                     config=config, text=True)
        assert past.returncode != 0 and past.stdout == ""
        assert len(past.stderr.strip().splitlines()) == 1 and "is open" in past.stderr
        written.append(b"after a refused read")
        lh.add(written[-1])

        recovered = bkctl("ledger", "read", str(lh.id), "--password", "pw", "--recover",
                          config=config)
        assert recovered.returncode == 0, recovered.stderr.decode()
        assert recovered.stdout.splitlines() == written  # every acknowledged entry
        with pytest.raises(LedgerFencedError):
            lh.add(b"too late")
        assert bk.ledger_metadata(lh.id).state == "CLOSED"


def test_ledger_meta_shows_the_last_add_confirmed_of_an_open_ledger(make_cluster):
    cluster = make_cluster(3, quorums=(3, 3, 2), autorecovery={"enabled": False})
    config = cluster.config_path
    with appliance.connect(str(config)) as bk:
        wait_registered(bk, 3)
        lh = bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, password=b"pw")
        for i in range(12):
            lh.add(b"%d" % i)

        low, high = _seen_by_readers(lh)
        meta = bkctl("ledger", "meta", str(lh.id), "--json", config=config, text=True,
                     env={"BKCTL_PASSWORD": "pw"})
        assert meta.returncode == 0, meta.stderr
        doc = json.loads(meta.stdout)
        assert (doc["state"], doc["last_entry_id"]) == ("OPEN", -1)
        assert low <= doc["last_add_confirmed"] <= high
        lh.add(b"12")  # the writer goes on

        low, high = _seen_by_readers(lh)
        text = _run("ledger", "meta", str(lh.id), "--password", "pw", config=config)
        assert text.exit_code == 0, text.output
        first = text.stdout.splitlines()[0]
        assert "OPEN, last entry -1, last add confirmed " in first
        lac = int(first.split("last add confirmed ")[1].split(",")[0])
        assert low <= lac <= high

        no_password = _run("ledger", "meta", str(lh.id), config=config)
        assert no_password.exit_code == 0, no_password.output
        assert "last add confirmed unknown: give the ledger's password" in no_password.stdout
        lh.add(b"13")
        lh.close()

        closed = json.loads(_run("ledger", "meta", str(lh.id), "--json", config=config).stdout)
        assert (closed["state"], closed["last_entry_id"], closed["last_add_confirmed"]) == \
            ("CLOSED", 13, 13)


def test_log_read_from_the_start_of_a_truncated_log_gives_the_first_record_kept(make_cluster):
    cluster = make_cluster(3, quorums=(3, 3, 2), autorecovery={"enabled": False},
                           log={"segment_records_max": 50, "flush_interval_us": 200})
    config = cluster.config_path
    lines = [b"line %d" % i for i in range(200)]
    with appliance.connect(str(config)) as bk:
        wait_registered(bk, 3)
        log = bk.log("trim")
        with log.writer() as w:
            futures = []
            for i, line in enumerate(lines):  # entries of 10 records: segments of 50
                futures.append(w.write_async(line))
                if i % 10 == 9:
                    w.flush()
            positions = [f.result(timeout=30) for f in futures]
        log.truncate(before=positions[120])
        kept = log.metadata().segment(positions[120].seq).first_txid
        assert 1 < kept <= 121
        with log.reader(start=DLSN.FIRST) as r:
            assert r.read(max_records=1, timeout_s=30)[0].payload == lines[kept - 1]

    for start in ([], ["--from", str(DLSN.FIRST)]):
        read = bkctl("log", "read", "trim", *start, config=config)
        assert read.returncode == 0, read.stderr.decode()
        assert read.stdout.splitlines() == lines[kept - 1:]
    inside = bkctl("log", "read", "trim", "--from", str(positions[0]), config=config, text=True)
    assert inside.returncode != 0 and "LogTruncatedError" in inside.stderr
    assert len(inside.stderr.strip().splitlines()) == 1


def test_up_detach_writes_its_log_owner_only(appliance_config):
    config, seen = appliance_config
    old = os.umask(0o022)  # a usual login umask: bkctl must not depend on it
    try:
        up = bkctl("up", "--detach", config=config)
    finally:
        os.umask(old)
    seen.update(supervisor_pids(config))
    assert up.returncode == 0, up.stderr.decode()
    log_path = load_config(config).run_path / "supervisor.log"
    assert stat.S_IMODE(log_path.stat().st_mode) == 0o600
    down = bkctl("down", config=config)
    assert down.returncode == 0, down.stderr.decode()
