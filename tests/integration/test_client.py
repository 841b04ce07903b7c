"""The client binding against real bookie processes: round trips, fencing,
recovery, failover, errors."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import appliance
from appliance.errors import (
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    UnauthorizedError,
)
from tests.support.launch import stop_process, wait_for, wait_registered

PW = b"secret"


def _write(bk, n: int, size: int = 100, **kw):
    lh = bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, password=PW, **kw)
    payloads = [bytes([i % 251]) * size + str(i).encode() for i in range(n)]
    futures = [lh.add_async(p) for p in payloads]
    assert [f.result(timeout=60) for f in futures] == list(range(n))
    return lh, payloads


def test_write_close_read_round_trip(client):
    lh, payloads = _write(client, 500)
    assert lh.last_add_confirmed == 499
    lh.close()
    md = client.ledger_metadata(lh.id)
    assert (md.state, md.last_entry_id) == ("CLOSED", 499)
    assert (md.ensemble_size, md.write_quorum, md.ack_quorum) == (3, 3, 2)
    assert lh.id in client.list_ledgers()
    rh = client.open_ledger(lh.id, password=PW)
    entries = rh.read(0, rh.last_add_confirmed)
    assert [e.entry_id for e in entries] == list(range(500))
    assert [e.payload for e in entries] == payloads
    assert all(e.ledger_id == lh.id for e in entries)


def test_empty_ledger_closes_at_minus_one(client):
    lh = client.create_ledger(3, 3, 2, password=PW)
    assert lh.last_add_confirmed == -1
    lh.close()
    assert client.ledger_metadata(lh.id).last_entry_id == -1
    rh = client.open_ledger(lh.id, password=PW)
    assert rh.last_add_confirmed == -1


def test_open_without_recovery_reads_up_to_lac_and_does_not_fence(client):
    lh = client.create_ledger(3, 3, 2, password=PW)
    payloads = [b"e%d" % i for i in range(20)]
    for p in payloads:  # one at a time: entry i carries LAC i - 1
        lh.add(p)
    rh = client.open_ledger(lh.id, password=PW, recovery=False)
    # entry 19 carries LAC 18; 19 itself shows once the idle writer sends its
    # explicit LAC (client.explicit_lac_interval_ms) - either is a correct view
    assert rh.last_add_confirmed in (18, 19)
    got = rh.read(0, rh.last_add_confirmed)
    assert [e.payload for e in got] == payloads[: rh.last_add_confirmed + 1]
    with pytest.raises(NoSuchEntryError):
        rh.read(0, rh.last_add_confirmed + 5)
    assert client.ledger_metadata(lh.id).state == "OPEN"
    assert lh.add(b"the writer is not fenced") == 20
    assert rh.read_lac() >= 19
    lh.close()


def test_an_idle_writers_last_entry_reaches_tailing_readers(make_cluster):
    """Explicit LAC: without another add or a close, a reader that does not
    recover sees the writer's last entry once the writer has been idle for
    explicit_lac_interval_ms; with the interval 0 it never does."""
    for interval_ms, expect in ((200, 9), (0, 8)):
        c = make_cluster(3, quorums=(3, 3, 2),
                         client={"explicit_lac_interval_ms": interval_ms})
        with appliance.connect(str(c.config_path)) as bk:
            wait_registered(bk, 3)
            lh = bk.create_ledger(3, 3, 2, password=PW)
            for i in range(10):
                lh.add(b"t%d" % i)
            rh = bk.open_ledger(lh.id, password=PW, recovery=False)
            if expect == 9:
                wait_for(lambda rh=rh: rh.read_lac() == 9, 15, what="explicit LAC 9")
                assert rh.read(9, 9)[0].payload == b"t9"
            else:
                deadline = time.monotonic() + 1.0  # five intervals of the other case
                while time.monotonic() < deadline:
                    assert rh.read_lac() == 8
                    time.sleep(0.1)  # observing that nothing changes: no event to poll for
            lh.close()


def test_many_idle_writers_lacs_reach_their_readers(make_cluster):
    """Explicit LACs of many ledgers gone idle at once travel to each bookie
    together (WRITE_LAC_MULTI): every tailing reader sees its own ledger's
    last entry, and every bookie kept an explicit LAC of every ledger."""
    from ipc.requests import InfoRequest
    from tests.integration.test_write_close import Bookies

    c = make_cluster(3, quorums=(3, 3, 2), client={"explicit_lac_interval_ms": 200})
    bookies = Bookies(c)
    try:
        with appliance.connect(str(c.config_path)) as bk:
            wait_registered(bk, 3)
            handles = [bk.create_ledger(3, 3, 2, password=PW) for _ in range(20)]
            futures = [h.add_async(b"m%d-%d" % (n, i))
                       for i in range(5) for n, h in enumerate(handles)]
            assert [f.result(timeout=30) for f in futures] == [i for i in range(5)
                                                                for _ in handles]
            readers = [bk.open_ledger(h.id, password=PW, recovery=False) for h in handles]
            wait_for(lambda: all(r.read_lac() == 4 for r in readers), 15,
                     what="every ledger's explicit LAC 4")
            assert [r.read(4, 4)[0].payload for r in readers] == \
                [b"m%d-4" % n for n in range(20)]
            counters = [bookies.call(b.id, InfoRequest()).info["counters"]
                        for b in c.config.bookies]
            assert all(n["write_lacs"] >= 20 for n in counters), counters
            assert sum(n["write_lac_multis"] for n in counters) >= 1, counters
            for h in handles:
                h.close()
    finally:
        bookies.close()


def test_recovery_open_fences_the_old_writer(client):
    lh, payloads = _write(client, 30)
    rh = client.open_ledger(lh.id, password=PW)  # recovery
    md = client.ledger_metadata(lh.id)
    assert md.state == "CLOSED" and md.last_entry_id == 29 == rh.last_add_confirmed
    with pytest.raises(LedgerFencedError):
        lh.add(b"too late")
    assert [e.payload for e in rh.read(0, 29)] == payloads
    with pytest.raises(LedgerFencedError):
        lh.close()


def test_errors_are_the_contract_classes(client):
    lh, _ = _write(client, 3)
    lh.close()
    with pytest.raises(UnauthorizedError):
        client.open_ledger(lh.id, password=b"wrong")
    with pytest.raises(UnauthorizedError):
        client.open_ledger(lh.id, password=b"wrong", recovery=False)
    with pytest.raises(NoSuchLedgerError):
        client.open_ledger(123456789, password=PW)
    with pytest.raises(NoSuchLedgerError):
        client.ledger_metadata(123456789)


def test_bad_arguments_fail_before_anything_is_sent(client):
    before = client.list_ledgers()
    with pytest.raises(ValueError, match="ack_quorum"):
        client.create_ledger(ensemble=3, write_quorum=2, ack_quorum=3)
    with pytest.raises(ValueError, match="write_quorum"):
        client.create_ledger(ensemble=3, write_quorum=4, ack_quorum=2)
    with pytest.raises(TypeError, match="ensemble"):
        client.create_ledger(ensemble="3", write_quorum=3, ack_quorum=2)
    with pytest.raises(TypeError, match="password"):
        client.create_ledger(3, 3, 2, password="str")
    with pytest.raises(ValueError, match="digest"):
        client.create_ledger(3, 3, 2, digest="md5")
    assert client.list_ledgers() == before  # nothing was created
    lh = client.create_ledger(3, 3, 2, password=PW)
    with pytest.raises(TypeError, match="payload"):
        lh.add("not bytes")
    with pytest.raises(ValueError, match="payload"):
        lh.add(b"x" * (6 * 1024 * 1024))
    assert lh.last_add_confirmed == -1
    lh.close()
    rh = client.open_ledger(lh.id, password=PW)
    with pytest.raises(ValueError, match="first_entry_id"):
        rh.read(-1, 0)
    with pytest.raises(TypeError, match="ledger_id"):
        client.open_ledger("7")


def test_delete_ledger(client):
    lh, _ = _write(client, 5)
    lh.close()
    client.delete_ledger(lh.id)
    assert lh.id not in client.list_ledgers()
    with pytest.raises(NoSuchLedgerError):
        client.open_ledger(lh.id, password=PW)
    lh2 = client.create_ledger(3, 3, 2)
    assert lh2.id != lh.id  # ids are never reused
    lh2.close()


def test_hmac_digest_round_trip(client):
    lh, payloads = _write(client, 10, digest="hmac-sha256")
    lh.close()
    rh = client.open_ledger(lh.id, password=PW)
    assert [e.payload for e in rh.read(0, 9)] == payloads


def test_concurrent_writers_from_threads(client):
    lh = client.create_ledger(3, 3, 2, password=PW)
    results: list[int] = []
    lock = threading.Lock()

    def writer(t: int) -> None:
        for i in range(100):
            entry_id = lh.add(f"{t}:{i}".encode())
            with lock:
                results.append(entry_id)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(results) == list(range(400))
    lh.close()
    payloads = {e.payload for e in client.open_ledger(lh.id, password=PW).read(0, 399)}
    assert payloads == {f"{t}:{i}".encode() for t in range(4) for i in range(100)}


def test_kill_an_ensemble_bookie_mid_write(cluster, client):
    lh = client.create_ledger(3, 3, 2, password=PW)
    victim = lh.metadata.ensembles[0][1][0]
    payloads = [b"entry-%06d" % i + bytes(1000) for i in range(3000)]
    futures = []
    for i, p in enumerate(payloads):
        futures.append(lh.add_async(p))
        if i == 1000:
            cluster.kill(victim)
    assert [f.result(timeout=120) for f in futures] == list(range(3000))
    lh.close()
    md = client.ledger_metadata(lh.id)
    assert len(md.ensembles) >= 2 and victim not in md.ensembles[-1][1]
    rh = client.open_ledger(lh.id, password=PW)
    assert [e.payload for e in rh.read(0, 2999)] == payloads


WRITER = textwrap.dedent("""
    import sys, appliance
    with appliance.connect(sys.argv[1]) as bk:
        lh = bk.create_ledger(3, 3, 2, password=b"secret")
        print("LEDGER", lh.id, flush=True)
        i = 0
        while True:
            futs = [lh.add_async(b"payload-%d" % (i + k)) for k in range(50)]
            for f in futs:
                print("ACK", f.result(), flush=True)
            i += 50
""")


def test_writer_killed_then_five_concurrent_recoveries_agree(cluster, client):
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(cluster.config_path)],
                            stdout=subprocess.PIPE, text=True)
    acked: list[int] = []
    try:
        ledger_id = int(proc.stdout.readline().split()[1])
        while len(acked) < 700:
            line = proc.stdout.readline()
            assert line, "writer died early"
            acked.append(int(line.split()[1]))
        proc.kill()
        for line in proc.stdout:  # acks printed before the kill landed
            if line.startswith("ACK"):
                acked.append(int(line.split()[1]))
    finally:
        stop_process(proc, sig=signal.SIGKILL)
    results: list = [None] * 5

    def recover(i: int) -> None:
        with appliance.connect(str(cluster.config_path)) as bk:
            rh = bk.open_ledger(ledger_id, password=PW)
            results[i] = (rh.last_add_confirmed, rh.read(0, rh.last_add_confirmed))

    threads = [threading.Thread(target=recover, args=(i,)) for i in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    lasts = {r[0] for r in results}
    assert len(lasts) == 1, lasts
    last = lasts.pop()
    assert last >= max(acked)
    assert client.ledger_metadata(ledger_id).last_entry_id == last
    for _, entries in results:
        assert [e.payload for e in entries] == [b"payload-%d" % i for i in range(last + 1)]


def test_all_bookies_down_fails_the_add(cluster, client):
    from appliance.errors import BKError

    lh = client.create_ledger(3, 3, 2, password=PW)
    assert lh.add(b"first") == 0
    cluster.kill_all()
    with pytest.raises(BKError):
        lh.add(b"nobody is there")
    assert lh.last_add_confirmed == 0


def test_fencing_survives_a_bookie_restart(cluster, client):
    lh, _ = _write(client, 10)
    client.open_ledger(lh.id, password=PW)
    for b in lh.metadata.ensembles[0][1]:
        cluster.stop_bookie(b)
        cluster.start_bookie(b)
    wait_registered(client, 4)
    with pytest.raises(LedgerFencedError):
        lh.add(b"after restart")


@pytest.mark.parametrize("backend", ["zk"])
def test_round_trip_and_fencing_on_zookeeper(backend, zookeeper, make_cluster):
    c = make_cluster(4, metadata_uri=zookeeper.new_uri("it"))
    with appliance.connect(str(c.config_path)) as bk:
        wait_registered(bk, 4)
        lh, payloads = _write(bk, 50)
        rh = bk.open_ledger(lh.id, password=PW)
        assert rh.last_add_confirmed == 49
        assert [e.payload for e in rh.read(0, 49)] == payloads
        with pytest.raises(LedgerFencedError):
            lh.add(b"fenced")
        lh2, payloads2 = _write(bk, 20)
        lh2.close()
        assert [e.payload for e in bk.open_ledger(lh2.id, password=PW).read(0, 19)] == payloads2


def test_a_hung_bookie_is_replaced_after_the_add_timeout(cluster, client):
    """SIGSTOP keeps the socket open but answers nothing: with Qa = Qw every
    add needs the hung bookie, so only the add timeout can drive the
    ensemble change that lets the adds complete."""
    import os
    import signal

    lh = client.create_ledger(3, 3, 3, password=PW)
    victim = lh.metadata.ensembles[0][1][1]
    assert lh.add(b"before") == 0
    os.kill(cluster.procs[victim].pid, signal.SIGSTOP)
    try:
        futures = [lh.add_async(b"during-%d" % i) for i in range(200)]
        assert [f.result(timeout=60) for f in futures] == list(range(1, 201))
        md = client.ledger_metadata(lh.id)
        assert victim in md.ensembles[0][1] and victim not in md.ensembles[-1][1]
    finally:
        os.kill(cluster.procs[victim].pid, signal.SIGCONT)
    lh.close()
    got = client.open_ledger(lh.id, password=PW).read(0, 200)
    assert [e.payload for e in got] == [b"before"] + [b"during-%d" % i for i in range(200)]
