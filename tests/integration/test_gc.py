"""Deleting a ledger gives its disk space back on the real bookies, and the
ledgers that remain read back intact (also after the bookies restart)."""

from __future__ import annotations

import appliance
from storage.entry_log import list_logs
from tests.support.launch import wait_for, wait_registered

PW = b"pw"
GC = {"server": {"gc_interval_ms": 200},
      "storage": {"checkpoint_interval_s": 0.5, "entry_log_rotate_bytes": 262144,
                  "add_batch_bytes_max": 131072, "entry_bytes_max": 65536}}


def _log_ids(cluster):
    return {b.id: set(list_logs(str(b.ledger_dir))) for b in cluster.config.bookies}


def test_deleted_ledger_space_is_reclaimed_and_survivors_stay_readable(make_cluster):
    cluster = make_cluster(3, quorums=(3, 3, 2), **GC)
    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 3)
        doomed = bk.create_ledger(3, 3, 2, password=PW)
        for f in [doomed.add_async(b"d" * 1000) for _ in range(2000)]:  # ~2 MB: many logs
            f.result(timeout=60)
        doomed.close()
        keep = bk.create_ledger(3, 3, 2, password=PW)
        kept = [b"k%d" % i * 50 for i in range(500)]
        for f in [keep.add_async(p) for p in kept]:
            f.result(timeout=60)
        keep.close()
        before = _log_ids(cluster)
        assert all(len(ids) >= 6 for ids in before.values())

        bk.delete_ledger(doomed.id)

        def reclaimed():
            now = _log_ids(cluster)
            return all(len(before[b] - now[b]) >= 4 for b in before)
        wait_for(reclaimed, 60, what="entry logs of the deleted ledger removed")

        rh = bk.open_ledger(keep.id, password=PW)
        assert [e.payload for e in rh.read(0, 499)] == kept

    cluster.stop()
    cluster.start()
    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 3)
        rh = bk.open_ledger(keep.id, password=PW)
        assert [e.payload for e in rh.read(0, 499)] == kept
