"""Disk space of LedgerStorage: entry-log GC, compaction and disk usage.

The work is done elsewhere: ``storage.gc`` removes entry logs that hold only
deleted ledgers, ``storage.compaction`` rewrites sparse sealed logs and
removes them once the switch is durable (only logs the snapshot on disk
calls garbage).  This mixin is the facade's door to them and the
accounting the supervisor asks for every second (``disk_usage``, cached).
Nothing here changes what a read returns.

``give_back_space`` is the bookie GC pass's part, which bounds how long a
deleted ledger's space waits (docs/OPERATIONS.md).  The active entry log is
never removed or compacted (only sealed logs below the persisted mark are)
and is sealed by size only every ``entry_log_rotate_bytes``.  So once
``entry_log_rotate_garbage_bytes`` of it belong to deleted ledgers, or its
live share is under ``compaction_minor_threshold`` (a mostly deleted log of
any size), it is rotated as a size rotation would (the next block goes to a
new log; the old one is synced by the checkpoint that follows).  Then a
checkpoint moves the mark past it and forgets the deleted ledgers, the logs
holding only deleted ledgers are removed, and a minor compaction starts at
once when a sealed log's live share is under ``compaction_minor_threshold``
(its usual rules: rate limit, checkpoint before removal), not at its next
interval (unless ``compaction_minor_interval_s`` is 0: no minor run by
itself).
"""

from __future__ import annotations

import os
import time

from . import gc as entry_log_gc
from .codec import RECORD_HEADER_BYTES
from .entry_log import EntryLogger, list_logs, log_path


class SpaceOps:
    """Mixin of LedgerStorage over ``self._compactor``, ``self._index``,
    ``self._lock`` and ``self._disk_cache``."""

    def reclaim_entry_logs(self) -> tuple[list[int], int]:
        """Remove entry logs that hold only deleted ledgers (``storage.gc``),
        and compacted logs the snapshot on disk calls garbage
        (``storage.compaction``); returns (removed log ids, bytes they held)."""
        compacted, freed = self._compactor.remove_garbage()
        removed, nbytes = entry_log_gc.reclaim_entry_logs(self)
        if removed or compacted:
            self._disk_cache = None
        return sorted(removed + compacted), nbytes + freed

    def give_back_space(self, deleted: int) -> dict:
        """The GC pass after it deleted ``deleted`` ledgers (see the module
        docstring): rotate the active log if enough of it is garbage,
        checkpoint if anything was deleted or rotated, remove the logs of
        deleted ledgers, start a minor compaction if a sealed log is sparse.
        Returns {rotated_garbage_bytes, logs_removed, bytes_freed, compaction}."""
        garbage = self._rotate_if_garbage()
        changed = bool(deleted or garbage)
        if changed:
            self.checkpoint()  # the mark passes the rotated log; the snapshot forgets
        removed, freed = self.reclaim_entry_logs()  # the deleted ledgers
        woken = bool(changed and self.options.compaction_minor_interval_s
                     and self._has_sparse_sealed_log())  # interval 0: never by itself
        if woken:
            self._compactor.run_soon()
        return {"rotated_garbage_bytes": garbage, "logs_removed": removed,
                "bytes_freed": freed, "compaction": woken}

    def active_log_garbage_bytes(self) -> int:
        """Bytes of the active entry log that belong to deleted ledgers (0 in
        per-ledger mode, where every checkpoint rotates the open logs)."""
        with self._lock:
            self._check_usable()
            return self._active_garbage_locked()

    def _active_garbage_locked(self, with_total: bool = False):
        """Deleted ledgers' bytes in the active log (and, ``with_total``, all
        its bytes on record)."""
        logs = self._logs
        if not isinstance(logs, EntryLogger):
            return (0, 0) if with_total else 0
        per = logs.ledger_bytes.get(logs.log_id, {})
        live = self._index.ledgers
        garbage = sum(nbytes for ledger, nbytes in per.items() if ledger not in live)
        return (garbage, sum(per.values())) if with_total else garbage

    def _rotate_if_garbage(self) -> int:
        """Rotate the active log once ``entry_log_rotate_garbage_bytes`` of it
        are deleted ledgers', or once its live share (on record) is under
        ``compaction_minor_threshold`` (a quiet log mostly deleted: it is
        then compacted at once); returns the deleted bytes (0: not rotated)."""
        limit = self.options.entry_log_rotate_garbage_bytes
        if not limit:
            return 0
        with self._lock:
            self._check_usable()
            garbage, total = self._active_garbage_locked(with_total=True)
            sparse = total - garbage < self.options.compaction_minor_threshold * total
            if not garbage or (garbage < limit and not sparse):
                return 0
            try:
                self._logs.rotate()
            except BaseException as exc:  # no new log (a full disk): stop writes, as an
                self._failure = exc       # append that fails to rotate does
                raise
        self.counters["gc_rotations"] = self.counters.get("gc_rotations", 0) + 1
        return garbage

    def _has_sparse_sealed_log(self) -> bool:
        """Whether a minor compaction would rewrite a log now (``compaction.plan``)."""
        return bool(self._compactor.planned(self.options.compaction_minor_threshold)[0])

    def compact(self, major: bool = False, rotate_active: bool = True,
                collect: bool = False) -> dict:
        """Compact now, in this thread (``storage.compaction``): rewrite sealed
        entry logs whose live share is under the minor (or major) threshold,
        then remove them once the switch is durable.  ``rotate_active`` seals
        the active log first so it is a candidate too; ``collect`` runs the
        deleted-ledger collector first (``set_deleted_ledger_collector``).
        Returns counts (ledgers_forgotten, logs_compacted, entries_copied,
        bytes_copied, logs_removed, bytes_reclaimed, throttled_s, seconds, ...)."""
        return self._compactor.run(major, rotate_active, collect)

    def request_compaction(self, major: bool = False) -> int:
        """Ask the compactor thread for a run now (deleted ledgers collected
        and the active log rotated first); done once
        ``compaction_status()["requests_done"]`` reaches the ticket."""
        return self._compactor.request(major)

    def suspend_compaction(self) -> None:
        """Suspend automatic compaction (none starts; a running one stops
        after its current log) until ``resume_compaction`` or the process
        ends; ``request_compaction`` still runs."""
        self._compactor.suspend()

    def resume_compaction(self) -> None:
        self._compactor.resume()

    def set_deleted_ledger_collector(self, collect) -> None:
        """``collect()`` (returns the ledgers it deleted) runs before every
        requested compaction: the owner forgets deleted ledgers at once, so
        their entries count as garbage in that run (the bookie's GC)."""
        self._compactor.collect_deleted = collect

    def compaction_status(self) -> dict:
        """running, suspended, runs, progress of the current run, the last
        run's counts, failures and the last error, totals given back, the
        rate limit and the time spent waiting for it."""
        status = dict(self._compactor.status)
        if status["progress"] is not None:
            status["progress"] = dict(status["progress"])
        return status

    def disk_usage(self, max_age_s: float = 1.0) -> dict:
        """Entry-log accounting: files and their bytes, live bytes (records
        the index points at), garbage (the rest: deleted or overwritten
        entries, file headers and padding), open (written) logs.  Live bytes
        come from the index's per-ledger counts (O(ledgers): INFO is asked
        every second by the supervisor); the files are listed and sized at
        most once per ``max_age_s``."""
        now = time.monotonic()
        if self._disk_cache is not None and now - self._disk_cache[0] < max_age_s:
            return dict(self._disk_cache[1])
        with self._lock:
            self._check_open()
            live_bytes = self._index.data_bytes() + RECORD_HEADER_BYTES * self._index.entry_count()
        files = total = 0
        for log_id in list_logs(self.ledger_dir):
            try:
                total += os.stat(log_path(self.ledger_dir, log_id)).st_size
                files += 1
            except FileNotFoundError:
                continue
        out = {"entry_logs": files, "open_logs": getattr(self._logs, "open_log_count", 1),
               "entry_log_bytes": total, "live_bytes": live_bytes,
               "garbage_bytes": max(0, total - live_bytes)}
        self._disk_cache = (now, out)
        return dict(out)

