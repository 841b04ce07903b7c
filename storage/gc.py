"""Garbage collection of entry logs: give back the space of deleted ledgers.

An entry log is removed only when all of these hold:

1. it lies wholly before the entry-log mark of the last snapshot written:
   recovery scans only logs from that mark and journal replay appends into
   new logs, so nothing can be indexed into it again after a crash;
2. its per-ledger byte record (``ledger_bytes``, kept for every block
   indexed and saved in each snapshot) is known: a log whose contents are
   not on record is kept;
3. none of its ledgers is in that snapshot's index, nor in the live index
   (a ledger written again after its delete keeps its old logs).

So a crash at any point leaves either the file (harmless: unreferenced) or
no file that anything references.  Removing a file is the only change; the
index already forgot the ledger when it was deleted (journaled).

A log that still holds a live entry is compaction's (``storage.compaction``:
its live entries are copied out, then it is removed); so are empty logs
left by restarts (not on record here).
"""

from __future__ import annotations

import logging
import os

from .entry_log import list_logs, log_path

log = logging.getLogger(__name__)


def reclaimable_logs(log_ids, ledger_bytes: dict[int, dict[int, int]], mark_log: int,
                     persisted: frozenset, live) -> list[tuple[int, int]]:
    """(log id, bytes on record) of every log the rules above allow removing."""
    found = []
    for log_id in log_ids:
        per = ledger_bytes.get(log_id)
        if log_id >= mark_log or not per:
            continue
        if any(ledger in live or ledger in persisted for ledger in per):
            continue
        found.append((log_id, sum(per.values())))
    return found


def reclaim_entry_logs(st) -> tuple[list[int], int]:
    """Remove the reclaimable logs of storage ``st``; (removed ids, bytes)."""
    with st._lock:
        st._check_usable()
        persisted, mark_log = st._persisted
        chosen = reclaimable_logs(list_logs(st.ledger_dir), st._logs.ledger_bytes, mark_log,
                                  persisted, st._index.ledgers)
        for log_id, _ in chosen:
            st._logs.forget_log(log_id)  # under the lock: no read holds its descriptor
    removed, freed = [], 0
    for log_id, nbytes in chosen:
        path = log_path(st.ledger_dir, log_id)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:  # kept; it is off the record, so it is not retried
            log.warning("could not remove %s: %s", path, exc)
            continue
        removed.append(log_id)
        freed += nbytes
    if removed:
        log.info("removed %d entry logs of deleted ledgers (%d bytes): %s", len(removed),
                 freed, removed)
    st.counters["gc_logs_removed"] = st.counters.get("gc_logs_removed", 0) + len(removed)
    return removed, freed
