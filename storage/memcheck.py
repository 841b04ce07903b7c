"""Measure what the index costs in memory: add N small entries through
LedgerStorage (journal on), checkpoint, reopen (snapshot load), and report
the resident set size and the index bytes per entry at each stage.

    python -m storage.memcheck --entries 10000000 [--ledgers 100] [--dir DIR] [--json]

The entries are tiny (default 16 bytes) so the disk holds ~40 bytes per entry
in each of the journal and the entry log; RSS is what the process holds:
interpreter + numpy (~35 MB), write buffers (journal group buffer, two
entry-log buffers, the bounded journal queue) and the index.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shutil
import tempfile
import time

import numpy as np
import psutil

from .ledger_storage import LedgerStorage
from .options import StorageOptions

BATCH_ENTRIES = 8192


def peak_rss_mb() -> float:
    """Peak resident memory of this process image.  ``VmHWM`` belongs to the
    address space, so it starts afresh at exec; ``ru_maxrss`` does not (Linux
    carries the forking parent's peak over exec, so a child of a large test
    runner would report the runner's size)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024 / 1e6
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6


def _rss_mb() -> float:
    return psutil.Process().memory_info().rss / 1e6


def _fill(st: LedgerStorage, entries: int, ledgers: int, size: int) -> None:
    data = [b"m" * size] * BATCH_ENTRIES
    per_ledger = -(-entries // ledgers)
    done = 0
    for led in range(ledgers):
        first = 0
        while first < per_ledger and done < entries:
            n = min(BATCH_ENTRIES, per_ledger - first, entries - done)
            ticket = st.add_entries(np.full(n, led, np.int64),
                                    np.arange(first, first + n, dtype=np.int64), data[:n])
            first += n
            done += n
        st.wait_durable(ticket, timeout_s=120)


def measure(entries: int, ledgers: int = 100, size: int = 16,
            directory: str | None = None, crash: bool = False) -> dict:
    """``crash``: end the fill with ``abort()`` (no final checkpoint), so the
    reopen replays the journal and scans the entry-log tail since the last
    automatic checkpoint (every ``checkpoint_bytes`` = 1 GiB by default)."""
    root = tempfile.mkdtemp(prefix="bkmem-", dir=directory)
    opts = StorageOptions(checkpoint_interval_s=3600.0)
    jdir, ldir = os.path.join(root, "journal"), os.path.join(root, "ledgers")
    out = {"entries": entries, "ledgers": ledgers, "entry_bytes": size, "crash": crash}
    try:
        LedgerStorage.format("memcheck", jdir, ldir, opts)
        out["rss_mb_before_open"] = _rss_mb()
        st = LedgerStorage.open("memcheck", jdir, ldir, opts)
        t0 = time.monotonic()
        _fill(st, entries, ledgers, size)
        out["fill_s"] = time.monotonic() - t0
        stats = st.stats()
        out["rss_mb_after_adds"] = _rss_mb()
        out["index_bytes"] = stats["index_bytes"]
        out["index_bytes_per_entry"] = stats["index_bytes"] / max(stats["entries"], 1)
        st.abort() if crash else st.close()
        del st
        gc.collect()
        t0 = time.monotonic()
        st = LedgerStorage.open("memcheck", jdir, ldir, opts)
        out["reopen_s"] = time.monotonic() - t0
        out["rss_mb_after_reopen"] = _rss_mb()
        out["entries_after_reopen"] = st.stats()["entries"]
        out["replayed_journal_records"] = st.recovery_stats["recovered_journal_records"]
        st.close()
        # The kernel's high-water mark of this process, over every stage above.
        out["max_rss_mb"] = peak_rss_mb()
        out["snapshot_bytes"] = os.path.getsize(os.path.join(ldir, "index.snap"))
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=10_000_000)
    parser.add_argument("--ledgers", type=int, default=100)
    parser.add_argument("--size", type=int, default=16)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--crash", action="store_true", help="abort instead of close")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = measure(args.entries, args.ledgers, args.size, args.dir, args.crash)
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        for key, value in result.items():
            print(f"{key:24s} {value:,.2f}" if isinstance(value, float) else f"{key:24s} {value:,}")


if __name__ == "__main__":
    main()
