"""``bkctl bookie recover`` on real bookie processes: a bookie is stopped for
good, its ledgers are re-replicated, and every entry is readable from the
copies alone."""

from __future__ import annotations

import json
import signal

import pytest

import appliance
from appliance.checks.digest import make_digest, master_key
from appliance.errors import LedgerClosedError, LedgerFencedError
from appliance.meta.ledgers import ledger_path
from appliance.protocol.entry import pack_entry, verify_run
from appliance.protocol.rereplication_plan import choose_replacement, plan_ledger, runs_to_copy
from appliance.rereplication.rereplicator import Rereplicator, underreplicated
from ipc.client import Transport
from ipc.packed import AddPackedRequest, ReadPackedRequest
from ipc.requests import ReadLacRequest
from tests.support.bkctl import bkctl
from tests.support.launch import wait_for, wait_registered

PW = b"pw"
OTHER_PW = b"other"

MANUAL = {"enabled": False}  # these tests run the re-replication by hand


def _payloads(ledger_tag: int, count: int) -> list[bytes]:
    return [b"ledger %d entry %d " % (ledger_tag, i) + b"x" * (i % 37) for i in range(count)]


def _write_closed(bk, count: int, password: bytes = PW, tag: int = 0):
    lh = bk.create_ledger(3, 3, 2, password=password)
    payloads = _payloads(tag, count)
    for fut in [lh.add_async(p) for p in payloads]:
        fut.result(timeout=60)
    lh.close()
    return lh.id, payloads


def _multi_fragment_ledger(cluster, bk):
    """A closed ledger with two fragments: a bookie of its ensemble is killed
    half-way, so the writer replaces it (then the bookie comes back)."""
    lh = bk.create_ledger(3, 3, 2, password=PW)
    payloads = _payloads(99, 240)
    assert [lh.add(p) for p in payloads[:120]] == list(range(120))
    victim = lh.metadata.ensembles[0][1][0]
    cluster.kill(victim, signal.SIGKILL)
    for fut in [lh.add_async(p) for p in payloads[120:]]:
        fut.result(timeout=60)
    wait_for(lambda: len(lh.metadata.ensembles) >= 2, 30, what="ensemble change")
    lh.close()
    cluster.start_bookie(victim)
    wait_registered(bk, 5)
    return lh.id, payloads


def _ledger_naming(bk, bookie_id: str, count: int, password: bytes, tag: int,
                   tries_max: int = 40):
    """A closed ledger whose ensemble includes ``bookie_id`` (ensembles are
    random: ledgers that miss it are kept, closed and empty)."""
    for _ in range(tries_max):
        lh = bk.create_ledger(3, 3, 2, password=password)
        if bookie_id in lh.metadata.bookies():
            payloads = _payloads(tag, count)
            for fut in [lh.add_async(p) for p in payloads]:
                fut.result(timeout=60)
            return lh, payloads
        lh.close()
    raise AssertionError(f"no ledger on {bookie_id} after {tries_max} tries")


def _read_all(bk, ledger_id: int, password: bytes = PW) -> list[bytes]:
    rh = bk.open_ledger(ledger_id, password=password)
    if rh.last_add_confirmed < 0:
        return []
    return [bytes(e.payload) for e in rh.read(0, rh.last_add_confirmed)]


def _replacement_holds(bk, fragment: dict, lost: str, password: bytes) -> int:
    """Read the lost bookie's share of ``fragment`` from its replacement
    alone, verifying every record; returns how many entries it holds."""
    md = bk.ledger_metadata(fragment["ledger_id"])
    ensemble = dict(md.ensembles)[fragment["first_entry_id"]]
    position = ensemble.index(fragment["replacement"])
    digest = make_digest(md.digest_type, master_key(password))
    endpoint = bk.registry.get(fragment["replacement"])["endpoint"]
    held = 0
    with Transport() as transport:
        transport.add_bookie("r", endpoint)
        for first, last in runs_to_copy(fragment["first_entry_id"], fragment["last_entry_id"],
                                        md.ensemble_size, md.write_quorum, position):
            transport.send("r", ReadPackedRequest(md.ledger_id, first, last, last - first + 1,
                                                  64 << 20, master_key=master_key(password)),
                           10_000)
            (event,) = wait_for(lambda: transport.next_events(100), 15, what="read reply")
            assert event.status == 0, event
            verified, _ = verify_run(event.reply.entries(), digest, md.ledger_id, first)
            assert len(verified) == last - first + 1, (fragment, first, last, len(verified))
            held += len(verified)
    return held


def test_recover_a_lost_bookie_end_to_end(make_cluster):
    # the open ledger's writer never publishes its LAC on its own, so the
    # recovery re-writes its tail and replaces the lost bookie itself
    cluster = make_cluster(5, quorums=(3, 3, 2), client={"explicit_lac_interval_ms": 0},
                           autorecovery=MANUAL)
    config = cluster.config_path
    with appliance.connect(str(config)) as bk:
        wait_registered(bk, 5)
        expected: dict[int, list[bytes]] = {}
        multi_id, expected[multi_id] = _multi_fragment_ledger(cluster, bk)
        multi = bk.ledger_metadata(multi_id)
        lost = multi.ensembles[0][1][1]  # kept in both fragments
        assert all(lost in ens for _, ens in multi.ensembles)
        for tag in (1, 2, 3):
            lh, expected_payloads = _ledger_naming(bk, lost, 150 * tag, PW, tag)
            lh.close()
            expected[lh.id] = expected_payloads
        empty, _ = _ledger_naming(bk, lost, 0, PW, 4)
        empty.close()
        expected[empty.id] = []
        stranger, stranger_payloads = _ledger_naming(bk, lost, 50, OTHER_PW, 5)
        stranger.close()
        writer, open_payloads = _ledger_naming(bk, lost, 80, PW, 6)  # stays OPEN

        cluster.stop_bookie(lost)
        wait_for(lambda: lost not in bk.registry.available(), 15, what=f"{lost} gone")
        named = {i for i in bk.list_ledgers() if lost in bk.ledger_metadata(i).bookies()}
        assert named == {*expected, stranger.id, writer.id}
        # per fragment, the other original replicas (to stop one of them later)
        originals = [b for i in named for _, ens in bk.ledger_metadata(i).ensembles
                     if lost in ens for b in ens if b != lost]

        # underreplicated lists exactly the ledgers naming the lost bookie
        result = bkctl("bookie", "underreplicated", "--json", config=config, text=True)
        assert result.returncode == 0, result.stderr
        listed = json.loads(result.stdout)
        assert {item["ledger_id"] for item in listed} == named
        assert all(item["missing"] == [lost] for item in listed)

        # unknown ids are refused with one line
        result = bkctl("bookie", "recover", "bookie-99", config=config, text=True)
        assert result.returncode != 0
        assert "unknown bookie id" in result.stderr and len(result.stderr.splitlines()) == 1

        # dry run: plans, changes nothing
        result = bkctl("bookie", "recover", lost, "--password", "pw", "--dry-run",
                       "--json", config=config, text=True)
        assert result.returncode == 1, result.stderr  # the open and the stranger are skipped
        plan = json.loads(result.stdout)
        assert plan["dry_run"] is True and plan["entries_copied"] == 0
        assert {f["ledger_id"] for f in plan["fragments"]} == set(expected)
        assert all(bk.ledger_metadata(i).bookies() >= {lost} for i in named)

        # first run: CLOSED ledgers with the given password; the rest is reported
        result = bkctl("bookie", "recover", lost, "--password", "pw", "--json", config=config,
                       text=True)
        assert result.returncode == 1, result.stderr
        report = json.loads(result.stdout)
        assert sorted(report["ledgers_recovered"]) == sorted(expected)
        assert report["entries_copied"] == sum(len(p) for p in expected.values())
        reasons = {s["ledger_id"]: s["reason"] for s in report["skipped"]}
        assert set(reasons) == {stranger.id, writer.id} and report["failed"] == []
        assert "wrong password" in reasons[stranger.id]
        assert "OPEN" in reasons[writer.id] and "--recover-open" in reasons[writer.id]
        assert f"ledgers {len(named)}/{len(named)} done" in result.stderr  # progress
        for ledger_id in expected:
            md = bk.ledger_metadata(ledger_id)
            assert lost not in md.bookies() and md.state == "CLOSED"
        assert len([f for f in report["fragments"] if f["ledger_id"] == multi_id]) == 2
        for fragment in report["fragments"]:
            assert fragment["replacement"] != lost
            holds = _replacement_holds(bk, fragment, lost, PW)
            assert holds == fragment["entries"]

        # second run: both passwords, open ledgers fenced and closed first
        result = bkctl("bookie", "recover", lost, "--password", "pw",
                       "--password", "other", "--recover-open", "--json", config=config,
                       text=True)
        assert result.returncode == 0, result.stdout + result.stderr
        second_run = json.loads(result.stdout)
        # both healed ledgers are reported, also when the recovery's own
        # ensemble change (the writer never published its LAC) replaced the
        # lost bookie; then that replacement's share was copied durably too
        assert sorted(second_run["ledgers_recovered"]) == sorted([stranger.id, writer.id])
        by_recovery = [f for f in second_run["fragments"] if f.get("by_recovery")]
        assert [f["ledger_id"] for f in by_recovery] == [writer.id]
        assert by_recovery[0]["entries"] >= 1
        for fragment in second_run["fragments"]:
            password = OTHER_PW if fragment["ledger_id"] == stranger.id else PW
            assert _replacement_holds(bk, fragment, lost, password) == fragment["entries"]
        with pytest.raises((LedgerFencedError, LedgerClosedError)):
            writer.add(b"after recovery")  # the writer was fenced out
        expected[stranger.id] = stranger_payloads
        expected[writer.id] = open_payloads

        # a third run is a no-op; nothing is under-replicated any more
        result = bkctl("bookie", "recover", lost, "--password", "pw", "--password",
                       "other", "--json", config=config, text=True)
        assert result.returncode == 0, result.stderr
        again = json.loads(result.stdout)
        assert again["ok"] is True and again["entries_copied"] == 0
        assert again["ledgers_recovered"] == [] and again["fragments"] == []
        result = bkctl("bookie", "underreplicated", "--json", config=config, text=True)
        assert result.returncode == 0 and json.loads(result.stdout) == []
        assert all(lost not in bk.ledger_metadata(i).bookies() for i in bk.list_ledgers())

        # every entry reads back with the lost bookie down and one more original
        # replica stopped: the one sharing the most fragments with it
        second = max(set(originals), key=originals.count)
        cluster.stop_bookie(second)
        wait_for(lambda: second not in bk.registry.available(), 15, what=f"{second} gone")
    with appliance.connect(str(config)) as bk:
        for ledger_id, payloads in expected.items():
            password = OTHER_PW if ledger_id == stranger.id else PW
            assert _read_all(bk, ledger_id, password) == payloads, ledger_id
        # and a ledger whose replacement is its only bookie left still reads back
        solo = next(f for f in report["fragments"] if f["entries"] >= 150)
        (ensemble,) = [ens for _, ens in bk.ledger_metadata(solo["ledger_id"]).ensembles]
        if solo["replacement"] == second:  # it replaced the lost bookie here: bring it back
            cluster.start_bookie(second)
        for bookie_id in set(ensemble) - {solo["replacement"]}:
            cluster.stop_bookie(bookie_id)
        assert _read_all(bk, solo["ledger_id"]) == expected[solo["ledger_id"]]


def test_no_writable_replacement_or_a_damaged_record_is_reported_metadata_kept(make_cluster):
    cluster = make_cluster(3, quorums=(3, 3, 2), autorecovery=MANUAL)
    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 3)
        ledger_id, payloads = _write_closed(bk, 30)
        damaged_id, _ = _write_closed(bk, 1)
        lost = bk.ledger_metadata(ledger_id).ensembles[0][1][0]
        cluster.stop_bookie(lost)
        wait_for(lambda: lost not in bk.registry.available(), 15, what=f"{lost} gone")
        assert underreplicated(bk.ledgers, bk.registry) == [
            {"ledger_id": i, "state": "CLOSED", "missing": [lost]} for i in (ledger_id, damaged_id)]
        _, version = bk.ledgers.read_ledger(damaged_id)
        bk.ledgers.store.set(ledger_path(damaged_id), b"not a ledger record", version)
        with Rereplicator(bk.ledgers, bk.registry, passwords=[PW]) as rr:
            report = rr.recover(lost)
        assert not report.ok and report.entries_copied == 0
        (failure,) = report.failed  # a damaged record is reported, the rest carries on
        assert failure["ledger_id"] == damaged_id and ledger_path(damaged_id) in failure["reason"]
        (skip,) = report.skipped
        assert skip["ledger_id"] == ledger_id and "no writable replacement" in skip["reason"]
        assert lost in bk.ledger_metadata(ledger_id).bookies()  # never dropped uncopied
        assert _read_all(bk, ledger_id) == payloads


def _overwrite(bk, bookie_id: str, ledger_id: int, entry_id: int, record: bytes) -> None:
    """Store ``record`` as the entry on one bookie (a recovery add): a stand-in
    for a copy damaged on that bookie's disk."""
    with Transport() as transport:
        transport.add_bookie("b", bk.registry.get(bookie_id)["endpoint"])
        request = AddPackedRequest.of(ledger_id, master_key(PW), [entry_id], [record],
                                      recovery=True)
        transport.send("b", request, 10_000)
        (event,) = wait_for(lambda: transport.next_events(100), 15, what="add reply")
        assert event.status == 0 and list(event.reply.statuses) == [0], event


def _damaged(record: bytes) -> bytes:
    return record[:-1] + bytes([record[-1] ^ 0xFF])  # last payload byte flipped


def test_recover_fails_over_damaged_copies_and_never_copies_them(make_cluster):
    cluster = make_cluster(4, quorums=(3, 3, 2), autorecovery=MANUAL)
    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 4)
        first_id, first_payloads = _write_closed(bk, 40, tag=1)
        lost = bk.ledger_metadata(first_id).ensembles[0][1][0]
        second, _ = _ledger_naming(bk, lost, 40, PW, 2)
        second.close()
        digest = make_digest("crc32c", master_key(PW))
        plans = {i: plan_ledger(bk.ledger_metadata(i), lost)[0] for i in (first_id, second.id)}
        records = {ledger_id: pack_entry(ledger_id, entry_id, -1, 0, b"forged", digest)
                   for ledger_id, entry_id in ((first_id, 6), (second.id, 3))}
        # first ledger: entry 6 damaged on the replica asked first (for the batch
        # from entry 0 and again from entry 6); the other replica's copy is good
        asked_first = plans[first_id].sources(0)[0]
        assert plans[first_id].sources(6)[0] == asked_first
        _overwrite(bk, asked_first, first_id, 6, _damaged(records[first_id]))
        # second ledger: entry 3 damaged on every surviving replica
        for source in plans[second.id].sources(3):
            _overwrite(bk, source, second.id, 3, _damaged(records[second.id]))

        cluster.stop_bookie(lost)
        wait_for(lambda: lost not in bk.registry.available(), 15, what=f"{lost} gone")
        with Rereplicator(bk.ledgers, bk.registry, passwords=[PW]) as rr:
            report = rr.recover(lost)
        assert report.ledgers_recovered == [first_id]
        (failure,) = report.failed
        assert failure["ledger_id"] == second.id and "entry 3" in failure["reason"]
        assert lost not in bk.ledger_metadata(first_id).bookies()
        assert lost in bk.ledger_metadata(second.id).bookies()  # untouched: nothing to copy
        (fragment,) = report.fragments
        assert _replacement_holds(bk, fragment, lost, PW) == 40  # the good copy of entry 6
        assert _read_all(bk, first_id) == first_payloads


class _Crash(Exception):
    pass


class _CrashBeforeCas:
    """A LedgerManager whose first metadata update dies (the process crashed
    after the copies were durable, before the CAS)."""

    def __init__(self, ledgers):
        self._ledgers = ledgers
        self.crashed = False

    def __getattr__(self, name):
        return getattr(self._ledgers, name)

    def update_ledger(self, *args, **kwargs):
        if not self.crashed:
            self.crashed = True
            raise _Crash("power cut")
        return self._ledgers.update_ledger(*args, **kwargs)


def test_a_run_that_crashed_before_its_cas_is_finished_by_the_next(make_cluster):
    cluster = make_cluster(4, quorums=(3, 3, 2), autorecovery=MANUAL)
    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 4)
        first_id, first_payloads = _write_closed(bk, 60, tag=1)
        lost = bk.ledger_metadata(first_id).ensembles[0][1][0]
        second, second_payloads = _ledger_naming(bk, lost, 70, PW, 2)
        second.close()
        cluster.stop_bookie(lost)
        wait_for(lambda: lost not in bk.registry.available(), 15, what=f"{lost} gone")
        crashing = _CrashBeforeCas(bk.ledgers)
        with Rereplicator(crashing, bk.registry, passwords=[PW]) as rr, \
                pytest.raises(_Crash):
            rr.recover(lost)
        assert crashing.crashed
        for ledger_id in (first_id, second.id):
            assert lost in bk.ledger_metadata(ledger_id).bookies()  # copied, not re-pointed
        with Rereplicator(bk.ledgers, bk.registry, passwords=[PW]) as rr:
            report = rr.recover(lost)
        assert report.ok and sorted(report.ledgers_recovered) == sorted([first_id, second.id])
        assert report.entries_copied == 130  # written again: harmless
        for ledger_id, payloads in ((first_id, first_payloads), (second.id, second_payloads)):
            assert lost not in bk.ledger_metadata(ledger_id).bookies()
            assert _read_all(bk, ledger_id) == payloads


def test_a_replacement_that_refuses_the_copies_is_swapped_for_another(make_cluster):
    cluster = make_cluster(5, quorums=(3, 3, 2), autorecovery=MANUAL)
    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 5)
        ledger_id, payloads = _write_closed(bk, 50)
        md = bk.ledger_metadata(ledger_id)
        lost = md.ensembles[0][1][0]
        cluster.stop_bookie(lost)
        wait_for(lambda: lost not in bk.registry.available(), 15, what=f"{lost} gone")
        live = {b: info["read_only"] for b, info in bk.registry.available().items()}
        (plan,) = plan_ledger(md, lost)
        first_choice = choose_replacement(plan.ensemble, lost, live, {}, salt=ledger_id)
        # the first choice already holds this ledger id under another key: it
        # refuses every add for it (UnauthorizedError)
        with Transport() as transport:
            transport.add_bookie("b", bk.registry.get(first_choice)["endpoint"])
            transport.send("b", ReadLacRequest(ledger_id, fence=True,
                                               master_key=master_key(b"someone else")), 10_000)
            (event,) = wait_for(lambda: transport.next_events(100), 15, what="fence reply")
            assert event.status == 0, event
        with Rereplicator(bk.ledgers, bk.registry, passwords=[PW]) as rr:
            report = rr.recover(lost)
        assert report.ok, report
        # BP-32: one advisory WRITE_CLOSE, to the replacement that took the
        # copies (after they were durable), none to the one that refused them
        assert rr.write_close_outcomes == {"succeeded": 1, "partly": 0, "failed": 0}
        (fragment,) = report.fragments
        assert fragment["replacement"] not in (first_choice, lost, *plan.ensemble)
        assert _replacement_holds(bk, fragment, lost, PW) == 50
        assert bk.ledger_metadata(ledger_id).ensembles[0][1][0] == fragment["replacement"]
        assert _read_all(bk, ledger_id) == payloads
