"""`bkctl status` as a health check and a record of restarts, on real
bookies: exit 0 only while every bookie of the config serves; after a kill
-9 the supervisor's restart shows as `restarts`, a fresh `uptime_s` and the
last exit (SIGKILL, when), in `status` and in `bkctl bookie info`."""

from __future__ import annotations

import json
import os
import signal

from click.testing import CliRunner

from cli.main import cli
from tests.support.bkctl import bkctl
from tests.support.launch import kill_pids, supervisor_pids, wait_for, write_config


def _in_process(*args: str):
    """bkctl through click's runner: (exit code, stdout)."""
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def test_status_exits_0_only_while_every_bookie_serves(make_cluster):
    cluster = make_cluster(2, quorums=(1, 1, 1))
    config = str(cluster.config_path)
    code, out = _in_process("status", "--config", config)
    assert code == 0, out
    assert out.count(" up ") == 2
    assert bkctl("status", "--json", config=config).returncode == 0

    cluster.kill("bookie-1")
    code, out = _in_process("status", "--config", config)
    assert code == 1  # and the listing is still printed
    assert [line.split()[1] for line in out.splitlines() if line.startswith("bookie-")] == \
        ["down", "up"]
    one_down = bkctl("status", "--json", config=config, text=True)
    assert one_down.returncode == 1, one_down.stderr
    rows = json.loads(one_down.stdout)["bookies"]
    assert [(r["id"], r["state"]) for r in rows] == [("bookie-1", "down"), ("bookie-2", "up")]

    cluster.kill("bookie-2")
    code, out = _in_process("status", "--json", "--config", config)
    assert code == 1
    assert [r["state"] for r in json.loads(out)["bookies"]] == ["down", "down"]
    assert bkctl("status", config=config).returncode == 1


def _rows(config) -> dict[str, dict]:
    done = bkctl("status", "--json", config=config, text=True)
    return {r["id"]: r for r in json.loads(done.stdout)["bookies"]}


def test_restarts_uptime_and_last_exit_after_a_kill_9(short_tmp):
    config = write_config(short_tmp, 2, quorums=(1, 1, 1))
    seen: set[int] = set()
    try:
        up = bkctl("up", "--detach", config=config, text=True)
        seen.update(supervisor_pids(config))
        assert up.returncode == 0, up.stderr
        before = _rows(config)
        assert [(r["restarts"], r["last_exit"]) for r in before.values()] == [(0, None)] * 2
        assert all(r["uptime_s"] is not None and r["uptime_s"] >= 0 for r in before.values())

        os.kill(before["bookie-1"]["pid"], signal.SIGKILL)
        after = wait_for(lambda: (rows := _rows(config))["bookie-1"]["state"] == "up" and
                         rows["bookie-1"]["pid"] not in (None, before["bookie-1"]["pid"]) and
                         rows, 60, what="bookie-1 restarted by the supervisor")
        seen.add(after["bookie-1"]["pid"])
        victim, other = after["bookie-1"], after["bookie-2"]
        assert victim["restarts"] == 1 and victim["last_exit"]["signal"] == "SIGKILL"
        assert victim["last_exit"]["code"] is None and victim["last_exit"]["at"]
        assert victim["uptime_s"] < other["uptime_s"]  # only the new process's time
        assert (other["restarts"], other["last_exit"]) == (0, None)
        assert bkctl("status", config=config).returncode == 0  # serving again

        text = bkctl("status", config=config, text=True).stdout
        assert "restarts=1" in text and "last exit: SIGKILL at " in text
        info = bkctl("bookie", "info", "bookie-1", "--json", config=config, text=True)
        assert info.returncode == 0, info.stderr
        doc = json.loads(info.stdout)
        assert (doc["restarts"], doc["last_exit"]["signal"]) == (1, "SIGKILL")
        shown = bkctl("bookie", "info", "bookie-1", config=config, text=True).stdout
        assert "restarts=1" in shown and "last exit: SIGKILL at " in shown

        assert bkctl("down", config=config).returncode == 0
        stopped = bkctl("status", "--json", config=config, text=True)
        assert stopped.returncode == 1
        assert [r["state"] for r in json.loads(stopped.stdout)["bookies"]] == ["down"] * 2
    finally:
        seen.update(supervisor_pids(config))
        kill_pids(seen)
