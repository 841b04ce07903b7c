"""``bkctl bench write --compact-during MB``: add latency while every bookie
runs a major compaction.

Before the measured run, garbage is made: ``MB`` megabytes of 64 KiB
entries are written to ``GARBAGE_LEDGERS`` ledgers, round robin (so every
entry log mixes them), and two thirds of the ledgers are deleted.  Then the
run starts, and ``compact_after_s`` seconds into it every bookie is asked
for a major compaction at once (COMPACT, as ``bkctl bookie compact ID
--major``: each deletes the ledgers whose metadata is gone, then rewrites
its logs, copying at most ``storage.compaction_rate_bytes_per_s``).

What it adds to the results document (times in seconds from the first
client's start; the clients' ``perf_counter`` and this process's are the
same monotonic clock on Linux):

* ``compaction``: when it was asked, when the last bookie finished (None
  if one was still running when the run ended: make the run longer),
  bytes copied over all bookies, seconds waited for the rate limit, the
  garbage written;
* ``during_compaction``: adds *sent* between the ask and the end (all of
  them if it did not end), with their p50/p99/p99.9;
* ``outside_compaction``: the other adds, the same figures.

Bounds: one thread that polls INFO every ``POLL_S`` until every bookie's
run is done or the run ends; nothing here outlives ``run_bench``.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np

import appliance
from appliance.config import load_config
from appliance.supervisor.probe import bookie_compact, bookie_info, probe_curve

GARBAGE_ENTRY_BYTES = 64 * 1024
GARBAGE_LEDGERS = 12
POLL_S = 0.05
ASK_TIMEOUT_MS = 5_000


def make_garbage(config_path: str, megabytes: int, options) -> tuple[int, list[int]]:
    """Write ``megabytes`` MB of 64 KiB entries over ``GARBAGE_LEDGERS``
    ledgers round robin, delete two thirds of them; returns (bytes written,
    the ledgers kept: ``drop_ledgers`` deletes them after the run)."""
    count = max(GARBAGE_LEDGERS, -(-megabytes * 1_000_000 // GARBAGE_ENTRY_BYTES))
    payload = os.urandom(GARBAGE_ENTRY_BYTES)
    with appliance.connect(config_path) as bk:
        handles = [bk.create_ledger(options.ensemble, options.write_quorum, options.ack_quorum)
                   for _ in range(GARBAGE_LEDGERS)]
        futures = [handles[i % GARBAGE_LEDGERS].add_async(payload) for i in range(count)]
        for f in futures:
            f.result(timeout=600)
        for i, lh in enumerate(handles):
            lh.close()
            if i % 3:
                bk.delete_ledger(lh.id)
    return count * GARBAGE_ENTRY_BYTES, [lh.id for i, lh in enumerate(handles) if not i % 3]


def drop_ledgers(config_path: str, ledger_ids: list[int]) -> None:
    """Delete the ledgers ``make_garbage`` kept (a running appliance keeps
    nothing of the bench)."""
    with appliance.connect(config_path) as bk:
        for ledger_id in ledger_ids:
            bk.delete_ledger(ledger_id)


class CompactionDuring:
    """The thread that asks every bookie for a major compaction after a
    delay and watches until all are done (``stop`` ends the watch)."""

    def __init__(self, config_path: str, after_s: float):
        config = load_config(config_path)
        self._endpoints = {b.id: b.endpoint for b in config.bookies}
        self._curve = probe_curve(config)
        self._after_s = after_s
        self._stop = threading.Event()
        self.asked_at: float | None = None  # perf_counter
        self.done_at: float | None = None
        self.runs: dict[str, dict] = {}
        self.error: str | None = None
        self._thread = threading.Thread(target=self._main, name="compact-during", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:  # started
            self._thread.join(timeout=30)

    def _main(self) -> None:
        if self._stop.wait(self._after_s):
            return
        self.asked_at = time.perf_counter()
        tickets = {}
        for bookie_id, endpoint in self._endpoints.items():
            reply = bookie_compact(endpoint, True, ASK_TIMEOUT_MS, curve=self._curve)
            if reply is not None:
                tickets[bookie_id] = reply["ticket"]
        if len(tickets) < len(self._endpoints):
            self.error = "a bookie did not answer COMPACT"
        while tickets and not self._stop.wait(POLL_S):
            for bookie_id in list(tickets):
                info = bookie_info(self._endpoints[bookie_id], ASK_TIMEOUT_MS,
                                   curve=self._curve) or {}
                status = (info.get("storage") or {}).get("compaction") or {}
                if status.get("requests_done", 0) >= tickets[bookie_id]:
                    self.runs[bookie_id] = status.get("last") or {}
                    del tickets[bookie_id]
            if not tickets:
                self.done_at = time.perf_counter()


def during_figures(results: list[dict], watch: CompactionDuring, garbage_bytes: int) -> dict:
    """The document's ``compaction``, ``during_compaction`` and
    ``outside_compaction`` (see the module docstring)."""
    t0 = min(r["start"] for r in results)
    sent = np.concatenate([r["sent"] for r in results])
    latency_ms = np.concatenate([(r["done"] - r["sent"]) * 1000.0 for r in results])
    start = watch.asked_at if watch.asked_at is not None else float("inf")
    end = watch.done_at if watch.done_at is not None else float("inf")
    during = (sent >= start) & (sent <= end)
    runs = watch.runs.values()
    return {
        "compaction": {
            "asked_s": None if watch.asked_at is None else round(watch.asked_at - t0, 3),
            "done_s": None if watch.done_at is None else round(watch.done_at - t0, 3),
            "bookies_done": len(watch.runs), "error": watch.error,
            "bytes_copied": sum(r.get("bytes_copied", 0) for r in runs),
            "throttled_s": round(sum(r.get("throttled_s", 0.0) for r in runs), 3),
            "ledgers_forgotten": sum(r.get("ledgers_forgotten") or 0 for r in runs),
            "garbage_written_bytes": garbage_bytes},
        "during_compaction": _percentiles(latency_ms[during]),
        "outside_compaction": _percentiles(latency_ms[~during]),
    }


def _percentiles(latency_ms: np.ndarray) -> dict:
    if not len(latency_ms):
        return {"samples": 0, "p50_ms": None, "p99_ms": None, "p999_ms": None}
    p50, p99, p999 = np.percentile(latency_ms, [50, 99, 99.9]).tolist()
    return {"samples": int(len(latency_ms)), "p50_ms": p50, "p99_ms": p99, "p999_ms": p999}
