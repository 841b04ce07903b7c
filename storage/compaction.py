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
2. **Copy**: the log is scanned block by block (every block verified: its
   header, record table and each record's CRC32C) without the storage
   lock; the records the index points at are gathered and, a chunk at a
   time (an entry-log buffer), checked again under the lock (a ledger
   deleted or an entry re-added meanwhile is skipped), written as a new
   block with a fresh operation seq, and the index is pointed at the copies.  Reads switch at that
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
every ``compaction_major_interval_s``) on the storage's compactor thread,
and a minor one at once when the bookie's GC deleted ledgers and found a
sparse sealed log (``run_soon``, ``LedgerStorage.give_back_space``);
``LedgerStorage.compact()`` runs one now (in the caller's thread) and
``request_compaction()`` asks the thread (``bkctl bookie compact``).  A
requested run first lets the owner forget deleted ledgers
(``collect_deleted``: the bookie's GC, which otherwise needs two passes of
``gc_interval_ms`` to drop a deleted ledger; until then its entries count
as live and its logs look full) and rotates the active log, so what was
deleted a moment ago is given back by this run, not the next one.  One run
at a time.

Copying is rate-limited (``compaction_rate_bytes_per_s``, a token bucket,
``storage.throttle``): it competes with adds for the entry-log device and
holds the storage lock for one chunk at a time.  Automatic runs can be
suspended (``suspend``; BookKeeper's suspendMajorGC/suspendMinorGC): none
starts, and a running one stops after the log it is copying (what it did
is kept).  A requested run is explicit and runs while suspended.
Suspension lasts until ``resume`` or the process ends.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

import numpy as np

from appliance.protocol.errors import BookieIOError, ClientClosedError, CorruptRecordError

from .codec import RECORD_HEADER_BYTES
from .entry_log import list_logs, log_path, scan_log
from .options import ALIGN_BYTES
from .throttle import TokenBucket

log = logging.getLogger(__name__)

REMOVE_BEFORE_CHECKPOINT = False  # the crash test's mutation switch; never set it otherwise
# Copies are appended (under the storage lock) this many bytes at a time, or
# one entry-log buffer if smaller.  An add waits for at most one chunk: with
# whole 4 MiB buffers a 1 KiB add waited up to 17 ms (p99 1.1 ms at 16 MiB/s
# of copying), with 256 KiB up to 6 ms (p99 0.2 ms), same copy speed
# (2026-11-27, storage alone, 64 KiB entries).
COPY_CHUNK_BYTES = 256 * 1024


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


class Compactor:
    """One storage's compaction: runs, the schedule thread, progress."""

    def __init__(self, st):
        self.st = st
        self._run_lock = threading.Lock()  # one run at a time
        self._wake = threading.Event()
        self._requested: str | None = None  # "minor" / "major" asked by request()
        self._soon = False  # an automatic minor run asked by run_soon()
        self._request_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = False
        self._stopping = threading.Event()  # interrupts a throttled wait
        # Before a requested run: forget deleted ledgers now (the bookie's GC);
        # returns the ledgers forgotten.  None: nothing to ask (tests, tools).
        self.collect_deleted: Callable[[], list[int]] | None = None
        self.clock: Callable[[], float] = time.monotonic  # throttle and schedule (tests inject)
        self.sleep: Callable[[float], object] = self._stopping.wait
        self._auto_run = False  # the running run is a scheduled one (suspend stops it)
        self._bucket = TokenBucket(0)  # the running run's (tests drive _copy_log alone)
        self.status = {"running": False, "runs": 0, "requested_runs": 0, "requests_done": 0,
                       "progress": None, "last": None, "failures": 0, "last_error": None,
                       "bytes_reclaimed_total": 0, "logs_removed_total": 0,
                       "suspended": False, "throttled_s_total": 0.0,
                       "rate_bytes_per_s": st.options.compaction_rate_bytes_per_s}

    # -- one run -----------------------------------------------------------------
    def run(self, major: bool = False, rotate_active: bool = False,
            collect: bool = False) -> dict:
        """Compact now; returns what was done (see ``_run``).  ``collect``:
        ask ``collect_deleted`` first (a requested run)."""
        with self._run_lock:
            self.status["running"] = True
            try:
                result = self._run(major, rotate_active, collect)
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

    def planned(self, threshold: float) -> tuple[list[tuple[int, int, int]], int]:
        """The logs a compaction at ``threshold`` would rewrite now
        (``plan``), and how many entry logs it looked at."""
        st = self.st
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
        return plan(sizes, live, mark_log, garbage, threshold), len(sizes)

    def _run(self, major: bool, rotate_active: bool, collect: bool) -> dict:
        st = self.st
        opts = st.options
        threshold = opts.compaction_major_threshold if major else opts.compaction_minor_threshold
        started = time.monotonic()
        forgotten, gc_error = self._collect() if collect else (None, None)
        self._bucket = TokenBucket(opts.compaction_rate_bytes_per_s, self.clock, self.sleep)
        if rotate_active:
            with st._lock:
                st._check_usable()
                st._logs.rotate()
        st.checkpoint()  # the persisted mark passes every log sealed so far
        removed, reclaimed = self.remove_garbage()
        chosen, examined = self.planned(threshold)
        result = {"kind": "major" if major else "minor", "threshold": threshold,
                  "ledgers_forgotten": forgotten, "gc_error": gc_error,
                  "logs_examined": examined, "logs_compacted": 0, "entries_copied": 0,
                  "bytes_copied": 0, "logs_failed": 0, "stopped": None, "throttled_s": 0.0}
        self.status["progress"] = {"logs_total": len(chosen), "logs_done": 0,
                                   "bytes_to_copy": sum(c[1] for c in chosen),
                                   "bytes_copied": 0}
        for log_id, _live, _size in chosen:
            if self._auto_run and self.status["suspended"]:
                result["stopped"] = "suspended"  # what was copied so far is kept
                break
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
                      throttled_s=round(self._bucket.waited_s, 3),
                      seconds=round(time.monotonic() - started, 3))
        self.status["throttled_s_total"] += self._bucket.waited_s
        if result["logs_compacted"] or removed:
            log.info("%s compaction of %s: %d logs rewritten (%d entries, %d bytes copied), "
                     "%d logs removed, %d bytes given back", result["kind"], st.ledger_dir,
                     result["logs_compacted"], result["entries_copied"],
                     result["bytes_copied"], len(removed), reclaimed)
        return result

    def _collect(self) -> tuple[int | None, str | None]:
        """(ledgers ``collect_deleted`` forgot, or None; its error, or None).
        A failure (the metadata store unreachable or closed) is reported, not
        raised: the run then compacts what the index already knows is
        garbage (a closed or failed storage stops it at its next step)."""
        if self.collect_deleted is None:
            return None, None
        try:
            return len(self.collect_deleted()), None
        except Exception as exc:  # noqa: BLE001 - reported in the run's result
            log.warning("deleted ledgers of %s not collected before compaction: %s",
                        self.st.ledger_dir, exc)
            return None, f"{type(exc).__name__}: {exc}"

    def _throttle(self, nbytes: int) -> None:
        """Wait for the rate limit before copying ``nbytes`` (without the
        storage lock); a stop request ends the wait and the run."""
        self._bucket.take(nbytes)
        if self._stop:
            raise ClientClosedError(f"compaction of {self.st.ledger_dir} stopped: the "
                                    f"storage is closing")

    def _progress(self, key: str, amount: int) -> None:
        progress = self.status["progress"]
        if progress is not None:  # None outside run() (tests drive the steps)
            progress[key] += amount

    def _copy_log(self, log_id: int) -> tuple[int, int]:
        """Copy the live entries of one sealed log and mark it garbage;
        returns (entries, bytes of data copied).

        The log is read block by block (``scan_log``: a sliding window, every
        block verified), so memory stays bounded by one block plus one chunk
        of copies, whatever the log holds.  Per block, the records the index
        points at are kept (under the lock); a chunk of them is appended once
        it reaches ``COPY_CHUNK_BYTES`` (``_flush``: checked again under the
        lock).  Nothing new is ever indexed into a sealed log, so its live
        bytes only fall: a log with none is not read at all, and the scan
        ends once it has gathered as many bytes as were live when it began.
        If the scan stops early (a damaged block) and live entries remain in
        the log, it is not marked garbage: it stays, as it was."""
        st = self.st
        with st._lock:
            st._check_usable()
            live = st._index.live_bytes_by_log(RECORD_HEADER_BYTES).get(log_id, 0)
        done = [0, 0]
        if live:
            self._scan_and_copy(log_id, live, done)
        with st._lock:
            st._check_usable()
            left = st._index.live_bytes_by_log(RECORD_HEADER_BYTES).get(log_id, 0)
            if left:  # the scan stopped before them (a damaged block): keep the log
                raise CorruptRecordError(f"entry log {log_id}: {left} bytes of indexed "
                                         f"entries were not found by its scan")
            st._garbage.add(log_id)
            st._logs.ledger_bytes.pop(log_id, None)
        return done[0], done[1]

    def _scan_and_copy(self, log_id: int, live: int, done: list) -> None:
        """The scan of ``_copy_log``: gather and append the indexed records
        until ``live`` bytes (records and headers) are gathered or the log ends."""
        st = self.st
        limit = min(st.options.add_batch_bytes_max, st.options.entry_log_buffer_bytes,
                    COPY_CHUNK_BYTES) - 64
        chunk = _Chunk()
        gathered = [0]

        def on_block(offset: int, info, raw) -> None:
            with st._lock:
                st._check_usable()
                keep = _still_indexed(st._index, info.ledgers, info.entries, log_id,
                                      info.offsets + offset)
            for i in np.flatnonzero(keep).tolist():
                rel = int(info.offsets[i]) + RECORD_HEADER_BYTES
                length = int(info.lengths[i])
                chunk.add(int(info.ledgers[i]), int(info.entries[i]),
                          offset + int(info.offsets[i]), bytes(raw[rel:rel + length]))
                gathered[0] += length + RECORD_HEADER_BYTES
                if chunk.nbytes >= limit:
                    self._flush(chunk, log_id, done)
            if gathered[0] >= live:
                raise _AllGathered

        try:
            scan_log(st.ledger_dir, log_id, 0, on_block)
        except _AllGathered:
            pass
        except FileNotFoundError as exc:
            raise CorruptRecordError(f"entry log {log_path(st.ledger_dir, log_id)} is "
                                     f"missing") from exc
        self._flush(chunk, log_id, done)

    def _flush(self, chunk: _Chunk, log_id: int, done: list) -> None:
        """Append the chunk's records the index still points at in ``log_id``."""
        if not chunk.datas:
            return
        st = self.st
        self._throttle(chunk.nbytes)
        ledgers = np.array(chunk.ledgers, np.int64)
        entries = np.array(chunk.entries, np.int64)
        offsets = np.array(chunk.offsets, np.int64)
        with st._lock:
            st._check_usable()
            keep = _still_indexed(st._index, ledgers, entries, log_id, offsets)
            idx = np.flatnonzero(keep)
            if len(idx):
                lengths = np.fromiter((len(chunk.datas[i]) for i in idx.tolist()), np.int64,
                                      len(idx))
                st._append_unjournaled(ledgers[idx].astype(np.uint64),
                                       entries[idx].astype(np.uint64),
                                       [chunk.datas[i] for i in idx.tolist()], lengths)
                done[0] += len(idx)
                done[1] += int(lengths.sum())
                self._progress("bytes_copied", int(lengths.sum()))
        chunk.clear()

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
        """Ask the thread for a run now (deleted ledgers collected and the
        active log rotated first, so data deleted lately counts too); returns
        a ticket: the run is done once ``status["requests_done"] >= ticket``.
        It runs also while automatic compaction is suspended."""
        with self._request_lock:
            if major or self._requested is None:
                self._requested = "major" if major else "minor"
            self.status["requested_runs"] += 1
            ticket = self.status["requested_runs"]
        self._wake.set()
        return ticket

    def run_soon(self) -> None:
        """An automatic minor run now rather than at its interval (the GC
        found sparse sealed logs after deleting ledgers).  It is a timed
        run's twin: rate-limited, and not while suspended (then it waits
        for ``resume``)."""
        self._soon = True
        self._wake.set()

    def suspend(self) -> None:
        """No automatic run starts until ``resume``; a running one stops
        after the log it is copying.  Requested runs are not affected."""
        self.status["suspended"] = True

    def resume(self) -> None:
        """Automatic runs start again when due (a run missed while suspended
        starts at once)."""
        self.status["suspended"] = False
        self._wake.set()

    def stop(self) -> None:
        self._stop = True
        self._stopping.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def _loop(self) -> None:
        opts = self.st.options
        intervals = {"minor": opts.compaction_minor_interval_s,
                     "major": opts.compaction_major_interval_s}
        now = self.clock()
        due = {k: now + v if v else None for k, v in intervals.items()}
        while not self._stop:
            pending = [t for t in due.values() if t is not None]
            if self.status["suspended"]:
                pending = []  # a due run waits for resume (or a request)
            timeout = max(0.0, min(pending) - self.clock()) if pending else None
            self._wake.wait(timeout)
            self._wake.clear()
            if self._stop:
                return
            with self._request_lock:
                requested, self._requested = self._requested, None
                taking = self.status["requested_runs"]
            now = self.clock()
            kind = requested or (None if self.status["suspended"] else next(
                (k for k in ("major", "minor") if due[k] is not None and due[k] <= now),
                "minor" if self._soon else None))
            if kind is None:
                continue
            if not self.status["suspended"]:
                self._soon = False  # this run serves it
            if not self._run_from_loop(kind, requested is not None):
                return
            if requested is not None:
                self.status["requests_done"] = taking
            now = self.clock()
            for k, interval in intervals.items():
                if interval and (due[k] is None or due[k] <= now or kind == "major"):
                    due[k] = now + interval

    def _run_from_loop(self, kind: str, requested: bool) -> bool:
        """One run of the thread; False when the storage is closing or failed."""
        self._auto_run = not requested
        try:
            self.run(major=kind == "major", rotate_active=requested, collect=requested)
        except ClientClosedError:
            return False
        except BookieIOError:
            return False  # the storage failed: it refuses writes, nothing to compact into
        except Exception:  # noqa: BLE001 - recorded in status, retried next time
            log.exception("compaction of %s failed", self.st.ledger_dir)
        finally:
            self._auto_run = False
        return True


class _AllGathered(Exception):  # noqa: N818 - a signal that ends a scan, not an error
    """Every record that was live in the log is gathered: the scan ends."""


class _Chunk:
    """Records waiting to be copied (their data copied out of the scan window)."""

    __slots__ = ("ledgers", "entries", "offsets", "datas", "nbytes")

    def __init__(self):
        self.clear()

    def add(self, ledger: int, entry: int, offset: int, data: bytes) -> None:
        self.ledgers.append(ledger)
        self.entries.append(entry)
        self.offsets.append(offset)
        self.datas.append(data)
        self.nbytes += len(data) + RECORD_HEADER_BYTES

    def clear(self) -> None:
        self.ledgers, self.entries, self.offsets, self.datas = [], [], [], []
        self.nbytes = 0


def _still_indexed(index, ledgers: np.ndarray, entries: np.ndarray, log_id: int,
                   offsets: np.ndarray) -> np.ndarray:
    """Which records the index points at (``log_id``, offset); caller holds the lock."""
    ledgers = np.asarray(ledgers, np.int64)
    entries = np.asarray(entries, np.int64)
    keep = np.zeros(len(ledgers), bool)
    for ledger in np.unique(ledgers).tolist():
        sel = np.flatnonzero(ledgers == ledger)
        keep[sel] = index.still_at(ledger, entries[sel], log_id, offsets[sel])
    return keep
