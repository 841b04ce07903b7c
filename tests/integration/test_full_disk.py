"""A full disk is a state, not a crash (BookKeeper #3150, #3205), on a real
file system that fills up: a small ext4 image, loop-mounted, holds one
bookie's directories.  Ledgers are written until that bookie is read-only;
its pid never changes; writers go on with the others; the ledgers it filled
up with are deleted, `bkctl bookie gc` gives the space back, it takes writes
again, and every entry of the ledgers kept reads back.

Making the file system needs root (`mkfs.ext4`, `losetup`, `mount`): as
another user these tests fail and say so, they do not skip.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest

from appliance.supervisor.probe import bookie_info
from appliance.supervisor.supervisor import pid_alive
from tests.support.bkctl import bkctl
from tests.support.launch import (
    kill_pids,
    supervisor_pids,
    wait_for,
    wait_registered,
    write_config,
)
from tests.support.small_fs import MiB, SmallFsError, ext4_fs

ENTRY_BYTES = 64 * 1024  # as in the report of the crash loop
ENTRIES = 50  # per ledger: 3.2 MB (the report's 6.4 MB ledgers, halved with the disks: CI time)
PASSWORD = b"full"
LEDGERS_MAX = 200  # far more than any of these file systems holds
VICTIM = "bookie-1"


@contextlib.contextmanager
def small_fs(root: Path, size_mb: int):
    """A ``size_mb`` ext4 file system mounted under ``root`` (in memory when
    there is room: ``tests.support.small_fs``), removed afterwards."""
    if os.geteuid() != 0:
        pytest.fail("these tests make a small ext4 file system (mkfs.ext4, losetup, mount "
                    "-o loop) and must run as root")
    try:
        with ext4_fs(root, size_mb) as mount:
            yield mount
    except SmallFsError as exc:
        pytest.fail(f"cannot make the test's small file system: {exc}")


def put_on(cluster, fs: Path, keys: tuple[str, ...]) -> None:
    """The victim's directories named by ``keys`` live on ``fs`` (symlinks)."""
    spec = cluster.config.bookie(VICTIM)
    for key in keys:
        target = fs / key
        target.mkdir()
        path = Path(getattr(spec, key))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(target)


def payload(ledger_id: int, entry_id: int) -> bytes:
    head = b"%08d:%06d:" % (ledger_id, entry_id)
    return head + bytes([ledger_id % 251]) * (ENTRY_BYTES - len(head))


def info(cluster) -> dict:
    found = bookie_info(cluster.config.bookie(VICTIM).endpoint, 5000)
    assert found is not None, cluster.log(VICTIM)
    return found


def write_ledger(bk, entries: int = ENTRIES) -> int:
    lh = bk.create_ledger(3, 3, 2, password=PASSWORD)
    for future in [lh.add_async(payload(lh.id, i)) for i in range(entries)]:
        future.result(timeout=120)
    lh.close()
    return lh.id


def fill_until_read_only(cluster, bk, pid: int) -> list[int]:
    """Ledgers written until the victim is read-only (its pid checked after each)."""
    written = []
    while not info(cluster)["read_only"]:
        assert len(written) < LEDGERS_MAX, f"{VICTIM} never turned read-only: {info(cluster)}"
        written.append(write_ledger(bk))
        assert info(cluster)["pid"] == pid, cluster.log(VICTIM)
    return written


def gc_until_writable(cluster, bk, written: list[int], pid: int) -> list[int]:
    """Delete all but every eighth ledger (most entry logs then hold only
    deleted ledgers, the rest are sparse), `bkctl bookie gc`, wait until
    writable; returns the ledgers kept."""
    kept = written[::8]
    for ledger_id in set(written) - set(kept):
        bk.delete_ledger(ledger_id)
    done = bkctl("bookie", "gc", VICTIM, "--json", config=cluster.config_path, text=True)
    assert done.returncode == 0, (done.stdout, done.stderr, cluster.log(VICTIM))
    result = json.loads(done.stdout)
    assert result["ok"] and result["result"]["ledgers_deleted"] > 0, result
    assert result["result"]["bytes_freed"] > 0 and result["result"]["logs_removed"] > 0, \
        (json.dumps(result), cluster.log(VICTIM))
    wait_for(lambda: not info(cluster)["read_only"], 60.0, interval_s=0.2,
             what=f"{VICTIM} writable again: {info(cluster)}")
    assert info(cluster)["pid"] == pid
    text = bkctl("bookie", "gc", VICTIM, config=cluster.config_path, text=True)
    assert text.returncode == 0 and "given back" in text.stdout, (text.stdout, text.stderr)
    return kept


def write_on_victim(cluster, bk) -> int:
    """A ledger whose ensemble holds the victim takes every add (new
    ledgers are created until one is placed on it: the client re-reads the
    registry's view of the bookies every second)."""
    def placed_on_victim():
        lh = bk.create_ledger(3, 3, 2, password=PASSWORD)
        if VICTIM in bk.ledger_metadata(lh.id).ensembles[0][1]:
            return lh
        lh.close()
        return None

    lh = wait_for(placed_on_victim, 30.0, interval_s=0.1,
                  what=f"a new ledger placed on {VICTIM}: registered as "
                       f"{bk.registry.available().get(VICTIM)}")
    for i in range(10):
        lh.add(payload(lh.id, i))
    lh.close()
    assert VICTIM in bk.ledger_metadata(lh.id).ensembles[-1][1], \
        "the writer replaced the bookie that was writable again"
    return lh.id


def read_back(bk, ledger_ids: list[int]) -> None:
    for ledger_id in ledger_ids:
        rh = bk.open_ledger(ledger_id, password=PASSWORD)
        last = rh.last_add_confirmed
        assert last >= 9, (ledger_id, last)
        for entry in rh.read(0, last):
            assert bytes(entry.payload) == payload(ledger_id, entry.entry_id), \
                (ledger_id, entry.entry_id)
        rh.close()


def full_disk_cycle(cluster, expect_out_of_space: bool) -> None:
    import appliance

    cluster.start()
    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 4)
        pid = info(cluster)["pid"]
        written = fill_until_read_only(cluster, bk, pid)
        full = info(cluster)
        if expect_out_of_space:
            assert full["full_disk"]["out_of_space"] >= 1, full
        status = json.loads(bkctl("status", "--json", config=cluster.config_path,
                                  text=True).stdout)
        row = {r["id"]: r for r in status["bookies"]}[VICTIM]
        assert row["state"] == "read-only" and row["read_only_reason"], row
        read_back(bk, written[-2:])  # reads go on while it is full
        kept = gc_until_writable(cluster, bk, written, pid)
        kept.append(write_on_victim(cluster, bk))
        read_back(bk, kept)
        assert info(cluster)["pid"] == pid
        assert cluster.procs[VICTIM].poll() is None


# The bytes written fill the disk, so they set these tests' time: the file
# systems are as small as the two 8 MiB RESERVE files (one per directory,
# limits.STORAGE_RESERVE_BYTES) and a 50% resume mark allow, and the files
# on them shrink with them (segments, logs and batches half their earlier
# size; entries up to 1 MiB, batches 2 MiB).
SMALL_FILES = {"entry_log_rotate_bytes": 12 * MiB, "add_batch_bytes_max": 2 * MiB,
               "entry_bytes_max": 1 * MiB, "journal_segment_bytes": 8 * MiB}
LEDGER_DISK_MB = 96

# Both directories on a 96 MB file system; adds go on until a write meets
# ENOSPC (no usage threshold before it: disk_usage_max = 1).  It resumes at
# 50%, which only the garbage collection reaches.
LEDGER_DISK = {"server": {"disk_usage_max": 1.0, "disk_usage_resume": 0.5,
                          "disk_check_interval_ms": 500},
               "storage": {**SMALL_FILES, "checkpoint_interval_s": 1.0}}


def test_a_full_ledger_disk_is_read_only_then_gc_makes_it_writable(make_cluster, short_tmp):
    cluster = make_cluster(4, start=False, **LEDGER_DISK)
    with small_fs(short_tmp, LEDGER_DISK_MB) as fs:
        put_on(cluster, fs, ("journal_dir", "ledger_dir"))
        try:
            full_disk_cycle(cluster, expect_out_of_space=True)
        finally:
            cluster.kill_all()


def test_a_bookie_killed_on_a_full_disk_boots_and_serves(make_cluster, short_tmp):
    """kill -9 once its disk is full: it boots again and serves reads (no
    crash loop: the direct-I/O probe, the journal's preallocation and the
    replay find room, the RESERVE room given back if need be), and gc gives
    the deleted ledgers' space back."""
    import appliance

    cluster = make_cluster(4, start=False, **LEDGER_DISK)
    with small_fs(short_tmp, LEDGER_DISK_MB) as fs:
        put_on(cluster, fs, ("journal_dir", "ledger_dir"))
        try:
            cluster.start()
            with appliance.connect(str(cluster.config_path)) as bk:
                wait_registered(bk, 4)
                written = fill_until_read_only(cluster, bk, info(cluster)["pid"])
                cluster.kill(VICTIM)
                cluster.start_bookie(VICTIM)  # its open gives the old journal's room back
                booted = info(cluster)
                assert booted["pid"] == cluster.procs[VICTIM].pid
                read_back(bk, written[-2:])
                kept = gc_until_writable(cluster, bk, written, booted["pid"])
                read_back(bk, kept)
        finally:
            cluster.kill_all()


def test_a_full_journal_disk_is_read_only_then_gc_makes_it_writable(make_cluster, short_tmp):
    """Only the journal on a 48 MB file system, no checkpoint until gc
    asks: the journal fills it; defaults otherwise (disk checks every 500 ms)."""
    cluster = make_cluster(4, start=False,
                           server={"disk_check_interval_ms": 500},
                           storage={**SMALL_FILES, "checkpoint_interval_s": 3600.0})
    with small_fs(short_tmp, 48) as fs:
        put_on(cluster, fs, ("journal_dir",))
        try:
            full_disk_cycle(cluster, expect_out_of_space=False)
        finally:
            cluster.kill_all()


class _Supervised:
    """What the helpers above need of a cluster, for one `bkctl up`."""

    def __init__(self, config_path: Path):
        from appliance.config import load_config

        self.config_path = config_path
        self.config = load_config(config_path)

    def log(self, bookie_id: str) -> str:
        return (self.config.run_path / f"{bookie_id}.log").read_text()[-4000:]


def test_the_supervisor_leaves_a_full_bookie_up(short_tmp):
    """Under `bkctl up`: the full bookie is neither killed nor restarted
    (restarts 0, same pid) while it is read-only and while gc reopens it."""
    import appliance

    config = write_config(short_tmp, 4, **LEDGER_DISK)
    seen: set[int] = set()
    with small_fs(short_tmp, LEDGER_DISK_MB) as fs:
        sup = _Supervised(config)
        put_on(sup, fs, ("journal_dir", "ledger_dir"))
        try:
            up = bkctl("up", "--detach", config=config, text=True)
            seen.update(supervisor_pids(config))
            assert up.returncode == 0, up.stderr
            with appliance.connect(str(config)) as bk:
                wait_registered(bk, 4)
                pid = info(sup)["pid"]
                written = fill_until_read_only(sup, bk, pid)
                kept = gc_until_writable(sup, bk, written, pid)
                read_back(bk, kept)
            rows = {r["id"]: r for r in json.loads(
                bkctl("status", "--json", config=config, text=True).stdout)["bookies"]}
            assert (rows[VICTIM]["restarts"], rows[VICTIM]["pid"]) == (0, pid), rows[VICTIM]
            assert bkctl("down", config=config).returncode == 0
        finally:
            seen.update(supervisor_pids(config))
            kill_pids(seen)
            # gone (or zombies: their files are closed) before the file system is unmounted
            wait_for(lambda: not any(pid_alive(p) for p in seen), 30.0, what="processes gone")
