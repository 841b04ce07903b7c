"""``bkctl bench repair`` and ``bkctl bench boot``: BP-46 self-repair and
crash-restart times, on bookie processes of their own under a temp dir
(no supervisor: the bench decides when a bookie restarts).

* repair: three bookies, one E3/W3/A2 ledger of ``total_bytes``; one bookie
  is killed, its directories wiped and formatted anew (a replaced disk), and
  it is restarted with ``server.cookie_auto_fix``: boot-to-serving time, then
  the time until its limbo count is 0, entries and bytes copied (from its
  INFO), entries/s and MB/s.
* boot: one bookie, ``journal_bytes`` written with checkpoints held off, then
  kill -9 and restart: time from spawn to serving (the journal replay), per
  size.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import appliance
from appliance.bench.launcher import (
    check_free_space,
    spawn,
    stop_process,
    wait_for,
    wait_started,
    write_config,
)
from appliance.config import load_config
from appliance.supervisor.probe import bookie_info
from storage import LedgerStorage

READY_TIMEOUT_S = 600.0
# A restarted bookie registers only once its killed incarnation's registry
# session has expired: a short session keeps that wait out of the figures
# (with the default 10 s it adds up to 10 s to boot-to-serving).
SESSION_TIMEOUT_MS = 1000
REPAIR_TIMEOUT_S = 3600.0


class _Bookies:
    """Bookie processes of one config, each with a ready file."""

    def __init__(self, root: Path, n: int, **sections):
        self.root = root
        self.path = write_config(root / "bench.toml", n, **sections)
        self.config = load_config(self.path)
        self.procs: dict[str, object] = {}

    def format(self, bookie_id: str) -> None:
        spec = self.config.bookie(bookie_id)
        for d in (spec.journal_dir, spec.ledger_dir):
            Path(d).mkdir(parents=True, exist_ok=True)
        LedgerStorage.format(bookie_id, spec.journal_dir, spec.ledger_dir,
                             self.config.storage.to_options())

    def start(self, bookie_id: str) -> float:
        """Spawn and wait until serving; returns the seconds it took."""
        ready = self.root / f"{bookie_id}.ready"
        ready.unlink(missing_ok=True)
        log = self.root / f"{bookie_id}.log"
        started = time.monotonic()
        proc = spawn([sys.executable, "-m", "appliance.bookie", "--config", str(self.path),
                      "--id", bookie_id, "--ready-file", str(ready)], log)
        self.procs[bookie_id] = proc
        wait_started(proc, ready.exists, bookie_id, log, READY_TIMEOUT_S, 0.01)
        return time.monotonic() - started

    def kill(self, bookie_id: str) -> None:
        stop_process(self.procs.pop(bookie_id), sig=signal.SIGKILL)

    def info(self, bookie_id: str) -> dict:
        return bookie_info(self.config.bookie(bookie_id).endpoint, 5000) or {}

    def stop(self) -> None:
        for bookie_id in list(self.procs):
            stop_process(self.procs.pop(bookie_id))


def _write(config_path: Path, total_bytes: int, entry_bytes: int, quorums) -> tuple[int, float]:
    """One ledger of ``total_bytes``; returns (entries, seconds)."""
    payload = os.urandom(entry_bytes)
    n = max(1, total_bytes // entry_bytes)
    started = time.monotonic()
    with appliance.connect(str(config_path)) as bk:
        wait_for(lambda: len(bk.registry.available()) >= quorums[0], 30.0, what="bookies")
        lh = bk.create_ledger(*quorums)
        futures = [lh.add_async(payload) for _ in range(n)]
        futures[-1].result(timeout=REPAIR_TIMEOUT_S)
        lh.close()
    return n, time.monotonic() - started


def run_repair_bench(total_bytes: int, entry_bytes: int, workdir: str | None = None) -> dict:
    root = Path(tempfile.mkdtemp(prefix="bkrep", dir=workdir))
    check_free_space(6 * total_bytes, str(root))
    bookies = _Bookies(root, 3, client={"ensemble": 3, "write_quorum": 3, "ack_quorum": 2},
                       server={"cookie_auto_fix": True},
                       storage={"checkpoint_interval_s": 30.0},
                       metadata={"session_timeout_ms": SESSION_TIMEOUT_MS})
    try:
        for b in bookies.config.bookies:
            bookies.format(b.id)
            bookies.start(b.id)
        entries, write_s = _write(bookies.path, total_bytes, entry_bytes, (3, 3, 2))
        victim = bookies.config.bookies[0]
        bookies.kill(victim.id)
        for d in (victim.journal_dir, victim.ledger_dir):
            shutil.rmtree(d)
        bookies.format(victim.id)  # a new, empty disk
        started = time.monotonic()
        boot_s = bookies.start(victim.id)
        wait_for(lambda: (bookies.info(victim.id).get("storage") or {}).get(
            "limbo_ledgers") == 0, REPAIR_TIMEOUT_S, what="repair", interval_s=0.05)
        repair_s = time.monotonic() - started
        info = bookies.info(victim.id)
        repair = info.get("repair") or {}
        copied, copied_bytes = repair.get("entries_copied", 0), repair.get("bytes_copied", 0)
        storage = info.get("storage") or {}
        return {"entries_written": entries, "storage_open_s": storage.get("open_s"),
                "entry_bytes": entry_bytes,
                "bytes_written": entries * entry_bytes, "write_s": round(write_s, 3),
                "boot_to_serving_s": round(boot_s, 3), "repair_s": round(repair_s, 3),
                "entries_copied": copied, "bytes_copied": copied_bytes,
                "entries_per_s": round(copied / repair_s, 1) if repair_s else None,
                "mb_per_s": round(copied_bytes / repair_s / 1e6, 1) if repair_s else None,
                "boot_reasons": (info.get("boot") or {}).get("reasons")}
    finally:
        bookies.stop()
        shutil.rmtree(root, ignore_errors=True)


def run_boot_bench(journal_sizes: list[int], entry_bytes: int,
                   workdir: str | None = None) -> list[dict]:
    rows = []
    for size in journal_sizes:
        root = Path(tempfile.mkdtemp(prefix="bkboot", dir=workdir))
        check_free_space(3 * size, str(root))
        bookies = _Bookies(root, 1, client={"ensemble": 1, "write_quorum": 1, "ack_quorum": 1},
                           storage={"checkpoint_interval_s": 86_400.0,
                                    "checkpoint_bytes": 64 * 1024 ** 3},
                           metadata={"session_timeout_ms": SESSION_TIMEOUT_MS})
        try:
            bookie_id = bookies.config.bookies[0].id
            bookies.format(bookie_id)
            bookies.start(bookie_id)
            entries, _ = _write(bookies.path, size, entry_bytes, (1, 1, 1))
            bookies.kill(bookie_id)
            boot_s = bookies.start(bookie_id)
            storage = bookies.info(bookie_id).get("storage") or {}
            open_s = storage.get("open_s") or boot_s
            rows.append({"journal_bytes": entries * entry_bytes, "entries": entries,
                         "boot_to_serving_s": round(boot_s, 3), "storage_open_s": open_s,
                         "replayed_records": storage.get("recovered_journal_records"),
                         "replay_mb_per_s": round(entries * entry_bytes / open_s / 1e6, 1)})
        finally:
            bookies.stop()
            shutil.rmtree(root, ignore_errors=True)
    return rows


def run_autorecovery_bench(total_bytes: int, entry_bytes: int, delay_ms: int = 0,
                           workdir: str | None = None) -> dict:
    """Four bookies, one E3/W3/A2 ledger of ``total_bytes`` on a victim that
    is killed and wiped: the time from the kill until no fragment names it
    (autorecovery alone, ``lost_bookie_delay_ms = delay_ms``), and the copy
    rate of that time minus the delay."""
    root = Path(tempfile.mkdtemp(prefix="bkauto", dir=workdir))
    check_free_space(8 * total_bytes, str(root))
    bookies = _Bookies(root, 4, client={"ensemble": 3, "write_quorum": 3, "ack_quorum": 2},
                       autorecovery={"lost_bookie_delay_ms": delay_ms},
                       metadata={"session_timeout_ms": SESSION_TIMEOUT_MS})
    try:
        for b in bookies.config.bookies:
            bookies.format(b.id)
            bookies.start(b.id)
        entries, write_s = _write(bookies.path, total_bytes, entry_bytes, (3, 3, 2))
        with appliance.connect(str(bookies.path)) as bk:
            (ledger_id,) = bk.list_ledgers()
            victim = bk.ledger_metadata(ledger_id).ensembles[0][1][0]
            spec = bookies.config.bookie(victim)
            bookies.kill(victim)
            started = time.monotonic()
            for d in (spec.journal_dir, spec.ledger_dir):
                shutil.rmtree(d)
            wait_for(lambda: victim not in bk.ledger_metadata(ledger_id).bookies(),
                     REPAIR_TIMEOUT_S, what="re-replication", interval_s=0.05)
            healed_s = time.monotonic() - started
        copy_s = max(healed_s - delay_ms / 1000.0, 1e-9)
        copied = entries * entry_bytes
        return {"entries": entries, "entry_bytes": entry_bytes, "bytes": copied,
                "write_s": round(write_s, 3), "lost_bookie_delay_ms": delay_ms,
                "loss_to_full_redundancy_s": round(healed_s, 3),
                "copy_s": round(copy_s, 3), "entries_per_s": round(entries / copy_s, 1),
                "mb_per_s": round(copied / copy_s / 1e6, 1)}
    finally:
        bookies.stop()
        shutil.rmtree(root, ignore_errors=True)
