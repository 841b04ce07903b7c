"""BP-32: one entry log per ledger.  The same interface as ``entry_log.EntryLogger``
(the facade cannot tell them apart; both are an ``entry_log.EntryLogManager``,
which holds their shared writer, sync and read code), but each ledger appends
to a log of its own, so a deleted ledger's space comes back by removing whole
files (GC) instead of compaction.

Guarantees (in addition to ``entry_log``'s: whole aligned pages, durable
bytes never rewritten, reads of buffered blocks from memory, a scan stops at
the first invalid block):

* Each block goes to the open log of its *first record's* ledger.  The
  facade splits add batches per ledger in this mode, so a log holds one
  ledger; a mixed block (journal replay of data written in interleaved mode)
  lands in its first ledger's log and ``ledger_bytes`` still records every
  ledger it holds, so GC stays exact.
* Log ids come from one counter: unique, and a log created later has a
  larger id.
* **Mark rule.**  ``begin_sync`` (a checkpoint, under the storage lock)
  rotates every open log, so ``position`` is then ``(next id, 0)``: every
  block appended after the checkpoint's marks goes to a log created after
  them, i.e. at or past the mark.  Recovery's scan-from-mark and GC's
  "before the mark means sealed and synced" rule therefore hold unchanged.
  (``position`` with logs open is ``(oldest open log, its end)``, which is
  also a correct mark, only a slower one to scan from.)
* **Bounds.**  At most ``entry_logs_open_max`` logs are open: opening one
  more rotates the least recently appended one.  A log not appended to for
  ``entry_log_idle_ms`` is rotated (checked on appends and by
  ``expire_idle``, which the checkpointer calls).  Memory: each open log owns
  one page-aligned buffer of ``entry_log_ledger_buffer_bytes``; one more
  buffer (or one block bigger than a buffer, written from its own aligned
  copy) is in flight at the background writer, and at most
  ``limits.STORAGE_SPARE_BUFFERS_MAX`` spares are kept: (open_max + 1 + spares) x buffer +
  one block.
* Rotation does not create a file: the buffer is handed to the writer, the
  descriptor waits in the unsynced set for the next sync (its fdatasync), and
  the ledger's next block opens a new log.  Rotation causes (counted in
  ``stats``): write-close, idle, cap, checkpoint, size.

One background writer serves every log, one write at a time, so per-log
buffers are written in the order they filled.
"""

from __future__ import annotations

import collections
import os
import struct
import time

import numpy as np

from appliance.protocol import limits

from . import aligned_io as aio
from .codec import BLOCK_HEADER_BYTES
from .entry_log import EntryLogManager, SyncToken, create_log, log_path, read_through_buffer
from .log_writer import BackgroundWriter
from .options import ALIGN_BYTES, StorageOptions

ROTATE_REASONS = ("write_close", "idle", "cap", "checkpoint", "size", "compaction")
_FIRST_LEDGER = struct.Struct("<Q")


class _OpenLog:
    __slots__ = ("log_id", "ledger_id", "fd", "path", "file_off", "buf", "last_used_s")

    def __init__(self, log_id, ledger_id, fd, path, buf, now_s):
        self.log_id, self.ledger_id, self.fd, self.path = log_id, ledger_id, fd, path
        self.file_off, self.buf, self.last_used_s = ALIGN_BYTES, buf, now_s


class PerLedgerEntryLogger(EntryLogManager):
    """Entry-log manager with one open log per ledger (see the module docstring)."""

    def __init__(self, directory: str, options: StorageOptions, instance: bytes,
                 direct: bool, log_id: int, clock=time.monotonic):
        super().__init__(directory, options, instance, direct,
                         BackgroundWriter("entry-log-writer"))
        self._clock = clock
        self._next_id = log_id
        self._open: collections.OrderedDict[int, _OpenLog] = collections.OrderedDict()  # LRU
        self._by_log: dict[int, _OpenLog] = {}
        self._spares: list[aio.AlignedBuffer] = []
        self._inflight_buf: aio.AlignedBuffer | None = None
        self.stats.update({"entry_logs_open": 0, "entry_log_buffers_bytes": 0,
                           **{f"entry_logs_rotated_{r}": 0 for r in ROTATE_REASONS}})

    # -- writes ----------------------------------------------------------------
    def append_block(self, block) -> tuple[int, int]:
        """Append one block to its ledger's log; returns (log id, offset)."""
        ledger_id = _FIRST_LEDGER.unpack_from(block, BLOCK_HEADER_BYTES)[0]
        now = self._clock()
        self.expire_idle(now)
        size = len(block)
        lg = self._open.get(ledger_id)
        if lg is not None and lg.file_off + lg.buf.used_bytes + size > \
                self._opts.entry_log_rotate_bytes:
            self._rotate(lg, "size")
            lg = None
        if lg is None:
            lg = self._open_log(ledger_id, now)
        else:
            self._open.move_to_end(ledger_id)
        lg.last_used_s = now
        if size > lg.buf.room():
            self._flush_log(lg)
        if size > lg.buf.capacity_bytes:
            return self._write_oversized(lg, block)
        return lg.log_id, lg.file_off + lg.buf.append(block)

    def write_close(self, ledger_id: int) -> bool:
        """BP-32: the ledger's writer is done: rotate its log now (no file is
        created; the next checkpoint syncs it).  False if none was open."""
        lg = self._open.get(ledger_id)
        if lg is None:
            return False
        self._rotate(lg, "write_close")
        return True

    def expire_idle(self, now_s: float | None = None) -> int:
        """Rotate logs not appended to for ``entry_log_idle_ms``; returns how many."""
        now_s = self._clock() if now_s is None else now_s
        idle_s = self._opts.entry_log_idle_ms / 1000.0
        count = 0
        while self._open:
            lg = next(iter(self._open.values()))  # least recently used first
            if now_s - lg.last_used_s < idle_s:
                break
            self._rotate(lg, "idle")
            count += 1
        return count

    def rotate(self) -> None:
        """Seal every open log (compaction: so they can be candidates)."""
        for lg in list(self._open.values()):
            self._rotate(lg, "compaction")

    @property
    def open_log_count(self) -> int:
        return len(self._open)

    def active_log(self, ledger_id: int) -> int | None:
        """The id of the ledger's open log, or None."""
        lg = self._open.get(ledger_id)
        return None if lg is None else lg.log_id

    def flush(self) -> None:
        """Hand every open log's buffer to the writer (no sync)."""
        for lg in list(self._open.values()):
            self._flush_log(lg)

    def _still_written(self, log_id: int, fd: int) -> bool:
        return log_id in self._by_log

    def begin_sync(self) -> SyncToken:
        """Under the storage lock: rotate every open log (the mark rule), and
        hand their descriptors to the token; ``finish_sync`` makes every block
        appended before this call durable."""
        for lg in list(self._open.values()):
            self._rotate(lg, "checkpoint")
        fds = [(fd, log_path(self.directory, log_id)) for log_id, fd in self._unsynced.items()]
        self._unsynced.clear()
        self.stats["entry_log_syncs"] += 1
        return SyncToken(self._writer.submitted_jobs, fds)

    @property
    def position(self) -> tuple[int, int]:
        """A correct entry-log mark: every later block lands at or after it."""
        if not self._open:
            return self._next_id, 0
        lg = min(self._open.values(), key=lambda o: o.log_id)
        return lg.log_id, lg.file_off + lg.buf.used_bytes  # its next block starts here

    # -- internals -------------------------------------------------------------
    def _open_log(self, ledger_id: int, now_s: float) -> _OpenLog:
        while len(self._open) >= self._opts.entry_logs_open_max:
            self._rotate(next(iter(self._open.values())), "cap")
        log_id = self._next_id
        fd = create_log(self.directory, log_id, self._instance, self._direct)
        self._next_id += 1
        lg = _OpenLog(log_id, ledger_id, fd, log_path(self.directory, log_id),
                      self._take_buffer(), now_s)
        self._open[ledger_id] = lg
        self._by_log[log_id] = lg
        self.stats["entry_logs_created"] += 1
        self._count_open()
        return lg

    def _rotate(self, lg: _OpenLog, reason: str) -> None:
        self._flush_log(lg)
        del self._open[lg.ledger_id]
        del self._by_log[lg.log_id]
        self._give_buffer(lg.buf)
        lg.buf = None
        if lg.log_id not in self._unsynced:  # nothing written since its header: done
            os.close(lg.fd)
        self.stats[f"entry_logs_rotated_{reason}"] += 1
        self._count_open()

    def _flush_log(self, lg: _OpenLog) -> None:
        buf = lg.buf
        if not buf.used_bytes:
            return
        view = buf.padded()
        lg.file_off = self._submit(view, lg.log_id, lg.fd, lg.file_off, lg.path, buf.used_bytes)
        del view
        self._give_buffer(self._inflight_buf)  # submit waited: its write is done
        self._inflight_buf = buf
        lg.buf = self._take_buffer()

    def _write_oversized(self, lg: _OpenLog, block) -> tuple[int, int]:
        """A block bigger than a log buffer, written from its own aligned copy
        by the background writer (it is the one write in flight)."""
        big = aio.AlignedBuffer(len(block))
        big.append(block)
        offset = lg.file_off
        view = big.padded()
        lg.file_off = self._submit(view, lg.log_id, lg.fd, lg.file_off, lg.path, len(block))
        del view
        self._give_buffer(self._inflight_buf)
        self._inflight_buf = big
        return lg.log_id, offset

    def _wait_writer_idle(self) -> None:
        super()._wait_writer_idle()
        self._give_buffer(self._inflight_buf)
        self._inflight_buf = None

    def _take_buffer(self) -> aio.AlignedBuffer:
        if self._spares:
            buf = self._spares.pop()
        else:
            buf = aio.AlignedBuffer(self._opts.entry_log_ledger_buffer_bytes)
            self.stats["entry_log_buffers_bytes"] += buf.capacity_bytes
        buf.reset()
        return buf

    def _give_buffer(self, buf: aio.AlignedBuffer | None) -> None:
        if buf is None:
            return
        if buf.capacity_bytes == aio.align_up(self._opts.entry_log_ledger_buffer_bytes) \
                and len(self._spares) < limits.STORAGE_SPARE_BUFFERS_MAX:
            self._spares.append(buf)
            return
        if buf.capacity_bytes == aio.align_up(self._opts.entry_log_ledger_buffer_bytes):
            self.stats["entry_log_buffers_bytes"] -= buf.capacity_bytes
        buf.close()

    def _count_open(self) -> None:
        self.stats["entry_logs_open"] = len(self._open)

    # -- reads -----------------------------------------------------------------
    def _read_buffered(self, log_id: int, offset: int, nbytes: int) -> bytes | None:
        lg = self._by_log.get(log_id)
        if lg is not None and offset + nbytes > lg.file_off:
            return read_through_buffer(self._readers, log_id, offset, nbytes, lg.file_off,
                                       lg.buf)
        return None

    # -- lifecycle ---------------------------------------------------------------
    def _release_all(self) -> None:
        self._readers.close_all()
        fds = set(self._unsynced.values())
        fds |= {lg.fd for lg in self._open.values()}
        for fd in fds:
            os.close(fd)
        for lg in self._open.values():
            lg.buf.close()
        for buf in self._spares + ([self._inflight_buf] if self._inflight_buf else []):
            buf.close()
        self._open.clear()
        self._by_log.clear()
        self._unsynced.clear()
        self._spares, self._inflight_buf = [], None
        self._count_open()


def split_by_ledger(ledgers, entries, datas: list, lengths):
    """An add batch as per-ledger groups (each ledger's entries keep their
    order): [(ledgers, entries, datas, lengths), ...].  One group if the batch
    holds one ledger (the usual case: ADD_PACKED carries one ledger)."""
    if ledgers[0] == ledgers[-1] and (len(ledgers) < 3 or ledgers.min() == ledgers.max()):
        return [(ledgers, entries, datas, lengths)]
    order = np.argsort(ledgers, kind="stable")
    ledgers, entries, lengths = ledgers[order], entries[order], lengths[order]
    datas = [datas[i] for i in order.tolist()]
    cuts = [0, *(np.flatnonzero(ledgers[1:] != ledgers[:-1]) + 1).tolist(), len(datas)]
    return [(ledgers[a:b], entries[a:b], datas[a:b], lengths[a:b])
            for a, b in zip(cuts, cuts[1:], strict=False)]
