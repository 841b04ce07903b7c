"""Reads and recovery around a stalled bookie (SIGSTOP keeps its socket open
and answers nothing): speculative reads answer from another replica while
it is stopped (apache/bookkeeper #1489), and fencing and recovery of an
open ledger finish without it, as the quorum rules allow (#1067).

Three bookies, E3/W3/A2: the stopped bookie is in every ensemble, and none
is spare.  Every test sends SIGCONT in ``finally``."""

from __future__ import annotations

import base64
import json
import os
import signal
import threading
import time

import pytest
from prometheus_client import CollectorRegistry

import appliance
from appliance.errors import LedgerFencedError
from tests.support.bkctl import bkctl
from tests.support.launch import wait_for, wait_registered

PW = b"secret"
STOP_S, CYCLE_S = 2.5, 3.0  # the bookie is stopped 2.5 s of every 3 s
READING_S = 20.0
# No read may wait out a stall.  Speculation sends a read on after 250 ms
# (speculative_read_timeout_ms), the tick that notices it may add 125 ms,
# and a loaded 2-core machine may add scheduling delays on top; 2.0 s is
# far above all of that and still below the 2.5 s a read that waited for
# the stopped bookie would take (it is a bound, not a measurement: the
# figures are in the report, measured by a script).
READ_BOUND_S = 2.0


def _closed_ledger(bk, entries: int):
    lh = bk.create_ledger(3, 3, 2, password=PW)
    payloads = [b"entry-%d-" % i + bytes(100) for i in range(entries)]
    futures = [lh.add_async(p) for p in payloads]
    assert [f.result(timeout=60) for f in futures] == list(range(entries))
    lh.close()
    return lh, payloads


def _point_reads(rh, payloads, until: float, log: list, errors: list) -> None:
    """Read entries one at a time, in order, round and round, until ``until``;
    each read's (start, end) into ``log``."""
    entry = 0
    try:
        while time.monotonic() < until:
            started = time.monotonic()
            got = rh.read(entry, entry)
            log.append((started, time.monotonic()))
            if got[0].payload != payloads[entry]:
                errors.append(f"entry {entry}: wrong payload")
            entry = (entry + 1) % len(payloads)
    except Exception as exc:  # reported by the test thread
        errors.append(repr(exc))


def test_point_reads_go_around_a_bookie_stopped_most_of_the_time(make_cluster):
    cluster = make_cluster(3)
    registry = CollectorRegistry()
    with appliance.connect(str(cluster.config_path), metrics=registry) as bk:
        wait_registered(bk, 3)
        lh, payloads = _closed_ledger(bk, 1_000)
        victim = bk.ledger_metadata(lh.id).ensembles[0][1][0]
        pid = cluster.procs[victim].pid
        rh = bk.open_ledger(lh.id, password=PW)
        log: list = []
        errors: list = []
        stops: list = []  # (stopped, continued) times
        until = time.monotonic() + READING_S
        reader = threading.Thread(target=_point_reads, args=(rh, payloads, until, log, errors))
        reader.start()
        try:
            while time.monotonic() < until:
                stopped = time.monotonic()
                os.kill(pid, signal.SIGSTOP)
                while time.monotonic() < min(until, stopped + STOP_S) and reader.is_alive():
                    reader.join(timeout=0.05)
                os.kill(pid, signal.SIGCONT)
                stops.append((stopped, time.monotonic()))
                while time.monotonic() < min(until, stopped + CYCLE_S) and reader.is_alive():
                    reader.join(timeout=0.05)
        finally:
            os.kill(pid, signal.SIGCONT)
            reader.join(timeout=60)
        assert errors == [] and not reader.is_alive()
        durations = sorted(end - start for start, end in log)
        inside = sum(any(a <= start and end <= b for a, b in stops) for start, end in log)
        speculative = registry.get_sample_value("bookkeeper_client_speculative_reads_total")
        quarantines = registry.get_sample_value("bookkeeper_client_bookie_quarantines_total")
        print(f"{len(log)} reads, {inside} while {victim} was stopped; p50 "
              f"{durations[len(durations) // 2] * 1000:.1f} ms, p99 "
              f"{durations[int(len(durations) * 0.99)] * 1000:.1f} ms, max "
              f"{durations[-1] * 1000:.1f} ms; {speculative:.0f} speculative reads, "
              f"{quarantines:.0f} quarantines")
        assert len(stops) >= 6
        assert inside >= 100  # answered by the other replicas while it was stopped
        assert speculative >= 1 and quarantines >= 1
        # quarantined for bookie_quarantine_ms (a minute), longer than the test
        assert registry.get_sample_value("bookkeeper_client_quarantined_bookies") == 1
        assert durations[-1] < READ_BOUND_S, f"a read waited {durations[-1]:.2f} s"


@pytest.mark.parametrize("via", ["client", "bkctl"])
def test_recovery_of_an_open_ledger_with_one_bookie_stopped(make_cluster, via):
    """The writer is alive but the ledger is recovered by another client
    while one bookie is stopped: the fence needs E - Qa + 1 = 2 answers,
    each entry Qa = 2 reads and write-backs, and the end Qw - Qa + 1 = 2
    negatives, so the two running bookies are enough; recovery times the
    stopped one out, closes the ledger with every acknowledged entry, and
    the writer is fenced."""
    cluster = make_cluster(3)
    with appliance.connect(str(cluster.config_path)) as writer_bk, \
            appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 3)
        lh = writer_bk.create_ledger(3, 3, 2, password=PW)
        payloads = [b"entry-%d" % i for i in range(300)]
        futures = [lh.add_async(p) for p in payloads[:200]]
        assert [f.result(timeout=60) for f in futures] == list(range(200))
        victim = lh.metadata.ensembles[0][1][0]
        pid = cluster.procs[victim].pid
        os.kill(pid, signal.SIGSTOP)
        try:
            # acknowledged by the two running bookies alone (Qa = 2)
            futures = [lh.add_async(p) for p in payloads[200:]]
            assert [f.result(timeout=60) for f in futures] == list(range(200, 300))
            if via == "client":
                got = [e.payload for e in bk.open_ledger(lh.id, password=PW).read(0, 299)]
            else:
                out = bkctl("ledger", "read", str(lh.id), "--recover", "--password", "secret",
                            "--json", config=cluster.config_path, text=True)
                assert out.returncode == 0, out.stderr
                got = [base64.b64decode(e["payload"]) for e in json.loads(out.stdout)]
            md = bk.ledger_metadata(lh.id)
            assert (md.state, md.last_entry_id) == ("CLOSED", 299)
            assert got == payloads
            with pytest.raises(LedgerFencedError):
                lh.add(b"after the recovery")
        finally:
            os.kill(pid, signal.SIGCONT)


def test_a_tailing_reader_long_polls_past_a_stopped_bookie(make_cluster):
    """Opened without recovery while one bookie is stopped, a reader learns
    the LAC from the others (a LAC read is decided at E - Qa + 1 answers) and
    its long poll returns once one running bookie learns a newer LAC."""
    cluster = make_cluster(3)
    with appliance.connect(str(cluster.config_path)) as writer_bk, \
            appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 3)
        lh = writer_bk.create_ledger(3, 3, 2, password=PW)
        assert [lh.add(b"entry-%d" % i) for i in range(3)] == [0, 1, 2]
        pid = cluster.procs[lh.metadata.ensembles[0][1][0]].pid
        os.kill(pid, signal.SIGSTOP)
        try:
            rh = bk.open_ledger(lh.id, password=PW, recovery=False)
            assert rh.last_add_confirmed >= 1
            assert lh.add(b"entry-3") == 3
            assert rh.wait_for_lac(2, timeout_s=60) >= 3  # the explicit LAC reaches it
            assert [e.payload for e in rh.read(0, 3)] == [b"entry-%d" % i for i in range(4)]
        finally:
            os.kill(pid, signal.SIGCONT)


def test_a_quarantined_bookie_is_left_out_of_new_ensembles(make_cluster):
    """Four bookies: reads that keep stalling on one get it quarantined by
    the client; once it runs again, the client's new E3 ledgers are made of
    the other three (picked at random, five ledgers would include it by
    chance with a probability of 1 - (1/4)^5)."""
    cluster = make_cluster(4)
    registry = CollectorRegistry()
    with appliance.connect(str(cluster.config_path), metrics=registry) as bk:
        wait_registered(bk, 4)
        lh, payloads = _closed_ledger(bk, 200)
        victim = bk.ledger_metadata(lh.id).ensembles[0][1][0]
        pid = cluster.procs[victim].pid
        rh = bk.open_ledger(lh.id, password=PW)
        os.kill(pid, signal.SIGSTOP)
        try:
            entry = iter(range(10**9))

            def quarantined() -> bool:
                e = next(entry) % len(payloads)
                assert rh.read(e, e)[0].payload == payloads[e]
                return registry.get_sample_value("bookkeeper_client_quarantined_bookies") == 1
            wait_for(quarantined, 60, what=f"{victim} quarantined by the client")
        finally:
            os.kill(pid, signal.SIGCONT)
        # back in the registry and in the client's view of it (refreshed each second)
        wait_for(lambda: victim in bk.driver.available_bookies, 30,
                 what=f"{victim} available to the client again")
        assert registry.get_sample_value("bookkeeper_client_quarantined_bookies") == 1
        ensembles = [bk.create_ledger(3, 3, 2, password=PW).metadata.ensembles[0][1]
                     for _ in range(5)]
        assert all(victim not in ensemble for ensemble in ensembles), ensembles
