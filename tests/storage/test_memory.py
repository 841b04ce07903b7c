"""Memory: the index costs the stated 12 bytes per entry-id slot (at most 2x
while a page grows), and a bookie holding 10 million entries stays under
256 MB resident, through adds, a clean close and a reopen (and a crash)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from storage.index import MIN_PAGE_SLOTS, PAGE_SLOTS, SLOT_BYTES, Index


def _put(index: Index, ledger: int, entries) -> None:
    entries = np.asarray(entries, np.uint64)
    n = len(entries)
    index.put_batch(np.full(n, ledger, np.uint64), entries, 1,
                    np.arange(n, dtype=np.int64) * 64, np.full(n, 40, np.int64))


def test_index_bytes_per_entry_are_bounded():
    index = Index()
    _put(index, 1, range(10 * PAGE_SLOTS))  # full pages: exactly 12 bytes per entry
    pages = sum(p.nbytes for p in index.ledger(1).pages.values())
    assert pages == 10 * PAGE_SLOTS * SLOT_BYTES
    _put(index, 2, range(PAGE_SLOTS // 2 + 1))  # a page just past a doubling: < 2x
    pages = sum(p.nbytes for p in index.ledger(2).pages.values())
    assert pages <= 2 * (PAGE_SLOTS // 2 + 1) * SLOT_BYTES
    _put(index, 3, [0])  # a tiny ledger costs one minimum page
    assert index.ledger(3).pages[0].nbytes == MIN_PAGE_SLOTS * SLOT_BYTES
    _put(index, 4, range(2, 3000, 3))  # striping (E=3, W=1): 3 slots per stored entry
    pages = sum(p.nbytes for p in index.ledger(4).pages.values())
    assert pages <= 2 * 3 * index.ledger(4).entries * SLOT_BYTES
    assert index.entry_count() == 10 * PAGE_SLOTS + PAGE_SLOTS // 2 + 1 + 1 + 1000


def _memcheck(*args: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "storage.memcheck", "--json", *args],
                          capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_ten_million_entries_stay_under_256_mb():
    doc = _memcheck("--entries", "10000000")
    assert doc["entries_after_reopen"] == 10_000_000
    assert doc["index_bytes_per_entry"] < 12.1
    assert doc["max_rss_mb"] < 256, doc


def test_recovery_after_a_crash_stays_bounded():
    doc = _memcheck("--entries", "1000000", "--crash")
    assert doc["entries_after_reopen"] == 1_000_000
    assert doc["replayed_journal_records"] > 0
    # 1M entries: 12 MB of index; replay must not hold the journal or log tail in memory
    assert doc["max_rss_mb"] < 120, doc
