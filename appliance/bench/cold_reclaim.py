"""``bkctl bench reclaim --cold``: the bookies' disk after a log's sealed
segments moved to cold storage, with nobody asking for GC or compaction.

Three bookie processes (E3/W3/A2) under a temp dir, the product's storage
defaults (1 GiB entry-log rotation, ``entry_log_rotate_garbage_bytes``)
but for a 64 KiB entry-log buffer, so the sizes measured before the move
hold what was written.  A log of ``total_bytes`` is written, its writer
closed (every segment sealed) and a new one writes one record (the hot
in-progress segment).  Then every sealed segment is moved (the mover's
``offload``, as ``bkctl log offload``, ``delete_after_ms = 0``: the moved
ledgers are deleted at its end).  Measured:

* ``offload_s`` and ``offload_mb_per_s``: the move (files written, made
  durable, read back and verified, metadata switched, ledgers deleted);
* ``space_back_s``: from the end of the move until every bookie's ledger
  directory lost at least 90% of the moved payload (its GC found the
  ledgers gone in two passes of ``gc_interval_ms``, rotated the active
  entry log, removed or compacted it);
* the ledger directories' bytes before the move and after.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import appliance
from appliance.bench.launcher import check_free_space, wait_for
from appliance.bench.reclaim import ENTRY_LOG_BUFFER_BYTES, TIMEOUT_S, _dir_bytes
from appliance.bench.repair import SESSION_TIMEOUT_MS, _Bookies

SEGMENT_BYTES = 8 * 1024 * 1024  # ~12 segments for 100 MB


def _write_log(config_path: Path, name: str, total_bytes: int, record_bytes: int) -> int:
    """Write the log (every segment sealed), then one record in a new
    segment; returns the payload bytes of the sealed segments."""
    n = max(1, total_bytes // record_bytes)
    with appliance.connect(str(config_path)) as bk:
        wait_for(lambda: len(bk.registry.available()) >= 3, 30.0, what="bookies")
        log = bk.log(name)
        with log.writer() as w:
            futures = []
            for i in range(n):
                # random records: the cold files cannot shrink them by compression
                futures.append(w.write_async(os.urandom(record_bytes)))
                if i % 100 == 99:
                    w.flush()
            w.flush()
            for f in futures:
                f.result(timeout=TIMEOUT_S)
    return n * record_bytes


def run_cold_reclaim_bench(total_bytes: int, record_bytes: int,
                           gc_interval_ms: int | None = None,
                           workdir: str | None = None) -> dict:
    # on use: pyarrow is loaded only by runs that move segments
    from appliance.cold.mover import offloader

    root = Path(tempfile.mkdtemp(prefix="bkcoldreclaim", dir=workdir))
    check_free_space(5 * total_bytes, str(root))
    server = {} if gc_interval_ms is None else {"gc_interval_ms": gc_interval_ms}
    bookies = _Bookies(root, 3, client={"ensemble": 3, "write_quorum": 3, "ack_quorum": 2},
                       server=server, metadata={"session_timeout_ms": SESSION_TIMEOUT_MS},
                       storage={"entry_log_buffer_bytes": ENTRY_LOG_BUFFER_BYTES},
                       log={"segment_bytes_max": SEGMENT_BYTES},
                       cold_storage={"uri": str(root / "cold"), "offload_after_ms": 0,
                                     "delete_after_ms": 0})
    try:
        for b in bookies.config.bookies:
            bookies.format(b.id)
            bookies.start(b.id)
        sealed_bytes = _write_log(bookies.path, "bench", total_bytes, record_bytes)
        with appliance.connect(str(bookies.path)) as bk:
            writer = bk.log("bench").writer()  # the hot segment stays on the bookies
            writer.write(b"hot")
            before = {b.id: _dir_bytes(b.ledger_dir) for b in bookies.config.bookies}
            load_before = os.getloadavg()
            started = time.monotonic()
            result = offloader(bk, b"").offload("bench", None)
            offload_s = time.monotonic() - started
            moved_at = time.monotonic()
            target = {b: size - 0.9 * sealed_bytes for b, size in before.items()}
            wait_for(lambda: all(_dir_bytes(bookies.config.bookie(b).ledger_dir) <= target[b]
                                 for b in target), TIMEOUT_S,
                     what="the bookies' disk back after the move", interval_s=0.05)
            space_back_s = time.monotonic() - moved_at
            after = {b.id: _dir_bytes(b.ledger_dir) for b in bookies.config.bookies}
            writer.close()
        return {"bytes_written": sealed_bytes, "record_bytes": record_bytes,
                "segments_moved": len(result.moved), "bytes_moved": result.bytes_moved,
                "ledgers_deleted": len(result.ledgers_deleted),
                "gc_interval_ms": bookies.config.server.gc_interval_ms,
                "offload_s": round(offload_s, 3),
                "offload_mb_per_s": round(result.bytes_moved / offload_s / 1e6, 1),
                "space_back_s": round(space_back_s, 3),
                "ledger_dir_bytes_before": before, "ledger_dir_bytes_after": after,
                "load_average_before": [round(x, 2) for x in load_before],
                "load_average_after": [round(x, 2) for x in os.getloadavg()]}
    finally:
        bookies.stop()
        shutil.rmtree(root, ignore_errors=True)
