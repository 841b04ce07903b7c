"""Bookies refuse reads without the ledger's key (issue 16), with real bookie
processes: every read op sent raw on the wire with no key, a wrong key and
the right key is refused, refused, served; ``server.reads_need_key = false``
serves the keyless read (never a wrong key); and every reader of the product
(open and read, a tailing reader's long polls, bulk chunks, recovery, a log
reader, the autorecovery auditor's probes) carries the key: no bookie
refused any of them."""

from __future__ import annotations

import appliance
from appliance.checks.digest import make_digest
from appliance.errors import OK, NoSuchLedgerError, UnauthorizedError
from appliance.protocol.entry import verify_entry
from appliance.protocol.keys import master_key
from appliance.supervisor.probe import bookie_info
from ipc.client import Transport
from ipc.packed import ReadPackedReply, ReadPackedRequest
from ipc.replies import ReadBatchReply
from ipc.requests import ReadBatchRequest, ReadLacRequest, ReadRequest, WaitLacRequest
from tests.support.launch import wait_for, wait_registered

PW = b"read-key"
KEY = master_key(PW)
WRONG = master_key(b"a guess")
REFUSED = UnauthorizedError.code
ENTRIES = 5


def _every_read_op(ledger_id: int, key: bytes | None) -> list:
    return [ReadRequest(ledger_id, 0, master_key=key),
            ReadBatchRequest(ledger_id, 0, ENTRIES - 1, 64, 1 << 20, master_key=key),
            ReadPackedRequest(ledger_id, 0, ENTRIES - 1, 64, 1 << 20, master_key=key),
            ReadLacRequest(ledger_id, master_key=key),
            WaitLacRequest(ledger_id, -1, 0, master_key=key)]


def _ask(endpoint: str, requests: list) -> list:
    """Each request's outcome, in order: its status, or (for batch replies,
    which carry per-entry rows) the first row's; OK outcomes come with the
    reply."""
    with Transport() as transport:
        transport.add_bookie("b", endpoint)
        rids = [transport.send("b", r, 10_000) for r in requests]
        events: dict = {}

        def all_answered():
            events.update((e.request_id, e) for e in transport.next_events(100))
            return len(events) == len(rids)

        wait_for(all_answered, 15, what="read replies")
    out = []
    for rid in rids:
        status, reply = events[rid].status, events[rid].reply
        if status == OK and isinstance(reply, ReadBatchReply):
            status = reply.rows[0][1]
        elif status == OK and isinstance(reply, ReadPackedReply):
            status = int(reply.statuses[0])
        out.append((status, reply))
    return out


def _served_all(outcomes: list, ledger_id: int, payloads: list[bytes]) -> None:
    digest = make_digest("crc32c", KEY)
    read, batch, packed, lac, wait = outcomes  # each (status, reply)
    assert (read[0], batch[0], packed[0], lac[0], wait[0]) == (OK,) * 5
    assert verify_entry(read[1].data, digest, ledger_id, 0)[2] == payloads[0]
    assert [bytes(d) for _, _, d in batch[1].rows] == [bytes(e) for e in packed[1].entries()]
    assert len(packed[1].entries()) == ENTRIES
    assert lac[1].last_entry_id == wait[1].last_entry_id == ENTRIES - 1


def _reads_refused(cluster, bookie_id: str) -> int:
    info = bookie_info(cluster.config.bookie(bookie_id).endpoint, 5000)
    assert info is not None, cluster.log(bookie_id)
    return info["counters"]["reads_refused"]


def _closed_ledger(bk, payloads: list[bytes], quorums=(3, 3, 2)) -> int:
    lh = bk.create_ledger(*quorums, password=PW)
    for p in payloads:
        lh.add(p)
    lh.close()
    return lh.id


def _product_readers_read(bk) -> None:
    """Open + read, a tailing reader's long poll, bulk chunks, recovery, a log."""
    writer = bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, password=PW)
    for i in range(3):
        writer.add(b"w%d" % i)
    tail = bk.open_ledger(writer.id, password=PW, recovery=False)
    assert [e.payload for e in tail.read(0, tail.last_add_confirmed)] == \
        [b"w%d" % i for i in range(tail.last_add_confirmed + 1)]
    seen = tail.last_add_confirmed
    writer.add(b"w3")
    writer.add(b"w4")  # its header carries LAC 3: the long poll sees 3 at least
    assert tail.wait_for_lac(seen, timeout_s=20) > seen
    recovered = bk.open_ledger(writer.id, password=PW)  # fence, recovery reads, close
    assert [e.payload for e in recovered.read(0, 4)] == [b"w%d" % i for i in range(5)]
    chunks = list(recovered.read_chunks(0, 4))
    assert sum(c.count for c in chunks) == 5
    log = bk.log("keyed")
    with log.writer() as w:
        w.write(b"first")
        with log.reader() as r:
            got = r.read(timeout_s=20)
            w.write(b"second")
            while len(got) < 2:
                more = r.read(timeout_s=20)
                assert more, got
                got += more
    assert [rec.payload for rec in got] == [b"first", b"second"]


def test_bookies_serve_reads_only_with_the_ledgers_key(make_cluster):
    cluster = make_cluster(3, quorums=(3, 3, 2),
                           autorecovery={"check_interval_ms": 100})  # the auditor probes too
    payloads = [b"entry-%d" % i for i in range(ENTRIES)]
    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 3)
        ledger_id = _closed_ledger(bk, payloads)
        _product_readers_read(bk)
        bookies = [b.id for b in cluster.config.bookies]
        assert [_reads_refused(cluster, b) for b in bookies] == [0, 0, 0]
        endpoint = cluster.config.bookies[0].endpoint
        none = _ask(endpoint, _every_read_op(ledger_id, None))
        wrong = _ask(endpoint, _every_read_op(ledger_id, WRONG))
        assert [s for s, _ in none] == [s for s, _ in wrong] == [REFUSED] * 5
        _served_all(_ask(endpoint, _every_read_op(ledger_id, KEY)), ledger_id, payloads)
        unknown = _ask(endpoint, [ReadRequest(ledger_id + 1000, 0)])
        assert unknown[0][0] == NoSuchLedgerError.code  # no key known: as before
        assert [_reads_refused(cluster, b) for b in bookies] == [10, 0, 0]
        line = f"of ledger {ledger_id} from"
        log_path = cluster.root / f"{bookies[0]}.log"
        wait_for(lambda: line in log_path.read_text(errors="replace"), 10, what="refusal line")
        assert log_path.read_text(errors="replace").count(line) == 1  # once a minute, not 10


def test_reads_need_key_false_serves_keyless_reads_but_not_a_wrong_key(make_cluster):
    cluster = make_cluster(1, quorums=(1, 1, 1), server={"reads_need_key": False})
    payloads = [b"open-%d" % i for i in range(ENTRIES)]
    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 1)
        ledger_id = _closed_ledger(bk, payloads, (1, 1, 1))
        endpoint = cluster.config.bookies[0].endpoint
        _served_all(_ask(endpoint, _every_read_op(ledger_id, None)), ledger_id, payloads)
        wrong = _ask(endpoint, _every_read_op(ledger_id, WRONG))
        assert [s for s, _ in wrong] == [REFUSED] * 5
        _served_all(_ask(endpoint, _every_read_op(ledger_id, KEY)), ledger_id, payloads)
        assert _reads_refused(cluster, cluster.config.bookies[0].id) == 5
        assert [e.payload for e in bk.open_ledger(ledger_id, password=PW).read(0, 4)] == payloads
