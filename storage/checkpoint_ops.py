"""Checkpoints of LedgerStorage: the checkpointer thread, ``checkpoint()``
and ``flush()``.

A checkpoint syncs the entry logs, persists the index snapshot and frees the
journal segments before its mark, in that order: the snapshot (seq S,
journal mark M, entry-log mark P) is written only after every block before P
is durable, and M is where the journal was durable when S was taken, so a
crash at any point replays to the same state (see ``checkpoint``).  One
checkpoint at a time (``_checkpoint_lock``, taken before the storage lock).
A failure while syncing or saving stops writes (``_failure``).

The checkpointer thread runs one every ``checkpoint_interval_s`` or when
adds wake it after ``checkpoint_bytes``; in per-ledger mode it also rotates
idle entry logs every ``entry_log_idle_ms / 2``.
"""

from __future__ import annotations

import logging
import threading
import time

from appliance.protocol.errors import ClientClosedError

from . import storage_files as sf

log = logging.getLogger("storage.ledger_storage")  # the logger name operators know


class CheckpointOps:
    """Mixin of LedgerStorage over ``self._journal``, ``self._logs``,
    ``self._index``, ``self._lock`` and ``self._checkpoint_lock``."""

    def checkpoint(self) -> None:
        """Sync entry logs, persist the index, free journal segments before it.

        Adds and reads go on meanwhile: the storage lock is held only to take
        the marks, hand the entry-log buffer over and freeze the index (no
        I/O waits); the syncs, the snapshot write and the segment deletion run
        outside it.  Crash safety: the snapshot (seq S, journal mark M,
        entry-log mark P) is written only after every block before P is
        durable, and M is where the journal was durable when S was taken, so
        every record after M either has a seq above S (replayed) or is covered
        by the snapshot (skipped: replay ignores seq <= S)."""
        with self._checkpoint_lock:
            with self._lock:
                self._check_open()
            self._checkpoint_locked()

    def _checkpoint_locked(self) -> None:
        """The checkpoint; the caller holds ``_checkpoint_lock`` (one at a time)."""
        t0 = time.monotonic()
        self._journal.request_flush()  # without the lock: adds go on while the group syncs
        self._journal.wait_durable(self._journal_seq)
        with self._lock:
            self._check_usable(closing_ok=True)
            try:
                mark = self._journal.position  # durable: adds after it have seq > S or are in it
                sync = self._logs.begin_sync()
                meta = sf.snapshot_meta(self, mark)
                frozen = self._index.freeze()
            except BaseException as exc:
                self._failure = exc
                raise
            self._bytes_since_checkpoint = 0
        try:
            self._logs.finish_sync(sync)
            sf.save_snapshot(self, meta, frozen)
            with self._lock:
                self._persisted = (frozenset(frozen.ledgers), meta["entry_log_mark"][0])
                self._persisted_garbage = set(meta["garbage_logs"])
            self._journal.delete_segments_before(mark[0])
        except BaseException as exc:
            self._failure = exc
            raise
        finally:
            with self._lock:
                self._index.thaw()
        self.counters["checkpoints"] += 1
        self.counters["checkpoint_s_total"] += time.monotonic() - t0

    def flush(self) -> None:
        """Make everything added so far durable (also in no-journal mode)."""
        with self._lock:
            self._check_usable()
            self._logs.sync()
            self._journal.request_flush()
            self._journal.wait_durable(self._journal_seq)

    def _start_checkpointer(self) -> None:
        self._checkpointer = threading.Thread(target=self._checkpoint_loop,
                                              name="checkpointer", daemon=True)
        self._checkpointer.start()
        self._compactor.start()

    def _checkpoint_loop(self) -> None:
        while not self._closed:
            self._wait_checkpoint_due()
            if self._closed or self._failure is not None:
                return
            try:
                self.checkpoint()
            except ClientClosedError:
                return
            except Exception:  # noqa: BLE001 - recorded in _failure, reported to callers
                log.exception("checkpoint of %s failed; storage stops accepting writes",
                              self.ledger_dir)
                return


    def _stop_checkpointer(self) -> None:
        self._compactor.stop()
        self._checkpoint_wake.set()
        if self._checkpointer is not None and self._checkpointer is not threading.current_thread():
            self._checkpointer.join()


    def _wait_checkpoint_due(self) -> None:
        """The checkpointer's wait: the interval or a wake-up; in per-ledger
        mode it also wakes every ``entry_log_idle_ms / 2`` to rotate idle logs."""
        interval_s = self.options.checkpoint_interval_s
        if not self.options.entry_log_per_ledger:
            self._checkpoint_wake.wait(interval_s)
            self._checkpoint_wake.clear()
            return
        deadline = time.monotonic() + interval_s
        tick_s = max(self.options.entry_log_idle_ms / 2000.0, 0.005)
        while not self._closed:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            if self._checkpoint_wake.wait(min(remaining, tick_s)):
                self._checkpoint_wake.clear()
                return
            try:
                self.expire_idle_logs()
            except Exception:  # noqa: BLE001 - recorded in _failure; the loop reports it
                return
