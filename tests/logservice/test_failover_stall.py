"""A kill -9 of a log's owner under 8 synchronous producer processes
(`bkctl up --detach`, its supervisor restarting the server, which takes
the log back once it registers: the hashing names it): every write that
returned is read back exactly once, in each producer's order, at the DLSN
it returned, and the longest stall of a producer is printed.

The stall is reported, never asserted (a shared, noisy machine): its bound
is a bench figure (`bkctl bench log --producers 8 --kill-owner`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from appliance.protocol.log_service import owner_of
from appliance.protocol.logs import DLSN
from tests.logservice.support import appliance_with_log_servers, read_all
from tests.support.bkctl import REPO
from tests.support.launch import wait_for

PRODUCERS = 8
LOG = "stalled"
DEADLINE_S = 240.0  # a bound on a loaded 2-core machine, not a target


@pytest.fixture
def appliance_up(short_tmp):
    with appliance_with_log_servers(short_tmp) as up:
        yield up


def _start(config, folder: Path) -> list[subprocess.Popen]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return [subprocess.Popen([sys.executable, "-m", "tests.logservice.stall_producer_proc",
                              str(config), LOG, f"p{k}", str(folder)], cwd=REPO, env=env,
                             stdout=open(folder / f"p{k}.log", "wb"), stderr=subprocess.STDOUT)
            for k in range(PRODUCERS)]


def _all_touched(folder: Path, suffix: str, procs) -> bool:
    assert all(p.poll() is None for p in procs), "a producer exited early: see its p<k>.log"
    return all((folder / f"p{k}{suffix}").exists() for k in range(PRODUCERS))


def _finish(procs, folder: Path) -> dict[str, list]:
    (folder / "stop").touch()
    results = {}
    for k, proc in enumerate(procs):
        code = proc.wait(timeout=DEADLINE_S)
        assert code == 0, (folder / f"p{k}.log").read_text(errors="replace")[-3000:]
        results[f"p{k}"] = [json.loads(line)
                            for line in (folder / f"p{k}.out").read_text().splitlines()]
    return results


def _longest_stall_ms(results: dict[str, list], killed_at: float) -> dict[str, float]:
    """Each producer's largest gap between two writes that returned, among
    the gaps ending after the kill."""
    out = {}
    for name, written in results.items():
        times = [t for _, _, t in written]
        out[name] = max((b - a) * 1000 for a, b in zip(times, times[1:], strict=False)
                        if b > killed_at)
    return out


def test_eight_producers_ride_over_a_kill_9_of_the_owner_and_the_stall_is_counted(
        appliance_up, short_tmp):
    config, bk, registry, seen = appliance_up
    procs = _start(config, short_tmp)
    try:
        wait_for(lambda: _all_touched(short_tmp, ".started", procs), DEADLINE_S,
                 what="every producer writing")
        owner = registry.owner(LOG)["server"]
        pid = registry.servers()[owner]["pid"]
        os.kill(pid, signal.SIGKILL)
        killed_at = time.time()
        (short_tmp / "killed").touch()
        wait_for(lambda: _all_touched(short_tmp, ".killed", procs), DEADLINE_S,
                 what="every producer writing after the kill")
        restarted = wait_for(lambda: registry.servers().get(owner, {}).get("pid")
                             not in (None, pid) and registry.servers()[owner]["pid"],
                             DEADLINE_S, what=f"{owner} restarted and registered")
        seen.add(restarted)
        wait_for(lambda: (registry.owner(LOG) or {}).get("server") ==
                 owner_of(LOG, registry.servers()), DEADLINE_S,
                 what="the log with the server the hashing names")
        (short_tmp / "settled").touch()
        wait_for(lambda: _all_touched(short_tmp, ".settled", procs), DEADLINE_S,
                 what="every producer writing after that")
        results = _finish(procs, short_tmp)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    records = read_all(bk, LOG, sum(map(len, results.values())), nothing_more=True)
    by_payload = Counter(r.payload for r in records)
    assert [p for p, n in by_payload.items() if n > 1] == []
    where = {r.payload: r.dlsn for r in records}
    for name, written in results.items():
        mine = [r.payload for r in records if r.payload.startswith(f"{name}:".encode())]
        assert mine == [f"{name}:{i}".encode() for i, _, _ in written]
        assert all(where[f"{name}:{i}".encode()] == DLSN.parse(d) for i, d, _ in written)
    stalls = _longest_stall_ms(results, killed_at)
    print(f"kill -9 of {owner} under {PRODUCERS} producers: longest stall "
          f"{max(stalls.values()):,.0f} ms (per producer: "
          f"{', '.join(f'{v:,.0f}' for v in stalls.values())}); "
          f"{len(records):,} records read back once each")
