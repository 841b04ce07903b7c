"""Local security with real bookie processes: sockets, data, metadata and
the cluster key are owner-only; a data directory opened to others is named
at boot with the fix."""

from __future__ import annotations

import os
import stat

import appliance
from tests.support.launch import wait_for, wait_registered


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_what_bookies_create_is_owner_only_and_open_dirs_are_reported(make_cluster):
    cluster = make_cluster(3, quorums=(3, 3, 2))
    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 3)
        lh = bk.create_ledger(3, 3, 2, password=b"pw")
        for f in [lh.add_async(b"secret %d" % i) for i in range(50)]:
            f.result(timeout=60)
        lh.close()
        db = getattr(bk.ledgers.store, "db_path", None)
    config = cluster.config
    for b in config.bookies:
        sock = b.endpoint[len("ipc://"):]
        assert _mode(sock) == 0o600, sock
        for root in (b.journal_dir, b.ledger_dir):
            for dirpath, _dirs, files in os.walk(root):
                for name in files:
                    path = os.path.join(dirpath, name)
                    assert _mode(path) & 0o077 == 0, (path, oct(_mode(path)))
    assert db is not None and _mode(db) == 0o600
    assert _mode(config.cluster_key_path) == 0o600

    victim = config.bookies[0]
    os.chmod(victim.ledger_dir, 0o755)  # opened by hand
    cluster.stop_bookie(victim.id)
    cluster.start_bookie(victim.id)
    line = f"ledger_dir {victim.ledger_dir} is open to other local users (mode 0755): " \
           f"chmod 700 {victim.ledger_dir}"
    wait_for(lambda: line in cluster.log(victim.id), 30, what="the warning line")
    from appliance.supervisor.probe import bookie_info

    info = bookie_info(victim.endpoint, 5000)
    assert any(line in entry for entry in info["boot"]["open_to_others"]), info["boot"]
