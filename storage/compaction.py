"""Compaction: give back the space of entry logs that are mostly garbage.

Garbage collection (``storage.gc``) removes an entry log only when none of
its ledgers is alive, so one live entry pins a whole log.  Compaction
rewrites a sealed log whose *live share* (bytes of the entries the index
still points at, over the file's size) is below a threshold: its live
entries are copied into the active entry log, the index is switched to the
copies, and the old log is removed once that switch is durable.

Steps, and why a crash (kill -9) at any point loses nothing:

1. **Checkpoint** first, so the snapshot's entry-log mark lies past every
   candidate: only logs below the *persisted* mark are compacted.  Such a
   log is sealed (never appended to again: new writes, and a crash
   recovery's re-appends, go to newer logs) and no recovery ever scans it
   (recovery scans from the mark).
2. **Copy**, a chunk at a time (at most an entry-log buffer of data): read
   the live records of the log without the storage lock and verify each
   (ledger, entry, length, CRC32C); then, under the lock, keep only entries
   the index still points at in that log (a ledger deleted or an entry
   re-added meanwhile is skipped), write them as a new block with a fresh
   operation seq and point the index at the copies.  Reads switch at that
   moment and are served from the new block (from memory until it is
   written), so a read never fails because of compaction.  The copies are
   not journaled: until a checkpoint covers them the old log still holds
   the same bytes and the persisted index points there.  After a crash the
   copies are found by the entry-log scan past the mark (their seq is
   higher than anything they copy, so recovery's seq order makes them win)
   or are lost, harmlessly.
3. **Mark** the log as garbage once no index entry points into it (checked
   again under the lock), and drop its per-ledger byte record (so ``gc``
   leaves it alone).  The garbage set is saved in every snapshot.
4. **Checkpoint** again: the entry logs holding the copies are synced, then
   the snapshot (index without the old log, garbage set with it) is written.
5. **Remove** only logs in the garbage set *of the snapshot on disk*.  A
   crash before 4 leaves the old snapshot, which still points into the old
   log: it is still there.  A crash between the unlink and the next
   checkpoint leaves a snapshot naming a missing garbage log: nothing points
   into it; it is dropped from the set.

``REMOVE_BEFORE_CHECKPOINT`` reorders 4 and 5; it exists only so the kill -9
crash test can show that it catches that mistake.

Logs below the mark that hold no live entry at all (empty logs left by
restarts, logs of deleted ledgers the per-ledger record does not know) have
a live share of 0: they take the same path with nothing to copy.

Runs: minor (``compaction_minor_threshold``, every
``compaction_minor_interval_s``) and major (``compaction_major_threshold``,
every ``compaction_major_interval_s``) on the storage's compactor thread;
``LedgerStorage.compact()`` runs one now (in the caller's thread) and
``request_compaction()`` asks the thread (``bkctl bookie compact``), which
first rotates the active log so that recently deleted data is covered too.
One run at a time.  Copying is not rate-limited: it competes with adds for
the entry-log device and holds the storage lock for one chunk at a time.
"""

from __future__ import annotations

import logging
import os
import threading
import time

import numpy as np

from appliance.protocol.errors import BookieIOError, ClientClosedError, CorruptRecordError

from .codec import RECORD_HEADER_BYTES, verify_record
from .entry_log import list_logs, log_path
from .options import ALIGN_BYTES

log = logging.getLogger(__name__)

REMOVE_BEFORE_CHECKPOINT = False  # the crash test's mutation switch; never set it otherwise
SPAN_SLACK = 4  # one pread per chunk unless it would read this many times the live bytes


def plan(log_sizes: dict[int, int], live: dict[int, int], mark_log: int,
         garbage: set[int], threshold: float) -> list[tuple[int, int, int]]:
    """(log id, live bytes, file bytes) of every log to compact, emptiest
    first: sealed below ``mark_log``, not garbage already, live share (live
    bytes over the file's bytes past its header page) below ``threshold``."""
    chosen = []
    for log_id, size in log_sizes.items():
        if log_id >= mark_log or log_id in garbage:
            continue
        used = live.get(log_id, 0)
        if used < threshold * max(size - ALIGN_BYTES, 1):
            chosen.append((log_id, used, size))
    chosen.sort(key=lambda c: (c[1] / max(c[2], 1), c[0]))
    return chosen


def _chunks(rows: np.ndarray, bytes_max: int):
    """[lo, hi) ranges of rows whose records add up to at most ``bytes_max``."""
    sizes = rows[:, 3] + RECORD_HEADER_BYTES
    lo, acc = 0, 0
    for i, size in enumerate(sizes.tolist()):
        if acc + size > bytes_max and i > lo:
            yield lo, i
            lo, acc = i, 0
        acc += size
    if lo < len(rows):
        yield lo, len(rows)


class Compactor:
    """One storage's compaction: runs, the schedule thread, progress."""

    def __init__(self, st):
        self.st = st
        self._run_lock = threading.Lock()  # one run at a time
        self._wake = threading.Event()
        self._requested: str | None = None  # "minor" / "major" asked by request()
        self._request_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = False
        self.status = {"running": False, "runs": 0, "requested_runs": 0, "requests_done": 0,
                       "progress": None, "last": None, "failures": 0, "last_error": None,
                       "bytes_reclaimed_total": 0, "logs_removed_total": 0}

    # -- one run -----------------------------------------------------------------
    def run(self, major: bool = False, rotate_active: bool = False) -> dict:
        """Compact now; returns what was done (see ``_run``)."""
        with self._run_lock:
            self.status["running"] = True
            try:
                result = self._run(major, rotate_active)
            except BaseException as exc:
                self.status["failures"] += 1
                self.status["last_error"] = f"{type(exc).__name__}: {exc}"
                raise
            finally:
                self.status["running"] = False
                self.status["progress"] = None
                self.st._disk_cache = None  # the accounting changed
            self.status["runs"] += 1
            self.status["last"] = result
            self.status["bytes_reclaimed_total"] += result["bytes_reclaimed"]
            self.status["logs_removed_total"] += result["logs_removed"]
            return result

    def _run(self, major: bool, rotate_active: bool) -> dict:
        st = self.st
        opts = st.options
        threshold = opts.compaction_major_threshold if major else opts.compaction_minor_threshold
        started = time.monotonic()
        if rotate_active:
            with st._lock:
                st._check_usable()
                st._logs.rotate()
        st.checkpoint()  # the persisted mark passes every log sealed so far
        removed, reclaimed = self.remove_garbage()
        with st._lock:
            st._check_usable()
            live = st._index.live_bytes_by_log(RECORD_HEADER_BYTES)
            mark_log = st._persisted[1]
            garbage = set(st._garbage)
        sizes = {}
        for log_id in list_logs(st.ledger_dir):
            try:
                sizes[log_id] = os.stat(log_path(st.ledger_dir, log_id)).st_size
            except FileNotFoundError:
                continue
        chosen = plan(sizes, live, mark_log, garbage, threshold)
        result = {"kind": "major" if major else "minor", "threshold": threshold,
                  "logs_examined": len(sizes), "logs_compacted": 0, "entries_copied": 0,
                  "bytes_copied": 0, "logs_failed": 0}
        self.status["progress"] = {"logs_total": len(chosen), "logs_done": 0,
                                   "bytes_to_copy": sum(c[1] for c in chosen),
                                   "bytes_copied": 0}
        for log_id, _live, _size in chosen:
            try:
                entries, nbytes = self._copy_log(log_id)
            except CorruptRecordError as exc:  # keep the log: its reads fail the same way
                log.error("compaction of entry log %d stopped, the log is kept: %s",
                          log_id, exc)
                result["logs_failed"] += 1
                continue
            result["logs_compacted"] += 1
            result["entries_copied"] += entries
            result["bytes_copied"] += nbytes
            self._progress("logs_done", 1)
        if result["logs_compacted"]:
            if REMOVE_BEFORE_CHECKPOINT:  # the mutation: claim the switch is durable
                with st._lock:
                    st._persisted_garbage |= st._garbage
            else:
                st.checkpoint()  # copies synced, then the switched index saved
            more_removed, more_reclaimed = self.remove_garbage()
            removed += more_removed
            reclaimed += more_reclaimed
        result.update(logs_removed=len(removed), bytes_reclaimed=reclaimed,
                      seconds=round(time.monotonic() - started, 3))
        if result["logs_compacted"] or removed:
            log.info("%s compaction of %s: %d logs rewritten (%d entries, %d bytes copied), "
                     "%d logs removed, %d bytes given back", result["kind"], st.ledger_dir,
                     result["logs_compacted"], result["entries_copied"],
                     result["bytes_copied"], len(removed), reclaimed)
        return result

    def _progress(self, key: str, amount: int) -> None:
        progress = self.status["progress"]
        if progress is not None:  # None outside run() (tests drive the steps)
            progress[key] += amount

    def _copy_log(self, log_id: int) -> tuple[int, int]:
        """Copy the live entries of one sealed log and mark it garbage;
        returns (entries, bytes of data copied)."""
        st = self.st
        with st._lock:
            st._check_usable()
            rows = st._index.rows_in_log(log_id)
        path = log_path(st.ledger_dir, log_id)
        copied = nbytes = 0
        if len(rows):
            limit = min(st.options.add_batch_bytes_max, st.options.entry_log_buffer_bytes) - 64
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError as exc:
                raise CorruptRecordError(f"entry log {path} is missing") from exc
            try:
                for lo, hi in _chunks(rows, limit):
                    n, b = self._copy_chunk(fd, path, log_id, rows[lo:hi])
                    copied += n
                    nbytes += b
                    self._progress("bytes_copied", b)
            finally:
                os.close(fd)
        with st._lock:
            st._check_usable()
            if len(st._index.rows_in_log(log_id)):  # re-pointed into it? never: it is sealed
                raise CorruptRecordError(f"entry log {log_id} still holds indexed entries "
                                         f"after compaction copied it")
            st._garbage.add(log_id)
            st._logs.ledger_bytes.pop(log_id, None)
        return copied, nbytes

    def _copy_chunk(self, fd: int, path: str, log_id: int,
                    rows: np.ndarray) -> tuple[int, int]:
        st = self.st
        offsets, lengths = rows[:, 2], rows[:, 3]
        first = int(offsets[0])
        span = int((offsets + lengths).max()) + RECORD_HEADER_BYTES - first
        wanted = int(lengths.sum()) + RECORD_HEADER_BYTES * len(rows)
        datas = []
        if span <= SPAN_SLACK * wanted:
            raw = _pread(fd, path, span, first)
            view = memoryview(raw)
            for (ledger, entry, offset, length) in rows.tolist():
                rel = offset - first
                datas.append(verify_record(view[rel:rel + RECORD_HEADER_BYTES + length],
                                           ledger, entry, length, f"{path} offset {offset}"))
        else:
            for (ledger, entry, offset, length) in rows.tolist():
                raw = _pread(fd, path, RECORD_HEADER_BYTES + length, offset)
                datas.append(verify_record(raw, ledger, entry, length,
                                           f"{path} offset {offset}"))
        with st._lock:
            st._check_usable()
            keep = np.zeros(len(rows), bool)
            ledgers = rows[:, 0]
            for ledger in np.unique(ledgers).tolist():
                sel = np.flatnonzero(ledgers == ledger)
                keep[sel] = st._index.still_at(ledger, rows[sel, 1], log_id, offsets[sel])
            if not keep.any():
                return 0, 0
            idx = np.flatnonzero(keep)
            st._append_unjournaled(rows[idx, 0].astype(np.uint64),
                                   rows[idx, 1].astype(np.uint64),
                                   [datas[i] for i in idx.tolist()], lengths[idx])
        return len(idx), int(lengths[idx].sum())

    def remove_garbage(self) -> tuple[list[int], int]:
        """Remove the garbage logs the snapshot on disk names; (ids, bytes)."""
        st = self.st
        with st._lock:
            chosen = sorted(st._persisted_garbage)
            for log_id in chosen:
                st._logs.forget_log(log_id)  # under the lock: no read holds its descriptor
        removed, freed = [], 0
        for log_id in chosen:
            path = log_path(st.ledger_dir, log_id)
            try:
                size = os.stat(path).st_size
                os.unlink(path)
            except FileNotFoundError:
                size = 0
            except OSError as exc:
                log.warning("could not remove compacted entry log %s: %s", path, exc)
                continue
            if size:
                removed.append(log_id)
            freed += size
            with st._lock:
                st._garbage.discard(log_id)
                st._persisted_garbage.discard(log_id)
        return removed, freed

    # -- the schedule --------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="compactor", daemon=True)
        self._thread.start()

    def request(self, major: bool) -> int:
        """Ask the thread for a run now (the active log rotated first, so data
        deleted lately counts too); returns a ticket: the run is done once
        ``status["requests_done"] >= ticket``."""
        with self._request_lock:
            if major or self._requested is None:
                self._requested = "major" if major else "minor"
            self.status["requested_runs"] += 1
            ticket = self.status["requested_runs"]
        self._wake.set()
        return ticket

    def stop(self) -> None:
        self._stop = True
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def _loop(self) -> None:
        opts = self.st.options
        now = time.monotonic()
        due = {"minor": now + opts.compaction_minor_interval_s if
               opts.compaction_minor_interval_s else None,
               "major": now + opts.compaction_major_interval_s if
               opts.compaction_major_interval_s else None}
        while not self._stop:
            pending = [t for t in due.values() if t is not None]
            timeout = max(0.0, min(pending) - time.monotonic()) if pending else None
            self._wake.wait(timeout)
            self._wake.clear()
            if self._stop:
                return
            with self._request_lock:
                requested, self._requested = self._requested, None
                taking = self.status["requested_runs"]
            now = time.monotonic()
            kind = requested or next((k for k in ("major", "minor")
                                      if due[k] is not None and due[k] <= now), None)
            if kind is None:
                continue
            try:
                self.run(major=kind == "major", rotate_active=requested is not None)
            except ClientClosedError:
                return
            except BookieIOError:
                return  # the storage failed: it refuses writes, nothing to compact into
            except Exception:  # noqa: BLE001 - recorded in status, retried next time
                log.exception("compaction of %s failed", self.st.ledger_dir)
            if requested is not None:
                self.status["requests_done"] = taking
            now = time.monotonic()
            for k, interval in (("minor", opts.compaction_minor_interval_s),
                                ("major", opts.compaction_major_interval_s)):
                if interval and (due[k] is None or due[k] <= now or kind == "major"):
                    due[k] = now + interval


def _pread(fd: int, path: str, nbytes: int, offset: int) -> bytes:
    try:
        raw = os.pread(fd, nbytes, offset)
    except OSError as exc:
        raise BookieIOError(f"read of {path} at {offset} failed: {exc}") from exc
    if len(raw) != nbytes:
        raise CorruptRecordError(f"{path} offset {offset}: short read ({len(raw)} of {nbytes} "
                                 f"bytes) during compaction")
    return raw
