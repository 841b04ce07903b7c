"""A briefly stalled bookie with no spare (the delayed ensemble change):
three bookies, E3/W3/A2, one bookie SIGSTOPped for three add timeouts while
1,000 adds are made.  Every add succeeds at the ack quorum; after SIGCONT
the writer re-sends what the bookie missed, without a command, so that
bookie alone then serves every entry."""

from __future__ import annotations

import os
import signal
import time

import zmq

import appliance
from appliance.checks.digest import master_key
from appliance.errors import OK
from ipc.packed import ReadPackedRequest
from ipc.replies import decode_reply
from ipc.requests import encode_request
from tests.support.launch import wait_for, wait_registered

PW = b"secret"
ADD_TIMEOUT_MS = 2_000
ADDS = 1_000
HEAL_DEADLINE_S = 120.0  # the documented bound: healed within 2 minutes


def held_prefix(endpoint: str, ledger_id: int, last: int) -> int:
    """How many entries 0.. the bookie at ``endpoint`` answers with data (one
    READ_PACKED straight to it, bypassing the client)."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(endpoint)
        sock.send_multipart(encode_request(ReadPackedRequest(
            ledger_id, 0, last, last + 1, 1 << 26, master_key=master_key(PW), request_id=9)))
        if not sock.poll(5_000, zmq.POLLIN):
            return 0
        reply = decode_reply(sock.recv_multipart())
    finally:
        sock.close()
    statuses = list(getattr(reply, "statuses", ()))
    return next((i for i, s in enumerate(statuses) if s != OK), len(statuses))


def test_a_stalled_bookie_without_a_spare_loses_no_add_and_is_healed(make_cluster):
    c = make_cluster(3, client={"add_timeout_ms": ADD_TIMEOUT_MS})
    with appliance.connect(str(c.config_path)) as bk:
        wait_registered(bk, 3)
        lh = bk.create_ledger(3, 3, 2, password=PW)
        assert lh.add(b"before") == 0
        victim = lh.metadata.ensembles[0][1][2]
        others = [b for b in lh.metadata.ensembles[0][1] if b != victim]
        payloads = [b"during-%04d-" % i + b"x" * 200 for i in range(ADDS)]
        stall_s = 3 * ADD_TIMEOUT_MS / 1000.0
        os.kill(c.procs[victim].pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            futures = []
            for i, payload in enumerate(payloads):  # spread over the stall (the load's
                futures.append(lh.add_async(payload))  # shape, not a wait for anything)
                if i % 50 == 49:
                    time.sleep(max(0.0, started + stall_s * (i + 1) / ADDS - time.monotonic()))
            assert [f.result(timeout=60) for f in futures] == list(range(1, ADDS + 1))
            assert time.monotonic() - started >= stall_s * 0.9
        finally:
            os.kill(c.procs[victim].pid, signal.SIGCONT)
        # no ensemble change was possible (no spare) and none was needed
        assert bk.ledger_metadata(lh.id).ensembles == lh.metadata.ensembles[:1]
        endpoint = c.config.bookie(victim).endpoint
        resumed = time.monotonic()
        wait_for(lambda: held_prefix(endpoint, lh.id, ADDS) == ADDS + 1, HEAL_DEADLINE_S,
                 interval_s=0.5, what=f"{victim} to hold every entry again")
        heal_s = time.monotonic() - resumed
        lh.close()
        for b in others:
            c.kill(b)
        got = bk.open_ledger(lh.id, password=PW).read(0, ADDS)
        assert [e.payload for e in got] == [b"before"] + payloads
        print(f"{victim} healed {heal_s:.1f}s after SIGCONT")
