"""``bkctl bench reclaim``: how long a deleted ledger's space takes to come
back, on three bookie processes of their own under a temp dir.

Two E3/W3/A2 ledgers are written interleaved (every entry log holds both):
a doomed one and a kept one, ``keep_share`` of the bytes.  The doomed one
is deleted; measured:

* ``gc_s``: from the delete until every bookie forgot it (its GC found the
  metadata gone in two passes: ``server.gc_interval_ms``), seen as the live
  bytes in INFO falling to the kept ledger's;
* ``compact_s``: a compaction asked of every bookie at once (COMPACT, as
  ``bkctl bookie compact``; minor if the kept share is under the minor
  threshold, else major) until the last one is done: entry logs rewritten
  and removed;
* ``space_back_s``: delete to the end of compaction; the ledger
  directories' bytes before and after, over the live payload.

On its own the appliance runs compaction every
``storage.compaction_minor_interval_s`` (a log under 0.2 live) or
``compaction_major_interval_s``: add that wait to ``gc_s`` for the time
without an operator.  Logs that hold only deleted ledgers need no
compaction (GC removes them after the next checkpoint).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import appliance
from appliance.bench.launcher import check_free_space, wait_for
from appliance.bench.repair import SESSION_TIMEOUT_MS, _Bookies
from appliance.supervisor.probe import bookie_compact
from storage.storage_files import RESERVE_NAME

TIMEOUT_S = 3600.0
ENTRY_LOG_BUFFER_BYTES = 64 * 1024  # see run_reclaim_bench


def _dir_bytes(path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            if name == RESERVE_NAME:  # room kept for a full disk, not data
                continue
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except FileNotFoundError:
                continue
    return total


def _write_interleaved(config_path: Path, total_bytes: int, entry_bytes: int,
                       keep_share: float) -> tuple[int, int, int]:
    """(doomed ledger id, kept ledger id, kept payload bytes)."""
    payload = os.urandom(entry_bytes)
    n = max(2, total_bytes // entry_bytes)
    every = max(1, round(1 / keep_share))  # one kept entry in every `every`
    with appliance.connect(str(config_path)) as bk:
        wait_for(lambda: len(bk.registry.available()) >= 3, 30.0, what="bookies")
        doomed, kept = bk.create_ledger(3, 3, 2), bk.create_ledger(3, 3, 2)
        futures, kept_n = [], 0
        for i in range(n):
            if i % every == every - 1:
                futures.append(kept.add_async(payload))
                kept_n += 1
            else:
                futures.append(doomed.add_async(payload))
        for f in futures:
            f.result(timeout=TIMEOUT_S)
        doomed.close()
        kept.close()
        return doomed.id, kept.id, kept_n * entry_bytes


def run_reclaim_bench(total_bytes: int, entry_bytes: int, keep_share: float = 0.1,
                      gc_interval_ms: int | None = None, workdir: str | None = None) -> dict:
    root = Path(tempfile.mkdtemp(prefix="bkreclaim", dir=workdir))
    check_free_space(4 * total_bytes, str(root))
    server = {} if gc_interval_ms is None else {"gc_interval_ms": gc_interval_ms}
    # A small entry-log buffer: the directory sizes measured before the
    # delete then hold (almost) all that was written.  With the default
    # 4 MiB, handed over at a random fill, up to 4 MiB per bookie could
    # still sit in memory and the "before" size understated the data.
    bookies = _Bookies(root, 3, client={"ensemble": 3, "write_quorum": 3, "ack_quorum": 2},
                       server=server, metadata={"session_timeout_ms": SESSION_TIMEOUT_MS},
                       storage={"entry_log_buffer_bytes": ENTRY_LOG_BUFFER_BYTES})
    try:
        for b in bookies.config.bookies:
            bookies.format(b.id)
            bookies.start(b.id)
        doomed_id, _kept_id, kept_bytes = _write_interleaved(bookies.path, total_bytes,
                                                             entry_bytes, keep_share)
        ids = [b.id for b in bookies.config.bookies]
        before = {b.id: _dir_bytes(b.ledger_dir) for b in bookies.config.bookies}

        def live(bookie_id: str) -> int:
            disk = (bookies.info(bookie_id).get("storage") or {}).get("disk") or {}
            return disk.get("live_bytes", 1 << 62)

        with appliance.connect(str(bookies.path)) as bk:
            started = time.monotonic()
            bk.delete_ledger(doomed_id)
        # kept payload plus record headers and the client's entry header/digest
        wait_for(lambda: all(live(b) < 1.2 * kept_bytes + (1 << 20) for b in ids), TIMEOUT_S,
                 what="every bookie's GC forgot the deleted ledger", interval_s=0.05)
        gc_s = time.monotonic() - started
        minor = bookies.config.storage.to_options().compaction_minor_threshold
        major = keep_share * 1.2 >= minor
        compact_started = time.monotonic()
        tickets = {}
        for b in bookies.config.bookies:
            reply = bookie_compact(b.endpoint, major, 5000)
            if reply is None:
                raise RuntimeError(f"{b.id} did not answer COMPACT")
            tickets[b.id] = reply["ticket"]

        def done(bookie_id: str) -> bool:
            status = (bookies.info(bookie_id).get("storage") or {}).get("compaction") or {}
            return status.get("requests_done", 0) >= tickets[bookie_id]
        wait_for(lambda: all(done(b) for b in ids), TIMEOUT_S, what="compaction",
                 interval_s=0.05)
        compact_s = time.monotonic() - compact_started
        space_back_s = time.monotonic() - started
        after = {b.id: _dir_bytes(b.ledger_dir) for b in bookies.config.bookies}
        runs = {b: (bookies.info(b).get("storage") or {}).get("compaction", {}).get("last")
                or {} for b in ids}
        copied = max(r.get("bytes_copied", 0) for r in runs.values())
        return {"bytes_written": total_bytes, "entry_bytes": entry_bytes,
                "keep_share": keep_share, "kept_payload_bytes": kept_bytes,
                "gc_interval_ms": bookies.config.server.gc_interval_ms,
                "compaction": "major" if major else "minor",
                "gc_s": round(gc_s, 3), "compact_s": round(compact_s, 3),
                "space_back_s": round(space_back_s, 3),
                "bytes_copied_per_bookie": copied,
                "copy_mb_per_s": round(copied / compact_s / 1e6, 1) if compact_s else None,
                "ledger_dir_bytes_before": before, "ledger_dir_bytes_after": after,
                "after_over_live": round(max(after.values()) / kept_bytes, 3),
                "runs": runs}
    finally:
        bookies.stop()
        shutil.rmtree(root, ignore_errors=True)
