"""The log service under `bkctl up`: producer processes ride over a
`kill -9` of the log's owner (the supervisor restarts it), every record is
read back exactly once in each producer's order at the DLSN its write
returned, and `bkctl log append` during their writes fences nobody."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from appliance.protocol.logs import DLSN
from tests.logservice.support import appliance_with_log_servers, read_all
from tests.support.bkctl import REPO, bkctl
from tests.support.launch import wait_for

PRODUCER_TIMEOUT_S = 240.0  # a bound on a loaded 2-core machine, not a target


@pytest.fixture
def appliance_up(short_tmp):
    with appliance_with_log_servers(short_tmp, supervisor={"restart_backoff_min_ms": 100}) as up:
        yield up


def _start_producers(config, tmp: Path, log_name: str, producers: int, records: int,
                     module: str = "tests.logservice.producer_proc") -> list:
    """``producers`` processes running ``module`` (its arguments: config,
    log name(s), producer name, records, output file)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = []
    for k in range(producers):
        out = tmp / f"p{k}.out"
        procs.append((f"p{k}", out, subprocess.Popen(
            [sys.executable, "-m", module, str(config), log_name,
             f"p{k}", str(records), str(out)], cwd=REPO, env=env,
            stdout=open(tmp / f"p{k}.log", "wb"), stderr=subprocess.STDOUT)))
    return procs


def _wait_producers(procs, tmp: Path) -> dict[str, list]:
    results = {}
    for name, out, proc in procs:
        try:
            code = proc.wait(timeout=PRODUCER_TIMEOUT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        log_text = (tmp / f"{name}.log").read_text(errors="replace")[-3000:]
        assert code == 0, f"producer {name} exited {code}: {log_text}"
        results[name] = [json.loads(line) for line in out.read_text().splitlines()]
    return results



def _check_exactly_once(records, results: dict[str, list], others: int = 0) -> None:
    by_payload = Counter(r.payload for r in records)
    dupes = [p for p, n in by_payload.items() if n > 1]
    assert not dupes, f"{len(dupes)} records stored twice, e.g. {dupes[:3]}"
    where = {r.payload: r.dlsn for r in records}
    for name, written in results.items():
        mine = [r for r in records if r.payload.startswith(f"{name}:".encode())]
        assert [r.payload for r in mine] == [f"{name}:{i}".encode() for i in range(len(written))]
        for i, dlsn in written:
            assert where[f"{name}:{i}".encode()] == DLSN.parse(dlsn)
    assert len(records) == sum(map(len, results.values())) + others


def _owner_pid(registry, log_name: str) -> tuple[str, int]:
    lease = wait_for(lambda: registry.owner(log_name), 60, what="an owner")
    return lease["server"], registry.servers()[lease["server"]]["pid"]


def _log_servers(config) -> tuple[int, dict[str, dict]]:
    """`bkctl status --json`: its exit code and its log_servers by id."""
    done = bkctl("status", "--json", config=config, text=True)
    return done.returncode, {r["id"]: r for r in json.loads(done.stdout)["log_servers"]}


def test_producers_ride_over_a_kill_9_of_the_owner(appliance_up, short_tmp):
    _ride_over_a_kill_9(appliance_up, short_tmp, producers=3, records=300)


@pytest.mark.slow
def test_six_producers_of_1500_records_ride_over_a_kill_9_of_the_owner(appliance_up,
                                                                      short_tmp):
    _ride_over_a_kill_9(appliance_up, short_tmp, producers=6, records=1500)


def _ride_over_a_kill_9(appliance_up, short_tmp, producers: int, records: int) -> None:
    config, bk, registry, seen = appliance_up
    procs = _start_producers(config, short_tmp, "orders", producers, records)
    try:
        wait_for(lambda: all((short_tmp / f"p{k}.started").exists() for k in range(producers)) or
                 any(p.poll() is not None for _, _, p in procs), 120, what="producers started")
        owner, pid = _owner_pid(registry, "orders")
        os.kill(pid, signal.SIGKILL)
        results = _wait_producers(procs, short_tmp)
    finally:
        for _, _, proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    _check_exactly_once(read_all(bk, "orders", producers * records, nothing_more=True), results)
    code, rows = wait_for(lambda: (got := _log_servers(config))[1][owner]["state"] == "up"
                          and got[1][owner]["restarts"] == 1 and got, 60,
                          what=f"{owner} restarted by the supervisor")
    seen.add(rows[owner]["pid"])
    assert code == 0 and rows[owner]["last_exit"]["signal"] == "SIGKILL"
    assert rows[owner]["pid"] != pid and rows[owner]["uptime_s"] is not None
    assert sorted(rows) == ["logserver-1", "logserver-2"]
    # where tailing readers read from: the endpoint each running server registered
    registered = registry.servers()
    assert {s: r["read_endpoint"] for s, r in rows.items()} == \
        {s: registered[s]["read_endpoint"] for s in rows}
    assert all(r["read_endpoint"] for r in rows.values())
    human = bkctl("status", config=config, text=True).stdout
    assert all(f"reads={r['read_endpoint']}" in human for r in rows.values())


def test_bkctl_log_append_during_producers_fences_nobody(appliance_up, short_tmp):
    config, bk, registry, _seen = appliance_up
    procs = _start_producers(config, short_tmp, "events", 2, 300)
    try:
        wait_for(lambda: all((short_tmp / f"p{k}.started").exists() for k in range(2)) or
                 any(p.poll() is not None for _, _, p in procs), 120, what="producers started")
        lines = "".join(f"cli:{i}\n" for i in range(50))
        done = bkctl("log", "append", "events", "-", config=config, input=lines, text=True)
        assert done.returncode == 0, done.stderr
        results = _wait_producers(procs, short_tmp)
    finally:
        for _, _, proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    records = read_all(bk, "events", 650, nothing_more=True)
    _check_exactly_once(records, results, others=50)
    assert [r.payload for r in records if r.payload.startswith(b"cli:")] == \
        [f"cli:{i}".encode() for i in range(50)]
    described = json.loads(bkctl("log", "describe", "events", "--json", config=config).stdout)
    assert described["log_server"] in ("logserver-1", "logserver-2")
    # the open segment's records count as readers see them (its metadata says
    # nothing until it completes); the last entry's LAC may come a moment later
    described = wait_for(
        lambda: (d := json.loads(bkctl("log", "describe", "events", "--json",
                                       config=config).stdout))["readable"] == 650 and d,
        30, what="describe counting all 650 records")
    open_segments = [s for s in described["segments"] if s["state"] == "IN_PROGRESS"]
    assert open_segments and open_segments[-1]["confirmed"]["records"] > 0
    text = bkctl("log", "describe", "events", config=config, text=True).stdout
    assert "650 record(s) readable" in text and "(confirmed so far)" in text


def test_a_producer_killed_and_started_again_with_its_id_stores_nothing_twice(
        appliance_up, short_tmp):
    config, bk, _registry, _seen = appliance_up
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    pid = "5e" * 16

    def start(out: Path) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.logservice.producer_proc", str(config), "retried",
             "p0", "1000", str(out), pid], cwd=REPO, env=env,
            stdout=open(out.with_suffix(".log"), "wb"), stderr=subprocess.STDOUT)

    first = start(short_tmp / "first.out")
    try:
        wait_for(lambda: (short_tmp / "first.started").exists() or first.poll() is not None,
                 120, what="the first run started")
        first.send_signal(signal.SIGKILL)
    finally:
        first.wait()
    assert not (short_tmp / "first.out").exists()  # killed in the middle
    second = start(short_tmp / "second.out")
    try:
        assert second.wait(timeout=PRODUCER_TIMEOUT_S) == 0, \
            (short_tmp / "second.log").read_text()[-3000:]
    finally:
        if second.poll() is None:
            second.kill()
            second.wait()
    written = [json.loads(line) for line in (short_tmp / "second.out").read_text().splitlines()]
    _check_exactly_once(read_all(bk, "retried", 1000, nothing_more=True), {"p0": written})


def test_producer_processes_writing_several_logs_ride_over_a_kill_9_of_an_owner(
        appliance_up, short_tmp):
    """Two processes, each with a producer per log of the same six logs
    (spread over both servers): their requests leave as multi-log messages,
    one connection per server; the owner of the first log is killed -9 in
    the middle.  Every record is in its log exactly once, in each producer's
    order, at the DLSN its write returned."""
    config, bk, registry, seen = appliance_up
    logs = [f"multi-{k}" for k in range(6)]
    records = 200
    procs = _start_producers(config, short_tmp, ",".join(logs), 2, records,
                             module="tests.logservice.multi_producer_proc")
    try:
        wait_for(lambda: all((short_tmp / f"p{k}.started").exists() for k in range(2)) or
                 any(p.poll() is not None for _, _, p in procs), 120, what="producers started")
        owners = {registry.owner(log)["server"] for log in logs if registry.owner(log)}
        owner, pid = _owner_pid(registry, logs[0])
        os.kill(pid, signal.SIGKILL)
        results = _wait_producers(procs, short_tmp)
        for _, out, _ in procs:
            mux = json.loads(out.with_suffix(".mux").read_text())
            # the requests did leave together: fewer messages than requests
            assert 0 < mux["mux_messages"] < mux["mux_sections"], mux
    finally:
        for _, _, proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert owners == {"logserver-1", "logserver-2"}  # both servers took part
    for log in logs:
        per_log = {name: [[i, dlsn] for lg, i, dlsn in written if lg == log]
                   for name, written in results.items()}
        _check_exactly_once(read_all(bk, log, 2 * records, nothing_more=True), per_log)
    code, rows = wait_for(lambda: (got := _log_servers(config))[1][owner]["state"] == "up"
                          and got[1][owner]["restarts"] == 1 and got, 60,
                          what=f"{owner} restarted by the supervisor")
    seen.add(rows[owner]["pid"])
    assert rows[owner]["pid"] != pid
