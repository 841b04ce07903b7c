"""Micro-benchmark of the pure core's per-entry cost (not a test: no timing
is asserted anywhere).  ``python -m tests.protocol.bench_core``

A ``LedgerWriter`` at E=Qw=3, Qa=2 adds 1 KiB entries in batches of 64 and
every acknowledgement is fed back, batched (``AddResponses``) or one
``AddResponse`` per entry; ``BookieCore.add_batch`` over in-memory storage.
"""

from __future__ import annotations

import time

from appliance.errors import OK
from appliance.protocol import events as ev
from appliance.protocol.bookie import BookieCore
from appliance.protocol.writer import LedgerWriter, WriterConfig
from tests.protocol.helpers import DIGEST, KEY, metadata
from tests.sim.storage import MemStorage


def writer_entries_per_s(entries: int = 64_000, batch: int = 64, size: int = 1024,
                         batched: bool = True) -> float:
    w = LedgerWriter(metadata(), 1, KEY, DIGEST, config=WriterConfig(pending_adds_max=100_000))
    payloads, done = [b"x" * size] * batch, 0
    started = time.perf_counter()
    for _ in range(entries // batch):
        for a in w.add_many(payloads, 0):
            if type(a) is not ev.SendAdd:
                continue
            if batched:
                outs = w.handle(ev.AddResponses(a.request_id, a.bookie_id, 1, a.entry_ids,
                                                (OK,) * len(a.entry_ids)))
            else:
                outs = [o for e in a.entry_ids
                        for o in w.handle(ev.AddResponse(a.request_id, a.bookie_id, 1, e, OK))]
            done += sum(o.last_entry_id - o.first_entry_id + 1 for o in outs
                        if type(o) is ev.CompleteAdds)
    elapsed_s = time.perf_counter() - started
    if done != entries // batch * batch:
        raise RuntimeError(f"only {done} entries were acknowledged")
    return done / elapsed_s


def bookie_entries_per_s(entries: int = 64_000, batch: int = 64, size: int = 1024) -> float:
    core = BookieCore(MemStorage())
    w = LedgerWriter(metadata(), 1, KEY, DIGEST, config=WriterConfig(pending_adds_max=100_000))
    send = next(a for a in w.add_many([b"x" * size] * entries, 0)
                if isinstance(a, ev.SendAdd) and a.bookie_id == "b1")
    started = time.perf_counter()
    for i in range(0, entries, batch):
        core.add_batch(1, send.entry_ids[i:i + batch], send.datas[i:i + batch], KEY)
    return entries / (time.perf_counter() - started)


def main() -> None:
    for _ in range(3):
        print(f"writer, batched replies: {writer_entries_per_s():>9,.0f} entries/s | "
              f"per-entry replies: {writer_entries_per_s(batched=False):>9,.0f} entries/s | "
              f"bookie add_batch: {bookie_entries_per_s():>9,.0f} entries/s")


if __name__ == "__main__":
    main()
