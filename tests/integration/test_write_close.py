"""BP-32 on real bookies (per-ledger entry logs): closing a ledger sends the
advisory WRITE_CLOSE to every bookie of its ensemble, which rotate the
ledger's log without waiting for a checkpoint; a wrong key is refused and
changes nothing; a bookie down during the close changes nothing for the
writer (its close returns at once and succeeds)."""

from __future__ import annotations

import time

import zmq

import appliance
from appliance.errors import OK, UnauthorizedError
from appliance.protocol.keys import master_key
from ipc.replies import decode_reply
from ipc.requests import InfoRequest, WriteCloseRequest, encode_request
from tests.ipc.support import recv_within
from tests.support.launch import wait_for, wait_registered

PW = b"pw"
# no checkpoint and no idle expiry during the test: only WRITE_CLOSE rotates
PER_LEDGER = {"storage": {"entry_log_per_ledger": True, "checkpoint_interval_s": 3600.0,
                          "entry_log_idle_ms": 3_600_000}}


class Bookies:
    """One DEALER per bookie, for INFO and hand-made requests."""

    def __init__(self, cluster):
        self.ctx = zmq.Context()
        self.socks = {}
        for b in cluster.config.bookies:
            sock = self.ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(b.endpoint)
            self.socks[b.id] = sock
        self.rid = 0

    def call(self, bookie_id: str, request):
        self.rid += 1
        request.request_id = self.rid
        self.socks[bookie_id].send_multipart(encode_request(request))
        return decode_reply(recv_within(self.socks[bookie_id]))

    def storage(self, bookie_id: str) -> dict:
        return self.call(bookie_id, InfoRequest()).info["storage"]

    def close(self) -> None:
        for sock in self.socks.values():
            sock.close(0)
        self.ctx.term()


def _rotated(bookies, ids) -> bool:
    stats = [bookies.storage(b) for b in ids]
    return all(s["entry_logs_rotated_write_close"] == 1 and s["entry_logs_open"] == 0
               for s in stats)


def test_close_rotates_the_ledger_log_on_every_ensemble_bookie_and_a_wrong_key_is_refused(
        make_cluster):
    cluster = make_cluster(3, quorums=(3, 3, 2), **PER_LEDGER)
    bookies = Bookies(cluster)
    try:
        with appliance.connect(str(cluster.config_path)) as bk:
            wait_registered(bk, 3)
            lh = bk.create_ledger(3, 3, 2, password=PW)
            for f in [lh.add_async(b"e%d" % i) for i in range(50)]:
                f.result(timeout=30)
            ids = [b.id for b in cluster.config.bookies]

            def all_stored() -> bool:  # A=2: the third copy may still be on its way
                return all(bookies.storage(b)["entries"] == 50 for b in ids)
            wait_for(all_stored, 15, what="every bookie holds the 50 entries")
            before = {b: bookies.storage(b) for b in ids}
            assert all(s["entry_logs_open"] == 1 for s in before.values())

            # (c) a wrong key is refused with Unauthorized and rotates nothing
            reply = bookies.call(ids[0], WriteCloseRequest(lh.id, master_key(b"other")))
            assert reply.status == UnauthorizedError.code
            assert bookies.storage(ids[0])["entry_logs_open"] == 1
            assert bookies.storage(ids[0])["entry_logs_rotated_write_close"] == 0

            lh.close()
            # (a) rotated on every ensemble bookie, with no checkpoint in between
            wait_for(lambda: _rotated(bookies, ids), 15, what="write-close rotations")
            assert all(bookies.storage(b)["checkpoints"] == before[b]["checkpoints"]
                       for b in ids)
            wait_for(lambda: bk.driver.write_close_outcomes["succeeded"] == 1, 15,
                     what="write close outcome logged")
            # the right key by hand: OK, nothing more to rotate; the data reads back
            assert bookies.call(ids[0], WriteCloseRequest(lh.id, master_key(PW))).status == OK
            rh = bk.open_ledger(lh.id, password=PW)
            assert [e.payload for e in rh.read(0, 49)] == [b"e%d" % i for i in range(50)]
    finally:
        bookies.close()


def test_a_bookie_down_during_close_changes_nothing_for_the_writer(make_cluster):
    cluster = make_cluster(3, quorums=(3, 3, 2), client={"add_timeout_ms": 3000},
                           **PER_LEDGER)
    bookies = Bookies(cluster)
    try:
        with appliance.connect(str(cluster.config_path)) as bk:
            wait_registered(bk, 3)
            lh = bk.create_ledger(3, 3, 2, password=PW)
            for f in [lh.add_async(b"e%d" % i) for i in range(20)]:
                f.result(timeout=30)
            ids = [b.id for b in cluster.config.bookies]
            wait_for(lambda: all(bookies.storage(b)["entries"] == 20 for b in ids), 15,
                     what="every bookie holds the 20 entries")
            down = ids[2]
            cluster.kill(down)
            started = time.monotonic()
            lh.close()  # the WRITE_CLOSE to the dead bookie cannot be answered
            close_s = time.monotonic() - started
            assert close_s < 2.0, f"close waited {close_s:.1f}s for the advisory write close"
            md = bk.ledger_metadata(lh.id)
            assert (md.state, md.last_entry_id) == ("CLOSED", 19)
            alive = [b.id for b in cluster.config.bookies if b.id != down]
            wait_for(lambda: _rotated(bookies, alive), 15, what="rotations on live bookies")
            wait_for(lambda: bk.driver.write_close_outcomes["partly"] == 1, 30,
                     what="partly-succeeded outcome logged")
            rh = bk.open_ledger(lh.id, password=PW)
            assert [e.payload for e in rh.read(0, 19)] == [b"e%d" % i for i in range(20)]
    finally:
        bookies.close()
