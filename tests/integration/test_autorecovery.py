"""Automatic re-replication with real bookie processes: a bookie is killed
and its directories removed, nobody runs a command, and the appliance
heals every ledger by itself: closed ones entirely, an open one's sealed
fragments while its writer keeps adding (never fenced)."""

from __future__ import annotations

import shutil
import threading

import appliance
from appliance.autorecovery.marks import Marks
from tests.integration.test_rereplication import (
    PW,
    _ledger_naming,
    _multi_fragment_ledger,
    _read_all,
    _replacement_holds,
)
from tests.support.bkctl import bkctl
from tests.support.launch import wait_for, wait_registered

DELAY_MS = 4000
BIG = 64 * 1024


class Adder(threading.Thread):
    """Keeps adding to an open ledger until stopped; remembers every error."""

    def __init__(self, lh, first_payloads):
        super().__init__(daemon=True)
        self.lh, self.payloads, self.errors = lh, list(first_payloads), []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.02):
            payload = b"open entry %d" % len(self.payloads)
            try:
                self.lh.add(payload)
                self.payloads.append(payload)
            except Exception as exc:  # noqa: BLE001 - the test asserts there is none
                self.errors.append(exc)
                return


def _fragments_naming(md, bookie: str) -> list[tuple[int, int, int | None]]:
    """(index, first, last entry) of the fragments of ``md`` naming ``bookie``;
    last is None for an open ledger's last fragment (its writer's)."""
    out = []
    for i, (first, ensemble) in enumerate(md.ensembles):
        if bookie not in ensemble:
            continue
        last = md.ensembles[i + 1][0] - 1 if i + 1 < len(md.ensembles) else None
        if md.is_closed:
            last = md.last_entry_id if last is None else min(last, md.last_entry_id)
        out.append((i, first, last))
    return out


def test_a_lost_bookie_is_healed_by_the_appliance_alone(make_cluster):
    cluster = make_cluster(5, quorums=(3, 3, 2), autorecovery={
        "lost_bookie_delay_ms": DELAY_MS, "check_interval_ms": 600_000,
        "open_ledger_grace_ms": 600_000})
    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 5)
        expected: dict[int, list[bytes]] = {}
        multi_id, expected[multi_id] = _multi_fragment_ledger(cluster, bk)
        lost = bk.ledger_metadata(multi_id).ensembles[0][1][1]  # in both fragments
        for tag in (1, 2):  # big enough that a copy can be caught in progress
            lh, _ = _ledger_naming(bk, lost, 0, PW, tag)
            payloads = [bytes([tag]) * BIG for _ in range(600)]
            for fut in [lh.add_async(p) for p in payloads]:
                fut.result(timeout=120)
            lh.close()
            expected[lh.id] = payloads
        writer, first_open = _ledger_naming(bk, lost, 40, PW, 6)  # stays OPEN
        adder = Adder(writer, first_open)
        adder.start()
        before = {i: bk.ledger_metadata(i) for i in [*expected, writer.id]}

        cluster.kill(lost)
        added_before_loss = len(adder.payloads)
        spec = cluster.config.bookie(lost)
        for d in (spec.journal_dir, spec.ledger_dir):
            shutil.rmtree(d)

        # a worker is killed mid-copy once (and restarted, as the supervisor would)
        marks = Marks(bk.ledgers.store)
        holder = wait_for(lambda: next(iter(marks.locks().values()), None), 60,
                          what="a worker copying", interval_s=0.005)
        assert holder in cluster.procs and holder != lost
        cluster.kill(holder)
        cluster.start_bookie(holder)

        def healed() -> bool:
            return not marks.marks() and not any(
                lost in bk.ledger_metadata(i).bookies() for i in [*expected]) and not any(
                lost in ens for _, ens in bk.ledger_metadata(writer.id).ensembles)
        wait_for(healed, 180, what=f"every ledger off {lost}: marks {marks.marks()}",
                 interval_s=0.2)
        status = bkctl("autorecovery", "status", config=cluster.config_path, text=True)
        assert status.returncode == 0 and "0 ledger(s) marked" in status.stdout, status.stdout

        # the open ledger's writer was never disturbed: it moved off the lost bookie
        # (a new fragment), its sealed fragment was re-pointed under it, it kept
        # adding, and it closes at its last add
        assert adder.errors == [] and adder.is_alive()
        assert len(bk.ledger_metadata(writer.id).ensembles) >= 2
        wait_for(lambda: len(adder.payloads) > added_before_loss + 20, 30,
                 what="adds after the heal")
        adder.stop.set()
        adder.join(30)
        writer.close()
        expected[writer.id] = adder.payloads
        assert bk.ledger_metadata(writer.id).last_entry_id == len(adder.payloads) - 1

        # metadata and actual copies: each re-pointed fragment's replacement holds
        # the lost bookie's share, verified entry by entry
        originals = set()
        for ledger_id, old in before.items():
            new = bk.ledger_metadata(ledger_id)
            for index, first, last in _fragments_naming(old, lost):
                ensemble = old.ensembles[index][1]
                originals |= set(ensemble) - {lost}
                if last is None or last < first:
                    continue  # no entry in it, or the open ledger's own last fragment
                replacement = (set(new.ensembles[index][1]) - set(ensemble)).pop()
                fragment = {"ledger_id": ledger_id, "first_entry_id": first,
                            "last_entry_id": last, "replacement": replacement}
                assert _replacement_holds(bk, fragment, lost, PW) > 0
        # every entry reads back with one more original replica stopped
        cluster.stop_bookie(sorted(originals - {holder})[0])
        for ledger_id, payloads in expected.items():
            assert _read_all(bk, ledger_id) == payloads, ledger_id


def test_disable_stops_new_copies_and_enable_resumes(make_cluster):
    cluster = make_cluster(4, quorums=(3, 3, 2), autorecovery={
        "lost_bookie_delay_ms": 0, "check_interval_ms": 600_000})
    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 4)
        lh, payloads = _ledger_naming(bk, "bookie-4", 50, PW, 1)
        lh.close()
        assert bkctl("autorecovery", "disable", config=cluster.config_path).returncode == 0
        cluster.kill("bookie-4")
        marks = Marks(bk.ledgers.store)
        wait_for(lambda: "bookie-4" not in bk.registry.available(), 15, what="bookie-4 gone")
        # every live worker (the auditor among them) ticks twice more while disabled:
        # nothing is marked, nothing copied
        ticks = {w: s["ticks"] for w, s in marks.workers().items() if w != "bookie-4"}
        wait_for(lambda: all(s.get("ticks", 0) >= ticks.get(w, 0) + 2 and not s["enabled"]
                             for w, s in marks.workers().items() if w in ticks), 15,
                 what="two ticks of every worker while disabled")
        assert marks.marks() == {} and "bookie-4" in bk.ledger_metadata(lh.id).bookies()
        assert bkctl("autorecovery", "enable", config=cluster.config_path).returncode == 0
        wait_for(lambda: "bookie-4" not in bk.ledger_metadata(lh.id).bookies(), 60,
                 what="re-replicated after enable", interval_s=0.1)
        assert _read_all(bk, lh.id) == payloads
