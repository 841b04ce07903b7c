"""Delete two thirds of the ledgers and at once ask every bookie for a major
compaction: the entry logs come down to about the live bytes.

The defect this guards: the bookies' GC forgets a deleted ledger only after
two passes of ``server.gc_interval_ms`` (a minute each by default); a
compaction asked before that measured the deleted ledgers' entries as live,
rewrote nothing, and the garbage stayed until the next automatic major
compaction (a day).  ``bkctl bookie compact`` now has the bookie delete the
ledgers whose metadata is gone first."""

from __future__ import annotations

import json
import os

import pytest

import appliance
from tests.support.bkctl import bkctl
from tests.support.launch import wait_registered

PW = b"pw"
LEDGERS, ENTRIES, SIZE = 24, 80, 64 * 1024  # ~126 MB written, ~94 MB per bookie (E3 of 4)
RATIO_MAX = 1.3


def _write(bk) -> list:
    handles = [bk.create_ledger(3, 3, 2, password=PW) for _ in range(LEDGERS)]
    noise = os.urandom(SIZE)
    futures = [lh.add_async(_payload(noise, lh.id, e)) for e in range(ENTRIES) for lh in handles]
    for f in futures:
        f.result(timeout=240)
    for lh in handles:
        lh.close()
    return handles


def _payload(noise: bytes, ledger_id: int, entry_id: int) -> bytes:
    return noise[:SIZE - 32] + b"%16d%16d" % (ledger_id, entry_id)


def _kept_payload_bytes(handles) -> dict[str, int]:
    """Payload bytes of the kept ledgers each bookie holds (by their ensembles)."""
    held: dict[str, int] = {}
    for lh in handles:
        fragments = lh.metadata.ensembles
        for i, (first, bookies) in enumerate(fragments):
            last = fragments[i + 1][0] - 1 if i + 1 < len(fragments) else ENTRIES - 1
            for bookie_id in bookies:
                held[bookie_id] = held.get(bookie_id, 0) + (last - first + 1) * SIZE
    return held


@pytest.mark.parametrize("per_ledger", [False, True], ids=["interleaved", "per_ledger"])
def test_major_compaction_right_after_deletes_brings_logs_down_to_live(make_cluster,
                                                                     per_ledger):
    # default gc_interval_ms: the bookies' GC has not run when compaction is asked
    cluster = make_cluster(4, quorums=(3, 3, 2),
                           storage={"entry_log_per_ledger": per_ledger})
    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 4)
        handles = _write(bk)
        kept = [lh for i, lh in enumerate(handles) if not i % 3]
        for lh in handles:
            if lh not in kept:
                bk.delete_ledger(lh.id)
        live = _kept_payload_bytes(kept)

        for b in cluster.config.bookies:
            out = bkctl("bookie", "compact", b.id, "--major", "--json",
                        config=cluster.config_path, text=True)
            assert out.returncode == 0, out.stdout + out.stderr
            doc = json.loads(out.stdout)
            disk, result = doc["disk"], doc["result"]
            print(b.id, "kept payload", live.get(b.id, 0), "disk", disk, "run", result)
            assert doc["ok"] and result["ledgers_forgotten"] >= 1, doc
            # live = the payload bytes of the kept ledgers this bookie holds
            # (what it stores is that plus ~0.1% of headers and digests)
            assert disk["entry_log_bytes"] <= RATIO_MAX * live.get(b.id, 0) + 2 * 4096, \
                (b.id, live.get(b.id), doc)
            assert disk["live_bytes"] <= 1.01 * live.get(b.id, 0) + 4096, (b.id, doc)

        for lh in kept:
            rh = bk.open_ledger(lh.id, password=PW)
            got = [e.payload for e in rh.read(0, ENTRIES - 1)]
            assert [g[-32:] for g in got] == [b"%16d%16d" % (lh.id, e) for e in range(ENTRIES)]
