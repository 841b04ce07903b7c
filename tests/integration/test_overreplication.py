"""Over-replicated data on real bookie processes: a bookie that comes back
after its ledgers were re-replicated away deletes its stale copies after the
grace period, while every entry still reads back from the new ensembles; and
a replacement in the middle of a copy (marker held, CAS not done yet) keeps
its copies although no metadata names it yet."""

from __future__ import annotations

import json
import threading

import appliance
from appliance.errors import OK, NoSuchLedgerError
from appliance.protocol.keys import master_key
from appliance.rereplication.markers import CopyMarkers
from appliance.rereplication.rereplicator import Rereplicator
from appliance.supervisor.probe import bookie_info
from ipc.client import Transport
from ipc.packed import ReadPackedRequest
from ipc.requests import ReadLacRequest
from tests.support.bkctl import bkctl
from tests.support.launch import wait_for, wait_registered

PW = b"pw"
MANUAL = {"enabled": False}  # the re-replication is run by the test
GRACE_MS = 1000
FAST_GC = {"gc_interval_ms": 200, "overreplicated_grace_ms": GRACE_MS}


def _payloads(tag: int, count: int) -> list[bytes]:
    return [b"ledger %d entry %d " % (tag, i) + b"y" * (i % 29) for i in range(count)]


def _closed_ledger_on(bk, bookie_id: str, count: int, tag: int, tries_max: int = 40):
    """A closed ledger whose only fragment names ``bookie_id`` (ensembles are
    random, and a writer may replace a bookie it has not reconnected to yet:
    such ledgers are left as they are)."""
    for _ in range(tries_max):
        lh = bk.create_ledger(3, 3, 2, password=PW)
        if bookie_id in lh.metadata.bookies():
            payloads = _payloads(tag, count)
            for fut in [lh.add_async(p) for p in payloads]:
                fut.result(timeout=60)
            lh.close()
            md = bk.ledger_metadata(lh.id)
            if len(md.ensembles) == 1 and bookie_id in md.bookies():
                return lh.id, payloads
        lh.close()
    raise AssertionError(f"no ledger on {bookie_id} after {tries_max} tries")


def _read_all(bk, ledger_id: int) -> list[bytes]:
    rh = bk.open_ledger(ledger_id, password=PW)
    return [bytes(e.payload) for e in rh.read(0, rh.last_add_confirmed)]


def _gc(cluster, bookie_id: str) -> dict:
    info = bookie_info(cluster.config.bookie(bookie_id).endpoint, 2000)
    assert info is not None, f"{bookie_id} did not answer INFO"
    return info["gc"]


def _entries_held(cluster, bookie_id: str, ledger_id: int, last: int) -> int:
    """How many of entries 0..last the bookie itself serves (0 if it holds
    no such ledger): asked of that one bookie, not of an ensemble."""
    with Transport() as transport:
        transport.add_bookie("b", cluster.config.bookie(bookie_id).endpoint)
        transport.send("b", ReadPackedRequest(ledger_id, 0, last, last + 1, 64 << 20,
                                              master_key=master_key(PW)), 10_000)
        (event,) = wait_for(lambda: transport.next_events(100), 15, what="read reply")
    if event.status != OK:
        return 0
    return sum(1 for s in event.reply.statuses if s == OK)


def _holds_ledger(cluster, bookie_id: str, ledger_id: int) -> bool:
    with Transport() as transport:
        transport.add_bookie("b", cluster.config.bookie(bookie_id).endpoint)
        transport.send("b", ReadLacRequest(ledger_id, master_key=master_key(PW)), 10_000)
        (event,) = wait_for(lambda: transport.next_events(100), 15, what="read lac reply")
    assert event.status in (OK, NoSuchLedgerError.code), event
    return event.status == OK


def test_a_returning_bookie_deletes_the_copies_moved_away_from_it(make_cluster):
    cluster = make_cluster(5, quorums=(3, 3, 2), autorecovery=MANUAL, server=FAST_GC)
    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 5)
        victim = "bookie-2"
        moved = dict(_closed_ledger_on(bk, victim, 40 + 20 * t, t) for t in range(3))
        cluster.stop_bookie(victim)  # stopped, not wiped: it keeps its copies
        wait_for(lambda: victim not in bk.registry.available(), 15, what=f"{victim} gone")
        with Rereplicator(bk.ledgers, bk.registry, passwords=[PW]) as rr:
            report = rr.recover(victim)
        assert report.ok and sorted(report.ledgers_recovered) == sorted(moved), report
        assert CopyMarkers(bk.ledgers.store).markers() == []  # released after each CAS

        cluster.start_bookie(victim)
        wait_registered(bk, 5)
        for ledger_id, payloads in moved.items():  # it still has them when it comes back
            assert _entries_held(cluster, victim, ledger_id, len(payloads) - 1) == len(payloads)
        with appliance.connect(str(cluster.config_path)) as fresh:  # knows it is back
            kept_id, kept_payloads = _closed_ledger_on(fresh, victim, 30, 9)  # names it: kept

        wait_for(lambda: _gc(cluster, victim)["overreplicated_deleted"] >= len(moved), 60,
                 what=f"{victim} deletes its over-replicated ledgers")
        gc = _gc(cluster, victim)
        assert gc["overreplicated_deleted"] == len(moved)
        assert gc["overreplicated_entries_deleted"] == sum(len(p) for p in moved.values())
        for ledger_id in moved:
            assert not _holds_ledger(cluster, victim, ledger_id)
        assert _entries_held(cluster, victim, kept_id, 29) == 30
        for ledger_id, payloads in {**moved, kept_id: kept_payloads}.items():
            assert _read_all(bk, ledger_id) == payloads  # from the new ensembles
        status = bkctl("status", "--json", config=cluster.config_path)
        assert status.returncode == 0, status.stderr
        row = next(r for r in json.loads(status.stdout)["bookies"] if r["id"] == victim)
        assert row["gc"]["overreplicated_deleted"] == len(moved)
        assert "over-replicated" in cluster.log(victim)
    cluster.stop()


def test_copies_moved_by_autorecovery_are_collected_when_the_bookie_returns(make_cluster):
    cluster = make_cluster(4, quorums=(3, 3, 2), server=FAST_GC, autorecovery={
        "lost_bookie_delay_ms": 500, "check_interval_ms": 600_000,
        "open_ledger_grace_ms": 600_000})
    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 4)
        victim = "bookie-3"
        moved = dict(_closed_ledger_on(bk, victim, 50, t) for t in range(2))
        cluster.stop_bookie(victim)
        wait_for(lambda: not any(victim in bk.ledger_metadata(i).bookies() for i in moved), 120,
                 what=f"autorecovery moves every ledger off {victim}", interval_s=0.2)
        assert CopyMarkers(bk.ledgers.store).markers() == []
        cluster.start_bookie(victim)
        wait_for(lambda: _gc(cluster, victim)["overreplicated_deleted"] >= len(moved), 60,
                 what=f"{victim} deletes the copies autorecovery moved")
        for ledger_id, payloads in moved.items():
            assert not _holds_ledger(cluster, victim, ledger_id)
            assert _read_all(bk, ledger_id) == payloads
    cluster.stop()


class _HeldBeforeCas(Rereplicator):
    """Copies ``held_ledger``, then waits at its CAS until the test lets it go."""

    def __init__(self, *args, held_ledger: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.held_ledger = held_ledger
        self.at_cas = threading.Event()
        self.go = threading.Event()

    def _repoint(self, plan, *args, **kwargs):
        if plan.ledger_id == self.held_ledger:
            self.at_cas.set()
            assert self.go.wait(120), "the test never released the CAS"
        return super()._repoint(plan, *args, **kwargs)


def test_a_replacement_keeps_copies_a_pending_cas_will_name(make_cluster):
    cluster = make_cluster(4, quorums=(3, 3, 2), autorecovery=MANUAL, server=FAST_GC)
    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 4)
        ledger_id, payloads = _closed_ledger_on(bk, "bookie-1", 80, 1)
        ensemble = bk.ledger_metadata(ledger_id).ensembles[0][1]
        lost = next(b for b in ensemble if b != "bookie-1")
        (replacement,) = {b.id for b in cluster.config.bookies} - set(ensemble)
        cluster.stop_bookie(lost)
        wait_for(lambda: lost not in bk.registry.available(), 15, what=f"{lost} gone")
        result = {}
        with _HeldBeforeCas(bk.ledgers, bk.registry, passwords=[PW],
                            held_ledger=ledger_id) as rr:
            worker = threading.Thread(target=lambda: result.update(r=rr.recover(lost)))
            worker.start()
            try:
                assert rr.at_cas.wait(60), "the copy never finished"
                assert replacement not in bk.ledger_metadata(ledger_id).bookies()
                assert CopyMarkers(bk.ledgers.store).held_for(ledger_id, replacement)
                assert _entries_held(cluster, replacement, ledger_id, 79) == 80
                # the replacement's GC sees a ledger no metadata names it for,
                # for well over the grace period and its passes
                start = _gc(cluster, replacement)["passes"]
                wait_for(lambda: _gc(cluster, replacement)["passes"] >= start + 12, 60,
                         what="gc passes on the replacement while the copy is pending")
                assert _gc(cluster, replacement)["overreplicated_deleted"] == 0
                assert _entries_held(cluster, replacement, ledger_id, 79) == 80
            finally:
                rr.go.set()
                worker.join(120)
        assert result["r"].ok, result
        assert replacement in bk.ledger_metadata(ledger_id).bookies()
        assert CopyMarkers(bk.ledgers.store).markers() == []
        assert _entries_held(cluster, replacement, ledger_id, 79) == 80
        cluster.stop_bookie("bookie-1")  # the replacement and one more replica suffice
        assert _read_all(bk, ledger_id) == payloads
        assert _gc(cluster, replacement)["overreplicated_deleted"] == 0
    cluster.stop()
