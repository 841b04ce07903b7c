"""Entry logs: the ledger device's data files, entries of many ledgers
interleaved in one active log, written with O_DIRECT from an aligned buffer.

Guarantees:

* Blocks (see ``codec``) are appended to a page-aligned buffer and written
  as whole 4 KiB pages at aligned offsets; a partial page is zero-padded and
  the next write starts at the next page, so durable bytes are never
  rewritten (a torn write can only hit bytes that were never synced).
* ``sync()`` makes every block appended so far durable (write + fdatasync of
  every log touched since the last sync); until then a block may be lost, but
  never half-served: reads verify the record header and checksum.
* Reads of blocks still in the buffer are served from memory.
* A new log is started on every open (never appending to a log a crash may
  have torn) and when the active one would pass ``entry_log_rotate_bytes``.
* Each log carries a 4 KiB header (magic, log id, bookie instance, CRC); a
  scan verifies each block and stops at the first invalid one.

The manager is the seam for BP-32 (one log per ledger): the facade only calls
``append_block``, ``read_record``, ``flush``, ``sync`` (or ``begin_sync`` under
its lock then ``finish_sync`` outside it), ``position`` and ``scan_from``; a
per-ledger manager can implement the same methods.  What both managers
share (the background writer, read descriptors, the descriptors to sync,
``sync``, ``read_record``) is ``EntryLogManager``; each says where a block
goes and which of its logs are still written to.
Per-log, per-ledger byte counts (``ledger_bytes``) feed later GC/compaction.
"""

from __future__ import annotations

import collections
import os
import random
import re

from appliance.protocol import limits
from appliance.protocol.errors import BookieIOError, CorruptRecordError

from . import aligned_io as aio
from .codec import (
    BLOCK_HEADER_BYTES,
    pack_file_header,
    parse_block,
    parse_block_header,
    unpack_file_header,
)
from .log_writer import BackgroundWriter
from .options import ALIGN_BYTES, StorageOptions

LOG_MAGIC = b"BKELOG01"
_LOG_RE = re.compile(r"^entrylog-(\d{10})\.log$")


class SyncToken:
    """What ``begin_sync`` handed to ``finish_sync``: the number of writes to
    wait for and the (descriptor, path) pairs to fdatasync (owned: closed after)."""

    __slots__ = ("jobs", "fds")

    def __init__(self, jobs: int, fds: list[tuple[int, str]]):
        self.jobs, self.fds = jobs, fds

    def finish(self, writer) -> None:
        """Wait for ``writer`` to have done the token's writes, fdatasync its
        logs, close their descriptors (also on failure)."""
        try:
            writer.wait_done(self.jobs)
            for fd, path in self.fds:
                aio.fdatasync(fd, path)
        finally:
            for fd, _path in self.fds:
                os.close(fd)
            self.fds = []


def log_path(directory: str, log_id: int) -> str:
    return os.path.join(directory, f"entrylog-{log_id:010d}.log")


def list_logs(directory: str) -> list[int]:
    return sorted(int(m.group(1)) for m in map(_LOG_RE.match, os.listdir(directory)) if m)


def create_log(directory: str, log_id: int, instance: bytes, direct: bool) -> int:
    """Create a log whole (temp file, header, fsync, rename, dir fsync): a
    crash never leaves a headerless log.  Returns its write descriptor."""
    path = log_path(directory, log_id)
    if os.path.exists(path):
        raise BookieIOError(f"entry log {path} already exists")
    tmp = path + ".tmp"
    if os.path.exists(tmp):
        os.unlink(tmp)
    fd = aio.open_for_write(tmp, direct)
    try:
        page = aio.AlignedBuffer(ALIGN_BYTES)
        page.append(pack_file_header(LOG_MAGIC, log_id, 0, instance))
        aio.write_aligned(fd, page.padded(), 0, tmp)
        page.close()
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        raise
    os.rename(tmp, path)
    aio.fsync_dir(directory)
    return fd


def read_through_buffer(readers: LogReaders, log_id: int, offset: int, nbytes: int,
                        file_off: int, buf) -> bytes:
    """Bytes of an open log that reach past ``file_off`` (what its file holds
    so far): the written part from the file, the rest from its buffer."""
    head = b""
    if offset < file_off:  # straddles the written part and the buffer
        head = readers.pread(log_id, offset, file_off - offset)
        nbytes -= file_off - offset
        offset = file_off
    start = offset - file_off
    if start + nbytes > buf.used_bytes:
        raise CorruptRecordError(f"index points past the end of entry log {log_id}")
    return head + bytes(buf.view[start:start + nbytes])


class LogReaders:
    """Read descriptors of a directory's entry logs, the least recently used
    closed past ``limits.STORAGE_READ_FDS_MAX``.  Not thread-safe (the storage lock)."""

    def __init__(self, directory: str):
        self.directory = directory
        self._fds: collections.OrderedDict[int, int] = collections.OrderedDict()

    def pread(self, log_id: int, offset: int, nbytes: int) -> bytes:
        fd = self._fd(log_id)
        try:
            return os.pread(fd, nbytes, offset)
        except OSError as exc:
            raise BookieIOError(f"read of {log_path(self.directory, log_id)} at {offset} "
                                f"failed: {exc}") from exc

    def _fd(self, log_id: int) -> int:
        fd = self._fds.get(log_id)
        if fd is not None:
            self._fds.move_to_end(log_id)
            return fd
        path = log_path(self.directory, log_id)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError as exc:
            raise CorruptRecordError(f"entry log {path} is missing") from exc
        self._fds[log_id] = fd
        if len(self._fds) > limits.STORAGE_READ_FDS_MAX:
            _old, old_fd = self._fds.popitem(last=False)
            os.close(old_fd)
        return fd

    def forget(self, log_id: int) -> None:
        fd = self._fds.pop(log_id, None)
        if fd is not None:
            os.close(fd)

    def close_all(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


class EntryLogManager:
    """What both entry-log managers share: the background writer (one write
    in flight), the logs' read descriptors, the write descriptors of logs
    written since the last sync, per-log ledger byte counts and the write
    counters; ``sync``, ``finish_sync`` and ``read_record`` over them.

    A subclass says where a block goes (``append_block``, ``flush``), which
    logs are open and what their unwritten tail is (``_open_tail``), which
    descriptors it still writes to (``_still_written``), what it releases
    (``_release_all``) and may do more once the writer is idle
    (``_wait_writer_idle``)."""

    def __init__(self, directory: str, options: StorageOptions, instance: bytes,
                 direct: bool, writer: BackgroundWriter):
        self.directory = directory
        self._opts = options
        self._instance = instance
        self._direct = direct
        self._inflight: tuple[int, int, int] | None = None  # log id, offset, bytes
        self._writer = writer
        self._readers = LogReaders(directory)
        self._unsynced: dict[int, int] = {}  # log id -> write fd, written since last sync
        self.ledger_bytes: dict[int, dict[int, int]] = {}
        self.stats = {"entry_log_writes": 0, "entry_log_bytes": 0, "entry_log_syncs": 0,
                      "entry_logs_created": 0}

    def flush(self) -> None:
        raise NotImplementedError

    def _read_buffered(self, log_id: int, offset: int, nbytes: int) -> bytes | None:
        """The record's bytes when they reach into an open log's unwritten
        buffer (``read_through_buffer``), else None: the file holds them."""
        raise NotImplementedError

    def _still_written(self, log_id: int, fd: int) -> bool:
        """Whether ``fd`` stays open after a sync (its log is still appended to)."""
        raise NotImplementedError

    def _release_all(self) -> None:
        """Close every descriptor and buffer (the writer is closed)."""
        raise NotImplementedError

    def _wait_writer_idle(self) -> None:
        self._writer.wait_idle()
        self._inflight = None

    def _submit(self, view, log_id: int, fd: int, file_off: int, path: str,
                used_bytes: int) -> int:
        """Hand ``view`` (``used_bytes`` of blocks, padded) to the writer at
        ``file_off``; returns the log's file offset after it."""
        padded_bytes = len(view)
        self._writer.submit(view, fd, file_off, path)
        self._inflight = (log_id, file_off, padded_bytes)
        self.stats["entry_log_writes"] += 1
        self.stats["entry_log_bytes"] += used_bytes
        self._unsynced[log_id] = fd
        return file_off + padded_bytes

    def note_ledger_bytes(self, log_id: int, ledger_id: int, nbytes: int) -> None:
        per_log = self.ledger_bytes.setdefault(log_id, {})
        per_log[ledger_id] = per_log.get(ledger_id, 0) + nbytes

    def forget_log(self, log_id: int) -> None:
        """Drop a removed log's read descriptor and byte counts (caller holds the
        storage lock; the log is sealed: never the active or an unsynced one)."""
        self._readers.forget(log_id)
        self.ledger_bytes.pop(log_id, None)

    def failure(self) -> BaseException | None:
        return self._writer.failure()

    def sync(self) -> None:
        """Make every block appended so far durable (open logs stay open)."""
        self.flush()
        self._wait_writer_idle()
        for log_id, fd in list(self._unsynced.items()):
            aio.fdatasync(fd, log_path(self.directory, log_id))
            if not self._still_written(log_id, fd):  # rotated: nobody writes it any more
                os.close(fd)
            del self._unsynced[log_id]
        self.stats["entry_log_syncs"] += 1

    def finish_sync(self, token: SyncToken) -> None:
        """Wait for the token's writes and fdatasync its logs; closes its fds."""
        token.finish(self._writer)

    def read_record(self, log_id: int, offset: int, nbytes: int) -> bytes:
        """Raw bytes of one record (header + data); verification is the caller's."""
        if self._inflight is not None:
            in_log, in_off, in_len = self._inflight
            if log_id == in_log and offset < in_off + in_len and offset + nbytes > in_off:
                self._wait_writer_idle()  # the range is being written: let it land
        raw = self._read_buffered(log_id, offset, nbytes)
        return self._readers.pread(log_id, offset, nbytes) if raw is None else raw

    def close(self) -> None:
        """Sync and close every file (the caller checkpoints first)."""
        try:
            self.sync()
        finally:
            self._writer.close()
            self._release_all()

    def abandon(self) -> None:
        """Close descriptors without writing the buffers (tests: simulate a crash)."""
        self._writer.close()
        self._release_all()


class EntryLogger(EntryLogManager):
    """The interleaved entry-log manager (one active log for all ledgers)."""

    def __init__(self, directory: str, options: StorageOptions, instance: bytes,
                 direct: bool, log_id: int):
        self._buf = aio.AlignedBuffer(options.entry_log_buffer_bytes)
        self._spare = aio.AlignedBuffer(options.entry_log_buffer_bytes)
        super().__init__(directory, options, instance, direct,
                         BackgroundWriter("entry-log-writer",
                                          options.entry_log_write_slice_bytes))
        # The buffer is handed over at a random fill between half and all of
        # it: the bookies of an ensemble get the same bytes, and writing their
        # entry logs at the same moment made all their journal syncs wait
        # behind those writes together (a latency spike every 4 MiB that the
        # ack quorum could not hide).  One bookie's pause alone it hides.
        self._rng = random.Random()
        self._flush_at = self._next_flush_at()
        self._fd = -1
        self._start_log(log_id)

    # -- writes ----------------------------------------------------------------
    def append_block(self, block) -> tuple[int, int]:
        """Append one verified-format block; returns (log id, offset of block)."""
        size = len(block)
        if self._file_off + self._buf.used_bytes + size > self._opts.entry_log_rotate_bytes:
            self._rotate()
        if size > self._buf.room() or self._buf.used_bytes + size > self._flush_at:
            self.flush()
        if size > self._buf.capacity_bytes:
            return self._write_oversized(block)
        offset = self._file_off + self._buf.append(block)
        return self.log_id, offset

    def flush(self) -> None:
        """Hand the buffer (zero-padded to a page) to the background writer and
        continue in the spare buffer; no sync.  Reads of the handed-over range
        wait for its write (``read_record``)."""
        if not self._buf.used_bytes:
            return
        view = self._buf.padded()
        self._file_off = self._submit(view, self.log_id, self._fd, self._file_off, self._path,
                                      self._buf.used_bytes)
        del view
        self._buf, self._spare = self._spare, self._buf
        self._buf.reset()
        self._flush_at = self._next_flush_at()

    def _next_flush_at(self) -> int:
        capacity = self._buf.capacity_bytes
        return capacity - self._rng.randrange(capacity // 2 + 1)

    def _still_written(self, log_id: int, fd: int) -> bool:
        return fd == self._fd

    def begin_sync(self) -> SyncToken:
        """The first half of ``sync()`` for a checkpoint, under the caller's
        lock: hand the buffer over and take the descriptors written since the
        last sync.  ``finish_sync`` (without the lock, while appends go on)
        then makes every block appended before this call durable."""
        self.flush()
        fds = []
        for log_id, fd in list(self._unsynced.items()):
            path = log_path(self.directory, log_id)
            if fd == self._fd:  # still appended to: sync a duplicate, the log keeps its own
                fds.append((os.dup(fd), path))
            else:  # rotated away: nobody else touches it any more, the token owns it
                del self._unsynced[log_id]
                fds.append((fd, path))
        self.stats["entry_log_syncs"] += 1
        return SyncToken(self._writer.submitted_jobs, fds)

    @property
    def position(self) -> tuple[int, int]:
        """(active log id, offset of the next block once the buffer is written)."""
        return self.log_id, aio.align_up(self._file_off + self._buf.used_bytes)

    def _write_oversized(self, block) -> tuple[int, int]:
        self._writer.wait_idle()
        big = aio.AlignedBuffer(len(block))
        try:
            big.append(block)
            offset = self._file_off
            padded_len = aio.align_up(len(block))
            aio.write_aligned(self._fd, big.padded(), offset, self._path)
            self._file_off += padded_len
            self._unsynced[self.log_id] = self._fd
            self.stats["entry_log_writes"] += 1
            self.stats["entry_log_bytes"] += len(block)
        finally:
            big.close()
        return self.log_id, offset

    def rotate(self) -> None:
        """Seal the active log and start the next one, if it holds any block."""
        if self._file_off + self._buf.used_bytes > ALIGN_BYTES:
            self._rotate()

    def _rotate(self) -> None:
        self.flush()
        self._unsynced.setdefault(self.log_id, self._fd)
        # The old fd stays in _unsynced until the next sync() closes it.
        self._fd = -1
        self._start_log(self.log_id + 1)

    def _start_log(self, log_id: int) -> None:
        fd = create_log(self.directory, log_id, self._instance, self._direct)
        self.log_id, self._fd, self._file_off = log_id, fd, ALIGN_BYTES
        self._path = log_path(self.directory, log_id)
        self.stats["entry_logs_created"] += 1

    # -- reads -----------------------------------------------------------------
    def _read_buffered(self, log_id: int, offset: int, nbytes: int) -> bytes | None:
        if log_id == self.log_id and offset + nbytes > self._file_off:
            return read_through_buffer(self._readers, log_id, offset, nbytes, self._file_off,
                                       self._buf)
        return None

    # -- lifecycle ---------------------------------------------------------------
    def _release_all(self) -> None:
        self._spare.close()
        self._readers.close_all()
        for fd in self._unsynced.values():
            if fd != self._fd:
                os.close(fd)
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = -1
        self._unsynced.clear()
        self._buf.close()


def scan_log(directory: str, log_id: int, start: int, on_block) -> int:
    """Feed each valid block of a log from ``start`` to ``on_block(offset, info, raw)``.

    Reads through a sliding window, so memory stays bounded whatever the log
    size.  Returns the offset where the scan stopped (first invalid block or end)."""
    path = log_path(directory, log_id)
    with open(path, "rb") as f:
        fd = f.fileno()
        if unpack_file_header(os.pread(fd, ALIGN_BYTES, 0), LOG_MAGIC) is None:
            raise CorruptRecordError(f"entry log {path} has no valid header: move it away "
                                     f"(its entries are lost) or restore it")
        size = os.fstat(fd).st_size
        win = aio.FileWindow(fd, size)
        pos = max(start, ALIGN_BYTES)
        while pos < size:
            buf, rel = win.get(pos, BLOCK_HEADER_BYTES)
            if buf[rel] == 0:  # padding (a block's first byte is never 0); see codec
                aligned = aio.align_up(pos)
                if aligned == pos:
                    break
                pos = aligned
                continue
            head = parse_block_header(buf, rel)
            if head is None:
                break
            buf, rel = win.get(pos, min(head[0], size - pos))
            info = parse_block(buf, rel)
            if info is None:
                break
            on_block(pos, info, memoryview(buf)[rel:rel + info.block_len])
            pos += info.block_len
    return pos
