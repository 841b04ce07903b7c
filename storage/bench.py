"""Storage benchmark: durable adds through ``LedgerStorage`` in one process,
with the raw disk measured in the same run (a plain fdatasync loop and plain
O_DIRECT sequential writes in the same directory), so results read as ratios.

How an add is counted: the bench submits batches of ``batch_bytes`` with
``add_entries`` (at most ``window`` batches in flight, like a bookie with
pipelined clients) and an entry counts once its ticket is durable (journal
fdatasync'ed).  Its latency runs from the start of its ``add_entries`` call
to the moment the bench observed ``durable_ticket`` covering it.  MB are
10**6 bytes of entry data (journal and entry log each write that much again).
"""

from __future__ import annotations

import collections
import os
import shutil
import tempfile
import time

import numpy as np
import psutil

from . import aligned_io as aio
from .ledger_storage import LedgerStorage
from .options import MiB, StorageOptions

BASELINE_FILE_BYTES = 256 * MiB  # bound on the baseline files' size


def disk_fdatasync_per_s(directory: str, duration_s: float) -> float:
    """4 KiB appends into a preallocated file, one fdatasync each."""
    path = os.path.join(directory, "baseline-fdatasync")
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    try:
        os.posix_fallocate(fd, 0, 64 * MiB)
        os.fsync(fd)
        page, count, offset = b"\xa5" * 4096, 0, 0
        start = time.perf_counter()
        while time.perf_counter() - start < duration_s and offset < 64 * MiB:
            os.pwrite(fd, page, offset)
            os.fdatasync(fd)
            offset += 4096
            count += 1
        return count / (time.perf_counter() - start)
    finally:
        os.close(fd)
        os.unlink(path)


def disk_direct_mb_per_s(directory: str, duration_s: float) -> float | None:
    """Sequential 4 MiB O_DIRECT writes (+ a final fdatasync); None if refused."""
    if not aio.probe_direct_io(directory):
        return None
    path = os.path.join(directory, "baseline-direct")
    buf = aio.AlignedBuffer(4 * MiB)
    buf.append(os.urandom(4 * MiB))
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC | os.O_DIRECT, 0o644)
    try:
        written = 0
        start = time.perf_counter()
        while time.perf_counter() - start < duration_s and written < BASELINE_FILE_BYTES:
            written += os.pwrite(fd, buf.view, written)
        os.fdatasync(fd)
        return written / (time.perf_counter() - start) / 1e6
    finally:
        os.close(fd)
        os.unlink(path)
        buf.close()


class _Pending:
    """Batches in flight: (ticket, entries, start time); completes them in order."""

    def __init__(self):
        self.queue: collections.deque = collections.deque()
        self.latencies_s: list[float] = []
        self.weights: list[int] = []
        self.done_entries = 0
        self.last_done_t = 0.0

    def complete_upto(self, durable: int) -> None:
        now = time.perf_counter()
        while self.queue and self.queue[0][0] <= durable:
            _ticket, count, started = self.queue.popleft()
            self.latencies_s.append(now - started)
            self.weights.append(count)
            self.done_entries += count
            self.last_done_t = now

    def percentile_ms(self, q: float) -> float:
        lat = np.repeat(np.asarray(self.latencies_s), np.asarray(self.weights))
        return float(np.percentile(lat, q) * 1e3) if len(lat) else 0.0


def _drive(st: LedgerStorage, size: int, entries: int | None, duration_s: float,
           batch_bytes: int, window: int) -> tuple[_Pending, float]:
    per_batch = max(1, batch_bytes // max(size, 1))
    payload = os.urandom(size)
    datas = [payload] * per_batch
    ledgers = np.arange(per_batch, dtype=np.int64) % 4  # four interleaved ledgers
    next_entry = 0
    pending = _Pending()
    start = time.perf_counter()
    while (next_entry < entries) if entries else (time.perf_counter() - start < duration_s):
        n = per_batch if not entries else min(per_batch, entries - next_entry)
        ids = np.arange(next_entry, next_entry + n, dtype=np.int64) // 4
        t0 = time.perf_counter()
        ticket = st.add_entries(ledgers[:n], ids, datas[:n])
        pending.queue.append((ticket, n, t0))
        next_entry += n
        pending.complete_upto(st.durable_ticket)
        while len(pending.queue) >= window:
            st.wait_durable(pending.queue[0][0], timeout_s=60)
            pending.complete_upto(st.durable_ticket)
    while pending.queue:
        st.wait_durable(pending.queue[-1][0], timeout_s=60)
        pending.complete_upto(st.durable_ticket)
    return pending, pending.last_done_t - start


def _filesystem(directory: str) -> str:
    best = ""
    found = "unknown"
    real = os.path.realpath(directory)
    for part in psutil.disk_partitions(all=True):
        if real.startswith(part.mountpoint) and len(part.mountpoint) > len(best):
            best, found = part.mountpoint, f"{part.fstype} on {part.device}"
    return found


def run_storage_bench(size: int, entries: int | None = None, duration_s: float = 5.0,
                      directory: str | None = None, batch_bytes: int = 256 * 1024,
                      window: int = 8, journal_write_data: bool = True,
                      baseline_s: float = 1.0) -> dict:
    """Run the baseline and the storage bench; returns the result document."""
    if size < 0 or (entries is not None and entries <= 0) or duration_s <= 0 or window <= 0:
        raise ValueError("size must be >= 0; entries, duration_s and window must be > 0")
    root = tempfile.mkdtemp(prefix="bkbench-", dir=directory)
    try:
        fsyncs = disk_fdatasync_per_s(root, baseline_s)
        direct_mb = disk_direct_mb_per_s(root, baseline_s)
        options = StorageOptions(journal_write_data=journal_write_data,
                                 entry_bytes_max=max(size, StorageOptions.entry_bytes_max),
                                 checkpoint_interval_s=3600.0)
        jdir, ldir = os.path.join(root, "journal"), os.path.join(root, "ledgers")
        LedgerStorage.format("bench", jdir, ldir, options)
        st = LedgerStorage.open("bench", jdir, ldir, options)
        try:
            pending, elapsed = _drive(st, size, entries, duration_s, batch_bytes, window)
            stats = st.stats()
        finally:
            st.close()
        done = pending.done_entries
        mb_per_s = done * size / elapsed / 1e6
        return {
            "adds_per_s": done / elapsed, "mb_per_s": mb_per_s,
            "p50_ms": pending.percentile_ms(50), "p99_ms": pending.percentile_ms(99),
            "disk_fdatasync_per_s": fsyncs, "disk_direct_mb_per_s": direct_mb,
            "ratio_mb_to_direct": (mb_per_s / direct_mb) if direct_mb else None,
            "entries": done, "size": size, "seconds": elapsed,
            "batch_entries": max(1, batch_bytes // max(size, 1)), "window": window,
            "journal_write_data": journal_write_data,
            "journal_syncs_per_s": stats["journal_syncs"] / elapsed,
            "dir": root, "filesystem": _filesystem(root), "cpus": os.cpu_count(),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)
