"""bkctl bookie start|stop|restart, bkctl log-server ... and fix-cookie on a
supervised config refuse clearly, in one line naming the fix (click's runner;
no process runs: the state file names this test's own process as the
supervisor where one must be running)."""

from __future__ import annotations

import json
import os

import psutil
from click.testing import CliRunner

from appliance.config import load_config
from appliance.supervisor.supervisor import state_path
from cli.main import cli
from storage.aligned_io import make_dirs
from tests.support.launch import write_config


def _run(*args: str):
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def _config(tmp_path):
    return write_config(tmp_path, 1, quorums=(1, 1, 1), log={"servers": 1})


def _supervised_by_us(path, run: dict) -> None:
    """A state file whose supervisor is this process (alive, right start time)."""
    config = load_config(path)
    make_dirs(config.run_path)
    state_path(config).write_text(json.dumps({
        "pid": os.getpid(), "started": psutil.Process().create_time(),
        "bookies": {}, "runs": {"bookie-1": run}}))


def test_without_a_running_supervisor_the_commands_say_how_to_start_it(tmp_path):
    path = _config(tmp_path)
    for args in (("bookie", "stop", "bookie-1"), ("bookie", "restart", "bookie-1"),
                 ("log-server", "start", "logserver-1")):
        code, out = _run(*args, "--config", str(path))
        assert code == 1, (args, out)
        assert out.startswith("Error: no supervisor runs ") and "bkctl up --detach" in out
        assert len(out.strip().splitlines()) == 1, out


def test_an_id_of_no_such_process_names_the_ones_there_are(tmp_path):
    path = _config(tmp_path)
    code, out = _run("bookie", "restart", "bookie-9", "--config", str(path))
    assert code == 1 and "has no bookie 'bookie-9': its bookies are bookie-1" in out
    code, out = _run("log-server", "stop", "bookie-1", "--config", str(path))
    assert code == 1 and "has no log server 'bookie-1': its log servers are logserver-1" in out


def test_fix_cookie_refuses_while_the_supervisor_runs_or_restarts_the_bookie(tmp_path):
    path = _config(tmp_path)
    _supervised_by_us(path, {"pid": 4242, "given_up": False, "stopped_by_operator": False})
    code, out = _run("bookie", "fix-cookie", "bookie-1", "--config", str(path))
    assert code == 1 and "bookie-1 runs (pid 4242)" in out
    assert "`bkctl bookie stop bookie-1`" in out

    _supervised_by_us(path, {"pid": None, "given_up": False, "stopped_by_operator": False})
    code, out = _run("bookie", "fix-cookie", "bookie-1", "--config", str(path))
    assert code == 1 and "the supervisor is about to restart bookie-1" in out


def test_a_supervisor_without_its_control_socket_is_named_with_the_fix(tmp_path):
    deep = tmp_path / ("d" * 110)
    path = write_config(tmp_path, 1, quorums=(1, 1, 1), supervisor={"run_dir": str(deep)})
    _supervised_by_us(path, {"pid": 4242, "given_up": False, "stopped_by_operator": False})
    code, out = _run("bookie", "restart", "bookie-1", "--config", str(path))
    assert code == 1 and "takes no requests" in out
    assert "set [supervisor] run_dir to a shorter folder" in out
