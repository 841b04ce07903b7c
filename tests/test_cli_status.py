"""`bkctl status` and `bkctl bookie info` read the supervisor's record of a
bookie that is down (click's runner; no bookie runs): the exit code says
not every bookie serves, the last exit is shown in text and JSON."""

from __future__ import annotations

import json

from click.testing import CliRunner

from appliance.config import load_config
from appliance.supervisor.runs import exit_record
from appliance.supervisor.supervisor import state_path
from cli.main import cli
from storage.aligned_io import make_dirs
from tests.support.launch import write_config

EXITED_AT = 1_796_371_200.0  # 2026-12-04T08:00:00Z


def _run(*args: str):
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def test_a_down_bookie_fails_the_check_and_shows_its_last_exit(tmp_path):
    path = write_config(tmp_path, 1, quorums=(1, 1, 1))
    config = load_config(path)
    make_dirs(config.run_path)
    state_path(config).write_text(json.dumps({"pid": 1, "bookies": {}, "runs": {"bookie-1": {
        "pid": None, "started_at": None, "restarts": 4, "given_up": True,
        "last_exit": exit_record(-9, EXITED_AT)}}}))

    code, out = _run("status", "--json", "--config", str(path))
    assert code == 1
    [row] = json.loads(out)["bookies"]
    assert (row["state"], row["pid"], row["restarts"], row["uptime_s"]) == ("down", None, 4, None)
    assert row["last_exit"] == {"code": None, "signal": "SIGKILL",
                                "at": "2026-12-04T08:00:00+00:00"}

    code, out = _run("status", "--config", str(path))
    assert code == 1 and "restarts=4" in out
    assert "last exit: SIGKILL at 2026-12-04T08:00:00+00:00" in out

    code, out = _run("bookie", "info", "bookie-1", "--config", str(path))
    assert code == 0 and "last exit: SIGKILL at 2026-12-04T08:00:00+00:00" in out
    code, out = _run("bookie", "info", "bookie-1", "--json", "--config", str(path))
    assert json.loads(out)["restarts"] == 4


def test_without_a_supervisor_nothing_is_invented(tmp_path):
    path = write_config(tmp_path, 1, quorums=(1, 1, 1))
    code, out = _run("status", "--json", "--config", str(path))
    assert code == 1
    [row] = json.loads(out)["bookies"]
    assert (row["restarts"], row["uptime_s"], row["last_exit"]) == (None, None, None)
