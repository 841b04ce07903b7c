"""Disk-full protection on real processes: a bookie whose disk is (by its
thresholds) full turns read-only; the writer moves its ledger off it without
losing or failing an add, new ledgers avoid it, and it still serves reads."""

from __future__ import annotations

import zmq

import appliance
from appliance.checks.digest import master_key
from appliance.errors import ReadOnlyError
from appliance.supervisor.probe import bookie_info
from ipc.replies import decode_reply
from ipc.requests import AddRequest, encode_request
from tests.ipc.support import recv_within
from tests.support.launch import wait_for, wait_registered

PW = b"pw"


def _full_disk_config(cluster):
    """The cluster's config, except that any usage counts as full."""
    path = cluster.root / "full.toml"
    path.write_text(cluster.config_path.read_text() + "\n[server]\ndisk_usage_max = 0.01\n"
                    "disk_usage_resume = 0.01\ndisk_check_interval_ms = 100\n")
    return path


def test_a_full_bookie_is_replaced_in_the_ensemble_and_still_serves_reads(make_cluster):
    cluster = make_cluster(4, quorums=(3, 3, 2))
    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 4)
        lh = bk.create_ledger(3, 3, 2, password=PW)
        payloads = [b"entry %d " % i * 20 for i in range(400)]
        assert [lh.add(p) for p in payloads[:200]] == list(range(200))
        full = sorted(lh.metadata.ensembles[0][1])[0]

        cluster.stop_bookie(full)
        cluster.start_bookie(full, config_path=_full_disk_config(cluster))
        wait_for(lambda: bk.registry.get(full)["read_only"], 15, what="read-only flag")
        endpoint = bk.registry.get(full)["endpoint"]
        assert bookie_info(endpoint, 2000)["read_only"] is True

        futures = [lh.add_async(p) for p in payloads[200:]]
        assert [f.result(timeout=60) for f in futures] == list(range(200, 400))
        # Two acks suffice, so adds may complete before the refusal is handled:
        # the ensemble change follows it (under a loaded CI run it took over
        # 15 s once: a deadline, not a speed claim).
        wait_for(lambda: len(lh.metadata.ensembles) >= 2, 60, what="ensemble change")
        assert full not in lh.metadata.ensembles[-1][1]
        lh.close()

        rh = bk.open_ledger(lh.id, password=PW)
        assert [e.payload for e in rh.read(0, 399)] == payloads
        # The client re-reads the registry every second; then new ledgers avoid it.
        wait_for(lambda: full not in bk.driver.available_bookies, 15, what="client view")
        for _ in range(5):
            other = bk.create_ledger(3, 3, 2, password=PW)
            assert full not in other.metadata.bookies()
            other.close()

    ctx = zmq.Context()  # a direct add is refused with the read-only code
    sock = ctx.socket(zmq.DEALER)
    try:
        sock.connect(endpoint)
        sock.send_multipart(encode_request(AddRequest(999, 0, master_key(PW), b"x",
                                                      request_id=7)))
        reply = decode_reply(recv_within(sock))
        assert (reply.request_id, reply.status) == (7, ReadOnlyError.code)
    finally:
        sock.close(linger=0)
        ctx.term()
