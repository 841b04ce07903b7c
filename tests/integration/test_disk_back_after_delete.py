"""The bookies give the disk back by themselves, with real processes and the
default 1 GiB entry-log rotation (so every byte written sits in the active
entry log, which used to be never reclaimed):

* a log's sealed segments moved to cold storage (``bkctl log offload``),
  their ledgers deleted: each bookie's ledger directory shrinks by about the
  moved data while a writer keeps writing the in-progress segment, and every
  record still reads exactly once (cold segments and the hot one);
* a plain ledger deleted while a writer keeps adding to another ledger in
  the same entry log: the deleted one's bytes come back, the live ledger's
  entries (written before, during and after the reclaim) all read back.

Nobody runs ``bkctl bookie gc`` or ``compact``: the GC pass (small
``gc_interval_ms`` here) rotates the active log, removes or compacts."""

from __future__ import annotations

import os
import threading

import appliance
from tests.support.bkctl import bkctl
from tests.support.launch import wait_for, wait_registered
from tests.support.logs import read_now

MiB = 1024 * 1024
PW = b"pw"
RECORD_BYTES, PER_SEGMENT = 20_000, 50  # ~1 MB segments
# checkpoints every 0.5 s: the entry logs' write buffers (up to 4 MiB) reach
# the files soon, so the "before" sizes hold what was written
GC = {"server": {"gc_interval_ms": 300},
      "storage": {"entry_log_rotate_garbage_bytes": 1 * MiB, "checkpoint_interval_s": 0.5}}


def _dir_bytes(path) -> int:
    """Bytes of a bookie's ledger directory (entry logs, index snapshots);
    RESERVE is room kept for a full disk, not data (docs/STORAGE.md)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            if name != "RESERVE":
                try:
                    total += os.stat(os.path.join(root, name)).st_size
                except FileNotFoundError:
                    continue  # removed meanwhile
    return total


def _disk(cluster) -> dict[str, int]:
    return {b.id: _dir_bytes(b.ledger_dir) for b in cluster.config.bookies}


def _wait_disk(cluster, limit: dict[str, float], what: str, above: bool = False) -> dict:
    """Poll until every bookie's ledger dir is at most (or, ``above``, at
    least) its limit; the sizes then."""
    seen = {}

    def done() -> bool:
        seen.update(_disk(cluster))
        return all((seen[b] >= limit[b]) if above else (seen[b] <= limit[b]) for b in limit)
    try:
        wait_for(done, 60, what=what)
    except TimeoutError as exc:
        raise AssertionError(f"{what}: limits {limit}, ledger dirs {seen}") from exc
    return dict(seen)


def test_moving_segments_to_cold_storage_gives_the_bookies_disk_back(make_cluster):
    cluster = make_cluster(3, quorums=(3, 3, 2), autorecovery={"enabled": False},
                           log={"segment_records_max": PER_SEGMENT, "flush_interval_us": 200,
                                "control_interval_ms": 2},
                           cold_storage={"uri": "cold", "offload_after_ms": 0,
                                         "delete_after_ms": 0, "orphan_grace_ms": 0}, **GC)
    config = cluster.config_path
    with appliance.connect(str(config)) as bk:
        wait_registered(bk, 3)
        log = bk.log("metrics")
        payloads = [os.urandom(RECORD_BYTES - 8) + b"%08d" % i for i in range(6 * PER_SEGMENT)]
        with log.writer() as w:
            for i, p in enumerate(payloads):
                w.write_async(p)
                if i % 10 == 9:
                    w.flush()
        w = log.writer()  # a writer keeps writing the in-progress segment
        w.write(b"live-0")
        before = _wait_disk(cluster, {b.id: len(payloads) * RECORD_BYTES
                                      for b in cluster.config.bookies},
                            "the records in the entry-log files", above=True)
        out = bkctl("log", "offload", "metrics", "--json", config=config, text=True)
        assert out.returncode == 0, out.stderr
        moved = [s for s in log.metadata().segments if s.tier == "cold"]
        assert len(moved) >= 5
        moved_bytes = sum(s.cold.bytes for s in moved)  # Parquet of random payloads: ~raw
        assert moved_bytes >= 5 * PER_SEGMENT * RECORD_BYTES * 0.9
        w.write(b"live-1")
        after = _wait_disk(cluster, {b: before[b] - 0.8 * moved_bytes for b in before},
                           "the moved ledgers' space back")
        print(f"ledger dir bytes before {before}, after {after}; moved {moved_bytes}")
        w.write(b"live-2")
        w.close()
        records = read_now(log)
        assert [r.payload for r in records] == payloads + [b"live-%d" % i for i in range(3)]
        assert len({r.dlsn for r in records}) == len(records)


def test_a_deleted_ledger_s_space_comes_back_while_another_ledger_is_written(make_cluster):
    cluster = make_cluster(3, quorums=(3, 3, 2), autorecovery={"enabled": False}, **GC)
    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 3)
        live = bk.create_ledger(3, 3, 2, password=PW)
        doomed = bk.create_ledger(3, 3, 2, password=PW)
        written: list[bytes] = []
        stop = threading.Event()
        errors: list[BaseException] = []

        def keep_writing() -> None:  # small adds all along: the same active entry log
            try:
                while not stop.is_set() and len(written) < 20_000:
                    payload = b"live-%06d" % len(written)
                    live.add(payload)
                    written.append(payload)
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                errors.append(exc)
        writer = threading.Thread(target=keep_writing)
        writer.start()
        try:
            noise = os.urandom(64 * 1024)
            for f in [doomed.add_async(noise) for _ in range(96)]:  # ~6 MB on each bookie
                f.result(timeout=120)
            doomed.close()
            wait_for(lambda: len(written) >= 100, 60, what="the live writer under way")
            before = _wait_disk(cluster, {b.id: 6 * MiB for b in cluster.config.bookies},
                                "the doomed ledger in the entry-log files", above=True)
            bk.delete_ledger(doomed.id)
            after = _wait_disk(cluster, {b: before[b] - 5 * MiB for b in before},
                               "the deleted ledger's space back")
            print(f"ledger dir bytes before {before}, after {after}")
            wait_for(lambda: len(written) >= 200, 60, what="more live adds after the reclaim")
        finally:
            stop.set()
            writer.join(timeout=60)
        assert not errors, errors
        live.close()
        rh = bk.open_ledger(live.id, password=PW)
        assert [e.payload for e in rh.read(0, len(written) - 1)] == written
