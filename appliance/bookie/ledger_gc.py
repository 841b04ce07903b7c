"""A bookie's garbage collector: forget deleted ledgers, reclaim their space.

Deleting a ledger (``bkctl ledger delete``, ``Client.delete_ledger``) only
removes its metadata.  Every ``server.gc_interval_ms`` each bookie compares
the ledgers it stores with the metadata store and deletes, locally, the ones
whose metadata is gone; then it removes the entry logs that hold nothing but
deleted ledgers (``storage.gc``: only logs no snapshot references any more).

Why this never deletes a live ledger:

* the local ledger list is taken *before* the metadata listing; a ledger
  reaches a bookie only after its metadata was created, so a ledger stored
  before the listing started and missing from it was deleted;
* a ledger must be missing from two consecutive passes, and its metadata is
  then read once more by id, so a listing served by a lagging ZooKeeper
  follower, or any other transient miss, deletes nothing;
* a pass that cannot reach the metadata store changes nothing.

Runs on its own thread (metadata calls may take seconds); the storage is
thread-safe.  A failed pass is logged and retried at the next interval.
"""

from __future__ import annotations

import logging
import threading

from appliance.errors import BKError, NoSuchLedgerError

log = logging.getLogger(__name__)


class LedgerGC:
    """One bookie's collector (see the module docstring)."""

    def __init__(self, storage, ledger_manager, interval_ms: int):
        self.storage = storage
        self.ledgers = ledger_manager
        self.interval_ms = interval_ms
        self._suspects: set[int] = set()  # missing from the previous pass
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.stats = {"passes": 0, "ledgers_deleted": 0, "logs_removed": 0, "bytes_freed": 0,
                      "failed_passes": 0}

    def run_once(self) -> list[int]:
        """One pass; returns the ledgers deleted locally."""
        local = set(self.storage.ledgers())  # first: see the module docstring
        listed = set(self.ledgers.list_ledgers())
        missing = local - listed
        deleted = []
        for ledger_id in sorted(missing & self._suspects):
            try:
                self.ledgers.read_ledger(ledger_id)
                continue  # it exists after all
            except NoSuchLedgerError:
                pass
            self.storage.delete_ledger(ledger_id)
            deleted.append(ledger_id)
        self._suspects = missing - set(deleted)
        removed, freed = self.storage.reclaim_entry_logs()
        self.stats["passes"] += 1
        self.stats["ledgers_deleted"] += len(deleted)
        self.stats["logs_removed"] += len(removed)
        self.stats["bytes_freed"] += freed
        if deleted:
            log.info("deleted %d ledgers whose metadata is gone: %s", len(deleted), deleted)
        return deleted

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="ledger-gc", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_ms / 1000.0):
            try:
                self.run_once()
            except BKError as exc:  # metadata unreachable, storage closing or failed
                self.stats["failed_passes"] += 1
                log.warning("garbage collection pass failed (retrying in %d ms): %s",
                            self.interval_ms, exc)
            except Exception:  # noqa: BLE001 - a bug must not kill the thread silently
                self.stats["failed_passes"] += 1
                log.exception("garbage collection pass failed")
