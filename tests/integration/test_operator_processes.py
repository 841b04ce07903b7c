"""One process of a running appliance, the others untouched (`bkctl up
--detach` and bkctl in real subprocesses):

* a bookie whose disks were wiped refuses to start and is left down;
  `bkctl bookie fix-cookie ID` brings it back at once (new pid), it boots
  fenced and in limbo and repairs from its peers (`bkctl bookie info`),
  its ledgers read back, and no other process was restarted;
* `bkctl bookie stop|start|restart ID` and `bkctl log-server stop|start|
  restart ID`: the stopped one shows as stopped by the operator, is not
  restarted by the supervisor, and the others keep their pids.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support.bkctl import bkctl
from tests.support.launch import (
    kill_pids,
    supervisor_pids,
    swap_disks,
    wait_for,
    write_config,
)

PASSWORD = b"ops"
ENTRIES = 200


@pytest.fixture
def appliance(short_tmp):
    """A running appliance (4 bookies, 2 log servers), started with `bkctl up
    --detach`; every process it ran is killed after the test, also on failure."""
    config = write_config(short_tmp, 4, log={"servers": 2})
    seen: set[int] = set()
    try:
        up = _bkctl(config, "up", "--detach")
        seen.update(supervisor_pids(config))
        assert up.returncode == 0, up.stderr
        yield config, seen
    finally:
        seen.update(supervisor_pids(config))
        kill_pids(seen)


def _bkctl(config: Path, *args: str) -> subprocess.CompletedProcess:
    return bkctl(*args, config=config, text=True)


def _status(config: Path) -> dict:
    done = _bkctl(config, "status", "--json")
    doc = json.loads(done.stdout)
    return {r["id"]: r for r in doc["bookies"] + doc["log_servers"]}


def _pids(config: Path, *ids: str) -> dict[str, int]:
    rows = _status(config)
    return {i: rows[i]["pid"] for i in ids}


def _ok(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, (done.stdout, done.stderr)
    return done.stdout


def test_fix_cookie_on_a_running_appliance_brings_a_wiped_bookie_back_alone(appliance):
    import appliance as bk_api

    config, seen = appliance
    others = ("bookie-1", "bookie-2", "bookie-4", "logserver-1", "logserver-2")
    with bk_api.connect(str(config)) as bk:
        ledgers = []
        for _ in range(2):  # on every bookie (E = 4): the victim's share is every entry
            lh = bk.create_ledger(4, 4, 2, password=PASSWORD)
            for i in range(ENTRIES):
                lh.add(b"e%05d" % i)
            lh.close()
            ledgers.append(lh.id)
        before = _pids(config, *others)
        victim = _status(config)["bookie-3"]
        swap_disks(victim)
        refused = wait_for(lambda: (r := _status(config)["bookie-3"])["left_down"] and r,
                           60.0, what="bookie-3 refused (no cookie) and left down")
        wait_for(lambda: "bookie-3" not in bk.registry.available(), 30.0,
                 what="bookie-3's registration expired")

        fixed = _bkctl(config, "bookie", "fix-cookie", "bookie-3")
        out = _ok(fixed)
        assert "metadata cookie of bookie-3" in out and "bookie-3 started (pid" in out, out
        row = _status(config)["bookie-3"]
        seen.add(row["pid"])
        assert row["state"] == "up" and row["pid"] != victim["pid"], row
        assert not row["left_down"] and row["restarts"] == refused["restarts"], row

        info = json.loads(_ok(_bkctl(config, "bookie", "info", "bookie-3", "--json")))
        assert any("fix-cookie" in r for r in info["boot"]["reasons"]), info["boot"]
        assert info["boot"]["ledgers_fenced"] >= len(ledgers), info["boot"]
        wait_for(lambda: json.loads(_bkctl(config, "bookie", "info", "bookie-3", "--json")
                                    .stdout)["limbo_ledgers"] == 0, 60.0,
                 what="bookie-3 repaired from its peers")
        info = json.loads(_ok(_bkctl(config, "bookie", "info", "bookie-3", "--json")))
        assert info["repair"]["state"] == "done", info["repair"]
        assert info["repair"]["entries_copied"] >= len(ledgers) * ENTRIES, info["repair"]
        text = _ok(_bkctl(config, "bookie", "info", "bookie-3"))
        assert "limbo ledgers: 0  repair: done" in text, text
        for ledger_id in ledgers:
            read = _ok(_bkctl(config, "ledger", "read", str(ledger_id), "--password", "ops"))
            assert read.splitlines() == [f"e{i:05d}" for i in range(ENTRIES)]
        assert _pids(config, *others) == before  # nobody else was restarted
    assert _bkctl(config, "status").returncode == 0


def test_stop_start_restart_one_bookie_and_one_log_server(appliance):
    config, seen = appliance
    ids = ("bookie-1", "bookie-2", "bookie-3", "bookie-4", "logserver-1", "logserver-2")
    first = _pids(config, *ids)

    out = _ok(_bkctl(config, "bookie", "stop", "bookie-2"))
    assert f"bookie-2 stopped (was pid {first['bookie-2']})" in out, out
    row = _status(config)["bookie-2"]
    assert (row["state"], row["pid"], row["stopped_by_operator"], row["restarts"]) == (
        "down", None, True, 0), row
    assert row["last_exit"]["by_operator"] is True and not row["left_down"], row
    text = _bkctl(config, "status")
    assert text.returncode == 1  # not serving, whoever stopped it
    assert "stopped by the operator" in text.stdout
    assert "left down until `bkctl bookie start bookie-2`" in text.stdout

    out = _ok(_bkctl(config, "log-server", "stop", "logserver-2"))
    assert "logserver-2 stopped" in out, out
    # several watches pass while logserver-1 restarts (its exit is seen by
    # one, its start by another): the stopped ones stay down all along
    out = _ok(_bkctl(config, "log-server", "restart", "logserver-1"))
    rows = _status(config)
    seen.add(rows["logserver-1"]["pid"])
    assert "logserver-1 restarted (pid" in out, out
    assert rows["logserver-1"]["pid"] != first["logserver-1"]
    assert (rows["logserver-1"]["state"], rows["logserver-1"]["restarts"]) == ("up", 0)
    assert rows["bookie-2"]["pid"] is None and rows["bookie-2"]["stopped_by_operator"]
    assert rows["logserver-2"]["pid"] is None and rows["logserver-2"]["stopped_by_operator"]
    assert "left down until `bkctl log-server start logserver-2`" in \
        _bkctl(config, "status").stdout

    out = _ok(_bkctl(config, "bookie", "start", "bookie-2"))
    _ok(_bkctl(config, "log-server", "start", "logserver-2"))
    out += _ok(_bkctl(config, "bookie", "restart", "bookie-4"))
    assert "bookie-2 started (pid" in out and "bookie-4 restarted (pid" in out, out
    now = _pids(config, *ids)
    seen.update(now.values())
    assert all(now[i] not in (None, first[i]) for i in ("bookie-2", "bookie-4", "logserver-2"))
    assert {i: now[i] for i in ("bookie-1", "bookie-3")} == \
        {i: first[i] for i in ("bookie-1", "bookie-3")}
    rows = _status(config)
    assert [rows[i]["restarts"] for i in ids] == [0] * len(ids)  # operator, not failures
    assert not any(rows[i]["stopped_by_operator"] for i in ids)
    assert _bkctl(config, "status").returncode == 0
    _ok(_bkctl(config, "down"))
