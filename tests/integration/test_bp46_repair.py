"""BP-46 with real bookie processes: a bookie that may have lost data boots
fenced and in limbo, answers "unknown" (never "no such entry") for what it
lacks, repairs itself from its peers, and then holds its whole share again.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import zmq

from appliance.config import load_config
from appliance.errors import OK, DataUnknownError, LedgerFencedError, NoSuchEntryError
from appliance.protocol.keys import master_key
from appliance.supervisor.probe import bookie_info
from ipc.replies import ErrorReply, ReadReply, decode_reply
from ipc.requests import AddRequest, ReadRequest, encode_request
from storage.snapshot import SNAPSHOT_NAME
from tests.support.bkctl import bkctl
from tests.support.launch import supervisor_pids, swap_disks, wait_for, wait_registered

PASSWORD = b"bp46"
ENTRIES = 300
PAYLOAD = 1000


def _call(endpoint: str, request, timeout_ms: int = 5000):
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(endpoint)
        sock.send_multipart(encode_request(request))
        assert sock.poll(timeout_ms, zmq.POLLIN), f"{endpoint} did not answer"
        return decode_reply(sock.recv_multipart())
    finally:
        sock.close()


def raw_read(endpoint: str, ledger_id: int, entry_id: int) -> tuple[int, bytes | None]:
    """(status, record) of one READ sent to one bookie, bypassing the client
    (with the ledgers' key: bookies refuse reads without it)."""
    reply = _call(endpoint, ReadRequest(ledger_id, entry_id, master_key=master_key(PASSWORD),
                                        request_id=7))
    if isinstance(reply, ErrorReply):
        return reply.status, None
    assert isinstance(reply, ReadReply)
    return OK, bytes(reply.data)


def info(cluster, bookie_id: str) -> dict:
    found = bookie_info(cluster.config.bookie(bookie_id).endpoint, 2000)
    assert found is not None, cluster.log(bookie_id)
    return found


def limbo(cluster, bookie_id: str) -> int:
    return info(cluster, bookie_id)["storage"]["limbo_ledgers"]


def write_ledgers(bk, close_second: bool = True):
    """An OPEN ledger (writer kept) and a CLOSED one, ENTRIES entries each."""
    open_lh = bk.create_ledger(3, 3, 2, password=PASSWORD)
    closed_lh = bk.create_ledger(3, 3, 2, password=PASSWORD)
    for i in range(ENTRIES):
        open_lh.add(b"o%06d" % i + b"x" * PAYLOAD)
        closed_lh.add(b"c%06d" % i + b"y" * PAYLOAD)
    if close_second:
        closed_lh.close()
    return open_lh, closed_lh


def assert_whole_share_alone(cluster, bk, bookie_id: str, ledger_ids) -> None:
    """Every entry of each (closed) ledger reads back from ``bookie_id`` alone
    (E = Qw = 3: its share is every entry), after the others are stopped."""
    endpoint = cluster.config.bookie(bookie_id).endpoint
    last = {lid: bk.ledger_metadata(lid).last_entry_id for lid in ledger_ids}
    for other in cluster.procs:
        if other != bookie_id:
            cluster.stop_bookie(other)
    for lid, last_id in last.items():
        assert last_id >= ENTRIES - 1, (lid, last_id)
        for entry_id in range(last_id + 1):
            status, record = raw_read(endpoint, lid, entry_id)
            assert status == OK, (lid, entry_id, status)
            assert record is not None and len(record) > PAYLOAD


def truncate_entry_logs(ledger_dir: Path) -> int:
    """Cut every entry log to half its length (the page cache a power cut
    loses); returns how many were cut."""
    cut = 0
    for path in sorted(Path(ledger_dir).iterdir()):
        if path.name.startswith("entrylog-") and path.stat().st_size > 8192:
            os.truncate(path, path.stat().st_size // 2 // 4096 * 4096)
            cut += 1
    return cut


# small write buffers: most entries reach the entry log files (the page cache
# a power cut loses, played by truncating them), the newest stay in the buffer
JOURNAL_LESS = {"storage": {"journal_write_data": False, "checkpoint_interval_s": 3600.0,
                            "entry_log_buffer_bytes": 64 * 1024}}


def test_journal_less_bookie_loses_data_boots_in_limbo_repairs_and_serves_alone(make_cluster):
    import appliance

    cluster = make_cluster(3, **JOURNAL_LESS)
    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 3)
        open_lh, closed_lh = write_ledgers(bk)
        victim = "bookie-1"
        cluster.kill(victim)  # entries still in its write buffers are gone
        assert truncate_entry_logs(cluster.config.bookie(victim).ledger_dir) >= 1
        # the peers are down while it boots: repair cannot progress, so what
        # it answers in limbo can be observed
        for other in ("bookie-2", "bookie-3"):
            cluster.stop_bookie(other)
        cluster.start_bookie(victim)
        state = info(cluster, victim)
        assert any("journal" in r for r in state["boot"]["reasons"]), state["boot"]
        assert state["storage"]["limbo_ledgers"] == 2
        endpoint = cluster.config.bookie(victim).endpoint
        answers = {raw_read(endpoint, lid, e)[0]
                   for lid in (open_lh.id, closed_lh.id)
                   for e in range(ENTRIES)}
        assert NoSuchEntryError.code not in answers
        assert DataUnknownError.code in answers  # it did lose entries
        # a fenced ledger: the old writer's add is refused by this bookie
        reply = _call(endpoint, AddRequest(open_lh.id, ENTRIES, master_key(PASSWORD),
                                           b"z" * 64, request_id=9))
        assert isinstance(reply, ErrorReply) and reply.status == LedgerFencedError.code

        for other in ("bookie-2", "bookie-3"):
            cluster.start_bookie(other)
        wait_for(lambda: limbo(cluster, victim) == 0, 60.0,
                 what=f"{victim} repaired: {info(cluster, victim)['repair']}")
        repair = info(cluster, victim)["repair"]
        assert repair["entries_copied"] > 0 and repair["state"] == "done", repair
        md = bk.ledger_metadata(open_lh.id)
        assert md.is_closed and md.last_entry_id == ENTRIES - 1  # recovered, nothing lost
        assert_whole_share_alone(cluster, bk, victim, [open_lh.id, closed_lh.id])


def test_index_snapshot_moved_away_boots_fenced_and_refuses_the_old_writer(make_cluster):
    import appliance

    cluster = make_cluster(3)
    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 3)
        open_lh, _ = write_ledgers(bk, close_second=False)
        victim = "bookie-2"
        # another client recovers the open ledger: every bookie fences it
        bk.open_ledger(open_lh.id, PASSWORD).close()
        cluster.stop_bookie(victim)
        ledger_dir = Path(cluster.config.bookie(victim).ledger_dir)
        (ledger_dir / SNAPSHOT_NAME).rename(cluster.root / "moved-index.snap")
        cluster.start_bookie(victim)
        state = info(cluster, victim)
        assert any("rebuilt" in r for r in state["boot"]["reasons"]), state["boot"]
        reply = _call(cluster.config.bookie(victim).endpoint,
                      AddRequest(open_lh.id, ENTRIES, master_key(PASSWORD), b"z" * 64,
                                 request_id=9))
        assert isinstance(reply, ErrorReply) and reply.status == LedgerFencedError.code
        wait_for(lambda: limbo(cluster, victim) == 0, 60.0,
                 what=f"{victim} repaired: {info(cluster, victim)['repair']}")


def _bkctl(config: Path, *args: str) -> subprocess.CompletedProcess:
    return bkctl(*args, config=config, text=True)


def repaired_alone(cluster, bk, victim: str, ledgers, reason_has: str = "") -> None:
    """``victim`` (just restarted) booted through phase one, repairs to no
    limbo ledger, then serves its whole share with its peers stopped."""
    reasons = info(cluster, victim)["boot"]["reasons"]
    assert reasons and reason_has in "; ".join(reasons), reasons
    wait_for(lambda: limbo(cluster, victim) == 0, 60.0,
             what=f"{victim} repaired: {info(cluster, victim)['repair']}")
    shown = json.loads(_bkctl(cluster.config_path, "bookie", "info", victim, "--json").stdout)
    assert shown["cookie"]["matches"] and shown["limbo_ledgers"] == 0
    assert_whole_share_alone(cluster, bk, victim, [lh.id for lh in ledgers])


@pytest.mark.parametrize("auto_fix", [True, False])
def test_wiped_bookie_cookie_fix_then_repairs(make_cluster, auto_fix):
    import appliance

    cluster = make_cluster(3, server={"cookie_auto_fix": auto_fix})
    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 3)
        ledgers = write_ledgers(bk)
        victim = "bookie-3"
        cluster.kill(victim)
        spec = cluster.config.bookie(victim)
        for d in (spec.journal_dir, spec.ledger_dir):
            shutil.rmtree(d)
        cluster.format()  # what the supervisor does with cookie-less directories
        if not auto_fix:
            proc = cluster.start_bookie(victim, wait=False)
            assert proc.wait(timeout=60) != 0
            lines = [ln for ln in cluster.log(victim).splitlines() if "fix-cookie" in ln]
            assert len(lines) == 1, cluster.log(victim)
            done = _bkctl(cluster.config_path, "bookie", "fix-cookie", victim)
            assert done.returncode == 0, done.stderr
            assert "metadata cookie" in done.stdout
        cluster.start_bookie(victim)
        repaired_alone(cluster, bk, victim, ledgers)


@pytest.mark.parametrize("lost", ["journal_dir", "ledger_dir"])
def test_one_replaced_disk_with_cookie_auto_fix_repairs(make_cluster, lost):
    import appliance

    cluster = make_cluster(3, server={"cookie_auto_fix": True})
    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 3)
        ledgers = write_ledgers(bk)
        victim = "bookie-2"
        cluster.kill(victim)
        directory = getattr(cluster.config.bookie(victim), lost)
        shutil.rmtree(directory)
        directory.mkdir()
        cluster.start_bookie(victim)
        repaired_alone(cluster, bk, victim, ledgers, reason_has=lost)


def test_both_disks_replaced_with_cookie_auto_fix_repairs(make_cluster):
    """New empty disks for both directories while the metadata store still
    holds the bookie's cookie and its ledgers: it formats them, boots
    through BP-46 and then serves its whole share alone."""
    import appliance

    cluster = make_cluster(3, server={"cookie_auto_fix": True})
    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 3)
        ledgers = write_ledgers(bk)
        victim = "bookie-2"
        cluster.kill(victim)
        spec = cluster.config.bookie(victim)
        for directory in (spec.journal_dir, spec.ledger_dir):
            shutil.rmtree(directory)
            directory.mkdir()
        cluster.start_bookie(victim)
        repaired_alone(cluster, bk, victim, ledgers, reason_has="both replaced")


def test_both_disks_replaced_without_auto_fix_is_one_refusal_not_a_restart_loop(
        appliance_config):
    """Supervised: the bookie refuses once, naming the command; the
    supervisor leaves it down and `bkctl status` says why."""
    import appliance

    config, seen = appliance_config
    up = _bkctl(config, "up", "--detach")
    seen.update(supervisor_pids(config))
    assert up.returncode == 0, up.stderr
    rows = _status_rows(config)
    victim = rows["bookie-3"]
    with appliance.connect(str(config)) as bk:
        wait_registered(bk, 4)
        write_ledgers(bk)
    swap_disks(victim)
    refused = wait_for(lambda: (r := _status_rows(config)["bookie-3"])["left_down"] and r,
                       60.0, what="bookie-3 refused and left down")
    assert refused["state"] == "down" and refused["restarts"] in (0, 1), refused
    assert refused["last_exit"]["code"] == 78
    assert "fix-cookie bookie-3" in refused["last_exit"]["reason"], refused
    text = _bkctl(config, "status")
    assert text.returncode == 1 and "left down:" in text.stdout, text.stdout
    log_path = load_config(config).run_path / "bookie-3.log"
    assert log_path.read_text().count("refusing to start") == 1
    assert _status_rows(config)["bookie-3"]["restarts"] == refused["restarts"]


def _status_rows(config: Path) -> dict[str, dict]:
    done = _bkctl(config, "status", "--json")
    return {r["id"]: r for r in json.loads(done.stdout)["bookies"]}
