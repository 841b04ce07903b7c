"""The journal: an append-only write-ahead log with group commit.

Guarantees:

* A record's ``seq`` counts as durable (``durable_seq >= seq``) only after the
  write holding it, and every earlier write, returned from ``fdatasync``.
* Group commit: one ``fdatasync`` per group; a group closes when its oldest
  record has waited ``journal_group_wait_us`` or it holds
  ``journal_group_bytes``.  While a sync runs, new records queue up and form
  the next group, so throughput grows with load.
* Segments are preallocated (``posix_fallocate``) and created atomically
  (temp file, header, fsync, rename, dir fsync).  Each group write is padded
  to 4 KiB, so it is O_DIRECT-able and never rewrites durable bytes.
* Zeros are written ahead of the write position by the idle journal thread
  after small groups (never over a written record: see ``ZERO_STEP_BYTES``);
  a zero-filled tail reads as the end of the segment, as an unwritten one
  does.
* Every segment header records where the previous segment's valid data ends,
  so a cut in the middle of the journal (lost acknowledged data) is told
  apart from a torn tail and refused (see ``journal_scan``).

Faults survived: a crash at any point (the unsynced tail is torn or missing
and replay cuts it); an I/O error on write or sync (the journal stops, every
waiter and later submit gets ``BookieIOError``; a failed fsync is never
retried).  One writer at a time touches the segment file: the writer
thread, or the bookie loop's thread writing its own records inline while
the writer thread is idle (``write_inline``: no thread hop either way).
"""

from __future__ import annotations

import collections
import logging
import os
import struct
import threading
import time

from appliance.protocol import limits
from appliance.protocol.errors import BookieIOError
from appliance.protocol.invariant import invariant

from . import aligned_io as aio
from .codec import crc, pack_file_header
from .histogram import Histogram
from .journal_scan import RECORD, RECORD_MAGIC, SEGMENT_MAGIC, list_segments, segment_path
from .options import ALIGN_BYTES, StorageOptions

log = logging.getLogger(__name__)

GROUP_RECORDS_BOUNDS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
GROUP_BYTES_BOUNDS = (4096, 16384, 65536, 262144, 1 << 20, 4 << 20, 16 << 20)

# Freeing old segments after a checkpoint: bytes per step, pause between
# steps.  Bigger steps / shorter pauses free space sooner but stall the
# disk's other fdatasyncs longer at once; at 8 MiB and 5 ms a 64 MiB segment
# takes ~40 ms, in the checkpointer thread (never the add path).
FREE_STEP_BYTES = 8 * 1024 * 1024
FREE_PAUSE_S = 0.005

# Zero-filling ahead of the write position (O_DIRECT segments that were
# preallocated): ``posix_fallocate`` leaves "unwritten" extents, and the
# first write to each block converts it, a metadata change that the next
# fdatasync must commit through the file system's own journal.  With one
# small group per add that was every add: 56 us of CPU and three sleeps
# per 4 KiB write + fdatasync, against 31 us and two over blocks already
# written (ext4, measured 2026-11-27).  So after a group of at most
# ``SMALL_GROUP_BYTES`` written inline (or under a group wait) the
# journal thread, when idle, writes zeros up to ``ZERO_AHEAD_BYTES`` past
# the write position, ``ZERO_STEP_BYTES`` (~0.3 ms) at a time; records
# queued meanwhile wait for the step, then the thread writes them.  Bigger
# groups (load, or big entries) pay the conversion once for many bytes and
# would double the journal's write bandwidth: nothing is zeroed after them.
# Each byte is zeroed at most once.
ZERO_STEP_BYTES = 256 * 1024
ZERO_AHEAD_BYTES = 1024 * 1024
SMALL_GROUP_BYTES = 16 * 1024  # a group of at most this is small: zeros are written after it


def encode_record(seq: int, rtype: int, body: bytes, self_verifying: bool) -> bytes:
    """The 32-byte record header for ``body`` (ADD bodies verify themselves)."""
    body_crc = 0 if self_verifying else crc(body)
    tail = RECORD.pack(0, 0, rtype, 0, len(body), body_crc, 0, seq)[8:]
    return struct.pack("<II", RECORD_MAGIC, crc(tail)) + tail


class Journal:
    """Writer side: a new segment per open, a group-commit thread, durability
    notification by condition variable and by an eventfd (``durable_fd``)."""

    def __init__(self, directory: str, options: StorageOptions, instance: bytes,
                 direct: bool, segment_id: int, prev_end: int, start_seq: int):
        self.directory = directory
        self._opts = options
        self._instance = instance
        self._direct = direct
        self._wait_s = options.journal_group_wait_us / 1e6
        lock = threading.Lock()
        self._cond = threading.Condition(lock)  # durability and back-pressure waiters
        self._work = threading.Condition(lock)  # the journal thread's wake-up, alone
        self._queue: collections.deque = collections.deque()
        self._queued_bytes = 0
        self._closing = False
        self._flush_requested = False
        # One writer at a time: the journal thread, or (``write_inline``) the
        # thread that owns the bookie's loop, which writes its own records
        # itself when the journal thread is idle (no thread hop each way).
        self._writing = False
        self._inline_owner: int | None = None
        self._parked = False  # the thread waits for work (``parked``)
        self._failure: BaseException | None = None
        self.durable_seq = start_seq
        self.durable_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        # group commits: write + fdatasync time, records and bytes per group
        self.sync_latency = Histogram()
        self.group_records = Histogram(GROUP_RECORDS_BOUNDS)
        self.group_bytes = Histogram(GROUP_BYTES_BOUNDS)
        self.stats = {"journal_syncs": 0, "journal_bytes": 0, "journal_records": 0,
                      "journal_segments_created": 0}
        room = aio.align_up(options.journal_group_bytes + options.add_batch_bytes_max + 64)
        self._buf = aio.AlignedBuffer(room + ALIGN_BYTES)
        self._zeros: aio.AlignedBuffer | None = None  # ZERO_STEP_BYTES of zeros, on first use
        self._zeroed_end = 0  # the current segment holds zeros or records up to here
        self._zero_ok = False  # zero-fill this segment (direct, preallocated, no failure)
        self._zero_wanted = False  # the last group was small and inline (or under a wait)
        self._fd = -1
        self._open_segment(segment_id, prev_end)
        self._thread = threading.Thread(target=self._run, name="journal", daemon=True)
        self._thread.start()

    # -- caller side -----------------------------------------------------------
    def submit(self, seq: int, rtype: int, body: bytes, self_verifying: bool = False) -> None:
        """Queue one record; blocks while ``journal_queue_bytes_max`` is exceeded."""
        header = encode_record(seq, rtype, body, self_verifying)
        size = len(header) + len(body)
        with self._cond:
            while (self._queued_bytes > self._opts.journal_queue_bytes_max
                   and self._failure is None and not self._closing):
                self._cond.wait(1.0)
            self._check_usable()
            was_empty = not self._queue
            self._queue.append((seq, header, body, time.monotonic()))
            self._queued_bytes += size
            # The inline owner's records are written by its own write_inline()
            # at the end of its loop turn (or by the thread, if busy then).
            if (was_empty and threading.get_ident() != self._inline_owner) \
                    or self._queued_bytes >= self._opts.journal_group_bytes:
                self._work.notify()

    def wait_durable(self, seq: int, timeout_s: float | None = None) -> bool:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            if self._queue:  # records of the inline owner may not have woken the thread
                self._work.notify()
            while self.durable_seq < seq:
                if self._failure is not None:
                    raise BookieIOError(f"journal failed: {self._failure}") from self._failure
                if self._closing and not self._queue and not self._thread.is_alive():
                    return False
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(remaining if remaining is not None else 1.0)
            return True

    def request_flush(self) -> None:
        """Close the current group now instead of waiting (checkpoint, flush, close)."""
        with self._cond:
            self._flush_requested = True
            self._work.notify()

    def parked(self) -> bool:
        """Whether the journal thread waits for work: it takes records only
        once woken (a submit not of the inline owner, a wait, a flush)."""
        with self._cond:
            return self._parked

    def write_inline(self) -> bool:
        """Write and fdatasync the queued records on the calling thread if
        the journal thread is idle (nothing being written); True if it did.
        The caller becomes the *inline owner*: its later ``submit`` calls
        no longer wake the journal thread, so it must call this at the end
        of every loop turn (the bookie's loop does: ``after_step``).  Under
        load the thread is usually busy, and then picks the records up when
        its write ends.  Only without a group wait (``journal_group_wait_us``
        = 0): a wait is the thread's job.  A failure is recorded as the
        thread records its own (every waiter and later submit sees it).
        ``durable_fd`` is not signalled for a write done here: the caller
        learns it from the return value."""
        if self._wait_s > 0:
            return False
        with self._cond:
            self._inline_owner = threading.get_ident()
            if self._writing or not self._queue or self._failure is not None or self._closing:
                return False
            self._writing = True
            group = self._take_group()
        try:
            self._write_group(group, inline=True)  # ends the turn: waiters woken
        except BaseException as exc:  # noqa: BLE001 - reported to every waiter
            with self._cond:
                self._failure = exc.with_traceback(None)  # drop frames holding buffers
                self._writing = False
                self._cond.notify_all()
                self._work.notify()  # the thread ends: nothing is written after a failure
            self._signal()
        return True

    def drain_fd(self) -> None:
        try:
            os.eventfd_read(self.durable_fd)
        except BlockingIOError:
            pass

    @property
    def position(self) -> tuple[int, int]:
        """(segment id, aligned offset) just past the last durable write."""
        with self._cond:
            return self._segment_id, self._write_pos

    def failure(self) -> BaseException | None:
        return self._failure

    def close(self) -> None:
        """Write everything queued, stop the thread, close the files."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            self._work.notify()
        self._thread.join()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        os.close(self.durable_fd)
        self._buf.close()
        if self._zeros is not None:
            self._zeros.close()

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise BookieIOError(f"journal in {self.directory} failed: {self._failure}") \
                from self._failure
        if self._closing:
            raise BookieIOError(f"journal in {self.directory} is closed")

    # -- writer thread ---------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                group = self._next_group()
                if group is None:
                    return
                self._write_group(group)
        except BaseException as exc:  # noqa: BLE001 - reported to every waiter
            with self._cond:
                self._failure = exc.with_traceback(None)  # drop frames holding buffers
                self._cond.notify_all()
            self._signal()

    def _next_group(self) -> list | None:
        with self._cond:
            while (not self._queue or self._writing) and not self._closing \
                    and self._failure is None:
                if not self._writing and not self._queue and self._zero_wanted \
                        and self._zero_due():
                    self._zero_step()
                else:
                    self._parked = True
                    self._work.wait()
                    self._parked = False
            while self._writing:  # closing: the inline writer finishes first
                self._work.wait()
            if not self._queue or self._failure is not None:
                return None  # closed, or a write failed: nothing more is written, ever
            deadline = self._queue[0][3] + self._wait_s
            while (self._queued_bytes < self._opts.journal_group_bytes and not self._closing
                   and not self._flush_requested):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._work.wait(remaining)
            self._writing = True
            return self._take_group()

    def _take_group(self) -> list:
        limit = self._opts.journal_group_bytes
        fit = self._opts.journal_segment_bytes - ALIGN_BYTES
        group, total = [], 0
        while self._queue:
            seq, header, body, _t = self._queue[0]
            size = len(header) + len(body)
            if group and (total >= limit or aio.align_up(total + size) > fit):
                break
            self._queue.popleft()
            group.append((seq, header, body))
            total += size
        if not self._queue:
            self._flush_requested = False
        return group

    def _write_group(self, group: list, inline: bool = False) -> None:
        """Write and fdatasync ``group`` as the one writer and tell
        ``durable_fd``, unless ``inline`` (its caller learns it on return)."""
        buf = self._buf
        buf.reset()
        for _seq, header, body in group:
            buf.append(header)
            buf.append(body)
        view = buf.padded()
        if self._write_pos + len(view) > self._opts.journal_segment_bytes:
            self._roll()
        started = time.perf_counter()
        aio.write_aligned(self._fd, view, self._write_pos, self._path)
        aio.fdatasync(self._fd, self._path)
        self.sync_latency.observe(time.perf_counter() - started)
        written = buf.used_bytes
        st = self.stats
        st["journal_syncs"] += 1
        st["journal_bytes"] += written
        st["journal_records"] += len(group)
        self.group_records.observe(len(group))
        self.group_bytes.observe(written)
        with self._cond:
            self._write_pos += len(view)
            self.durable_seq = group[-1][0]
            self._queued_bytes -= written
            self._writing = False  # the other writer (thread or inline) may go
            self._cond.notify_all()
            self._zero_wanted = (inline or self._wait_s > 0) and written <= SMALL_GROUP_BYTES
            if self._queue or self._closing or (self._zero_wanted and self._zero_due()):
                self._work.notify()  # work for the thread
        if not inline:
            self._signal()

    def _zero_due(self) -> bool:
        """Whether a zero step is due: less than half of ``ZERO_AHEAD_BYTES``
        is zeroed past the write position of a preallocated direct segment
        (exact holding the lock; a hint without it)."""
        return self._zero_ok and self._zeroed_end - self._write_pos < ZERO_AHEAD_BYTES // 2 \
            and self._zeroed_end < self._opts.journal_segment_bytes

    def _zero_step(self) -> bool:
        """(The journal thread, holding the lock, nothing queued or being
        written) zero up to ``ZERO_STEP_BYTES`` past what is zeroed, as the
        writer.  A failed zero write only stops the zeroing (no record was
        touched; the next record write finds the fault): False."""
        start = max(self._zeroed_end, self._write_pos)
        end = min(start + ZERO_STEP_BYTES, self._opts.journal_segment_bytes)
        fd, path = self._fd, self._path
        if self._zeros is None:
            self._zeros = aio.AlignedBuffer(ZERO_STEP_BYTES)
        self._writing = True
        self._cond.release()
        try:
            aio.write_aligned(fd, self._zeros.view[:end - start], start, path)
        except BookieIOError as exc:
            log.warning("journal %s: zero-filling ahead failed (%s); writes go on without "
                        "it", path, exc)
            end = -1
        finally:
            self._cond.acquire()
            self._writing = False
        if end < 0:
            self._zero_ok = False
            return False
        self._zeroed_end = max(self._zeroed_end, end)
        return True

    def _signal(self) -> None:
        try:
            os.eventfd_write(self.durable_fd, 1)
        except OSError:
            pass

    # -- segments --------------------------------------------------------------
    def _roll(self) -> None:
        prev_end = self._write_pos
        os.close(self._fd)
        self._fd = -1
        self._open_segment(self._segment_id + 1, prev_end)

    def _open_segment(self, segment_id: int, prev_end: int) -> None:
        """Create, preallocate and header a new segment atomically."""
        path = segment_path(self.directory, segment_id)
        invariant(not os.path.exists(path), f"journal segment {path} already exists")
        tmp = path + ".tmp"
        if os.path.exists(tmp):
            os.unlink(tmp)
        fd = aio.open_for_write(tmp, self._direct)
        try:
            preallocated = _preallocate(fd, self._opts.journal_segment_bytes, tmp)
            page = aio.AlignedBuffer(ALIGN_BYTES)
            page.append(pack_file_header(SEGMENT_MAGIC, segment_id, prev_end, self._instance))
            aio.write_aligned(fd, page.padded(), 0, tmp)
            page.close()
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        os.rename(tmp, path)
        aio.fsync_dir(self.directory)
        with self._cond:
            self._fd, self._path = fd, path
            self._segment_id, self._write_pos = segment_id, ALIGN_BYTES
            self._zeroed_end, self._zero_ok = ALIGN_BYTES, self._direct and preallocated
        self.stats["journal_segments_created"] += 1

    def delete_segments_before(self, segment_id: int) -> int:
        """Free segments wholly before a checkpoint mark; returns how many.

        Each segment is shrunk ``FREE_STEP_BYTES`` at a time with a
        ``FREE_PAUSE_S`` pause between steps before it is unlinked: freeing a
        preallocated segment's extents at once made every fdatasync on the
        disk wait (64 KB adds: a ~0.5 s stall of all bookies at each
        checkpoint).  Segments before the mark are never replayed, so a crash
        midway leaves only a shorter garbage file, deleted next time."""
        removed = 0
        for sid in list_segments(self.directory):
            if sid < segment_id:
                path = segment_path(self.directory, sid)
                _shrink_gradually(path)
                os.unlink(path)
                removed += 1
        if removed:
            aio.fsync_dir(self.directory)
        return removed


def _preallocate(fd: int, nbytes: int, path: str) -> bool:
    """Reserve a new segment's space (True); on a nearly full disk, reserve none:
    the segment then grows as it is written (the records still fit while
    there is room), instead of the journal failing a whole group for lack
    of a 64 MiB reservation while megabytes are free, or taking the last
    room a full bookie's reopen needs (twice ``STORAGE_RESERVE_BYTES`` is
    left free)."""
    st = os.fstatvfs(fd)
    if st.f_bavail * st.f_frsize < nbytes + 2 * limits.STORAGE_RESERVE_BYTES:
        log.warning("journal segment %s: the disk is nearly full; not preallocated, it "
                    "grows as written", path)
        return False
    try:
        os.posix_fallocate(fd, 0, nbytes)
    except OSError as exc:
        if exc.errno not in aio.FULL_ERRNOS:
            raise
        os.ftruncate(fd, 0)  # give back whatever it reserved before failing
        log.warning("journal segment %s: no room to preallocate %d bytes (%s); it grows as "
                    "written", path, nbytes, exc)
        return False
    return True


def trim_tail(path: str, end_offset: int) -> int:
    """Cut a closed segment after ``end_offset`` (its valid end, aligned):
    what lies past it is never read (a new segment starts on every open)
    but holds its preallocated space.  Returns the bytes given back."""
    size = os.stat(path).st_size
    if size <= end_offset:
        return 0
    os.truncate(path, end_offset)
    return size - end_offset


def _shrink_gradually(path: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        while size > FREE_STEP_BYTES:
            size -= FREE_STEP_BYTES
            os.ftruncate(fd, size)
            time.sleep(FREE_PAUSE_S)
    finally:
        os.close(fd)
