"""``bkctl bookie info`` on a running bookie: what it has served since it
started (its INFO counters), in the text and in ``--json``."""

from __future__ import annotations

import json

import zmq

from appliance.protocol.keys import master_key
from ipc.requests import ReadRequest, encode_request
from tests.ipc.support import recv_within
from tests.support.bkctl import bkctl
from tests.support.launch import wait_registered

PASSWORD = b"pw"


def test_bookie_info_shows_what_the_bookie_served(make_cluster):
    import appliance

    cluster = make_cluster(1, quorums=(1, 1, 1))
    bookie = cluster.config.bookies[0]
    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 1)
        lh = bk.create_ledger(1, 1, 1, password=PASSWORD)
        for i in range(7):
            lh.add(b"entry %d" % i)
        # left open: opening it recovers it, which fences it on the bookie
        with bk.open_ledger(lh.id, PASSWORD) as rh:
            assert len(rh.read(0, 6)) == 7
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:  # a read with the wrong key: refused and counted
        sock.connect(bookie.endpoint)
        sock.send_multipart(encode_request(ReadRequest(lh.id, 0, master_key=master_key(b"no"),
                                                       request_id=1)))
        recv_within(sock)
    finally:
        sock.close(linger=0)
        ctx.term()

    shown = bkctl("bookie", "info", bookie.id, "--json", config=cluster.config_path, text=True)
    assert shown.returncode == 0, shown.stderr
    counters = json.loads(shown.stdout)["counters"]
    # the seven adds, and the recovery writing back the entries past the LAC
    assert 7 <= counters["adds"] <= 7 + 2
    assert counters["reads_refused"] == 1
    assert counters["fences"] >= 1  # the recovery fenced the ledger
    assert counters["requests"] >= 7 + 1
    scrub = json.loads(shown.stdout)["scrub"]
    assert scrub["interval_ms"] == 30_000 and scrub["passes"] >= 1  # one at start
    assert scrub["ledgers_short"] == 0

    text = bkctl("bookie", "info", bookie.id, config=cluster.config_path, text=True)
    assert text.returncode == 0, text.stderr
    line = next(ln for ln in text.stdout.splitlines() if "since start" in ln)
    assert f"{counters['adds']} adds" in line and "1 reads refused" in line, line
    assert f"{counters['fences']} fences" in line and "0 malformed" in line, line
    line = next(ln for ln in text.stdout.splitlines() if "scrub:" in ln)
    assert "0 found short" in line, line
