"""The disk follows the data: 20 ledgers written interleaved, 15 deleted;
after GC and `bkctl bookie compact` each bookie's ledger directory holds
little more than the live entries, and every surviving entry reads back,
also after the bookies restart."""

from __future__ import annotations

import json
import os

import appliance
from tests.support.bkctl import bkctl
from tests.support.launch import wait_for, wait_registered

PW = b"pw"
LEDGERS, ROUNDS, SIZE = 20, 150, 4096
SETTINGS = {"server": {"gc_interval_ms": 200},
            "storage": {"checkpoint_interval_s": 0.5}}


def _dir_bytes(path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            if name != "RESERVE":  # room kept for a full disk, not data (docs/STORAGE.md)
                total += os.stat(os.path.join(root, name)).st_size
    return total


def _status(cluster) -> dict:
    out = bkctl("status", "--json", config=cluster.config_path, text=True)
    assert out.returncode == 0, out.stderr
    return {b["id"]: b for b in json.loads(out.stdout)["bookies"]}


def test_deleting_most_ledgers_gives_the_disk_back_after_compaction(make_cluster):
    cluster = make_cluster(3, quorums=(3, 3, 2), **SETTINGS)
    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 3)
        handles = [bk.create_ledger(3, 3, 2, password=PW) for _ in range(LEDGERS)]
        payloads = {lh.id: [] for lh in handles}
        futures = []
        for r in range(ROUNDS):  # one entry of every ledger per round: logs interleave them
            for lh in handles:
                payload = (b"%d:%d:" % (lh.id, r)).ljust(SIZE, b"x")
                payloads[lh.id].append(payload)
                futures.append(lh.add_async(payload))
        for f in futures:
            f.result(timeout=120)
        for lh in handles:
            lh.close()
        keep = [lh.id for lh in handles[:5]]
        for lh in handles[5:]:
            bk.delete_ledger(lh.id)

        def forgotten() -> bool:  # GC dropped the deleted ledgers on every bookie
            return all(row["live_bytes"] is not None
                       and row["live_bytes"] < 0.3 * row["entry_log_bytes"]
                       for row in _status(cluster).values())
        wait_for(forgotten, 60, what="deleted ledgers dropped by every bookie's GC")
        before = {b.id: _dir_bytes(b.ledger_dir) for b in cluster.config.bookies}

        for b in cluster.config.bookies:
            out = bkctl("bookie", "compact", b.id, "--major", "--json",
                        config=cluster.config_path, text=True)
            assert out.returncode == 0, out.stdout + out.stderr
            doc = json.loads(out.stdout)
            assert doc["ok"] and doc["result"]["logs_removed"] >= 1, doc

        live = sum(len(p) for i in keep for p in payloads[i])  # payload bytes on each bookie
        ratios = {}
        for b in cluster.config.bookies:
            used = _dir_bytes(b.ledger_dir)  # entry logs, index snapshot, markers
            ratios[b.id] = used / live
            assert used < before[b.id] / 2.5, (b.id, used, before[b.id])
        print(f"ledger dir bytes / live payload bytes after compaction: "
              f"{ {k: round(v, 3) for k, v in ratios.items()} }; before: "
              f"{ {k: round(v / live, 3) for k, v in before.items()} }")
        assert max(ratios.values()) < 1.5, ratios
        status = _status(cluster)
        for row in status.values():
            assert row["garbage_bytes"] < 0.5 * row["live_bytes"], row
            assert row["entry_logs"] >= 1 and row["open_logs"] == 1

        for ledger_id in keep:
            rh = bk.open_ledger(ledger_id, password=PW)
            assert [e.payload for e in rh.read(0, ROUNDS - 1)] == payloads[ledger_id]

    cluster.stop()
    cluster.start()
    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 3)
        for ledger_id in keep:
            rh = bk.open_ledger(ledger_id, password=PW)
            assert [e.payload for e in rh.read(0, ROUNDS - 1)] == payloads[ledger_id]


def test_automatic_compaction_is_suspended_and_resumed_by_bkctl(make_cluster):
    cluster = make_cluster(1, quorums=(1, 1, 1))
    bookie_id = cluster.config.bookies[0].id

    def info() -> tuple[str, dict]:
        text = bkctl("bookie", "info", bookie_id, config=cluster.config_path, text=True)
        doc = bkctl("bookie", "info", bookie_id, "--json", config=cluster.config_path,
                    text=True)
        assert text.returncode == 0 and doc.returncode == 0, text.stderr + doc.stderr
        return text.stdout, json.loads(doc.stdout)["compaction"]

    out = bkctl("bookie", "compact", bookie_id, "--suspend", config=cluster.config_path,
                text=True)
    assert out.returncode == 0, out.stderr
    assert "automatic compaction suspended" in out.stdout and "--resume" in out.stdout
    text, state = info()
    assert "compaction: automatic SUSPENDED" in text and state["suspended"] is True

    # an explicit run goes on while suspended
    out = bkctl("bookie", "compact", bookie_id, config=cluster.config_path, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{bookie_id}: minor compaction (live share under 20%)" in out.stdout
    assert "entry logs now: " in out.stdout

    out = bkctl("bookie", "compact", bookie_id, "--resume", "--json",
                config=cluster.config_path, text=True)
    assert out.returncode == 0 and json.loads(out.stdout) == {"id": bookie_id,
                                                              "suspended": False}
    text, state = info()
    assert "compaction: automatic on" in text and state["suspended"] is False

    out = bkctl("bookie", "compact", bookie_id, "--major", "--suspend",
                config=cluster.config_path, text=True)
    assert out.returncode == 2 and "--major starts a run" in out.stderr
