"""``bkctl log read NAME --follow`` on a log that does not exist yet waits for
it, like ``tail -F`` (CONTRACT.md, "Log service"), and prints its records
once they are written; a plain read of a missing log still fails in one
line; ``log.reader(wait_for_log=True)`` is the library's way to do the same.
Real bookie processes (``make_cluster``); the follower is a real bkctl
subprocess, stopped by the test also when it fails."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys

import pytest
from click.testing import CliRunner

import appliance
from appliance.errors import NoSuchLogError
from cli.main import cli as bkctl_cli
from tests.logservice.support import log_servers_running
from tests.support.bkctl import REPO, bkctl
from tests.support.launch import stop_process, wait_for, wait_registered

FOLLOW_TIMEOUT_S = 60.0  # a bound for a loaded 2-core machine, not a target


@pytest.fixture
def bookies(make_cluster):
    return make_cluster(3, quorums=(3, 3, 2))


@pytest.fixture
def app(bookies):
    with appliance.connect(str(bookies.config_path)) as client:
        wait_registered(client, 3)
        yield bookies.config_path, client


def _write(client, name: str, payloads: list[bytes]) -> None:
    with client.log(name).writer() as w:
        for p in payloads:
            w.write(p)


@pytest.fixture
def service(app, bookies):
    """``app`` with a log server running, as ``bkctl up`` starts one."""
    with log_servers_running(bookies, app[1], "logserver-1"):
        yield app


def _follow(config, name: str, tmp_path, *options: str):
    """``bkctl log read NAME --follow`` as a process, its stdout and stderr
    in files (a pipe could fill), once it says it waits for the log; the
    caller stops it."""
    out, err = tmp_path / "out", tmp_path / "err"
    with open(out, "wb") as out_f, open(err, "wb") as err_f:
        follower = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "log", "read", name, "--follow", *options,
             "--config", str(config)], cwd=REPO, stdout=out_f, stderr=err_f,
            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        wait_for(lambda: b"waiting for it" in err.read_bytes() or follower.poll() is not None,
                 FOLLOW_TIMEOUT_S, what="the follower to say it waits")
    except BaseException:
        stop_process(follower, 10.0, signal.SIGKILL)
        raise
    return follower, out, err


def test_follow_started_before_the_log_exists_prints_its_records(app, tmp_path):
    config, client = app
    follower, out, err = _follow(config, "brandnew", tmp_path)
    try:
        assert follower.poll() is None, err.read_text()
        assert err.read_text().strip() == \
            "log brandnew does not exist yet: waiting for it (Ctrl-C to stop)"
        _write(client, "brandnew", [b"first", b"second", b"third"])
        wait_for(lambda: out.read_bytes().count(b"\n") >= 3 or follower.poll() is not None,
                 FOLLOW_TIMEOUT_S, what="the three records printed")
        assert follower.poll() is None, err.read_text()
        _write(client, "brandnew", [b"fourth"])  # still following the new log
        wait_for(lambda: out.read_bytes().count(b"\n") >= 4 or follower.poll() is not None,
                 FOLLOW_TIMEOUT_S, what="the fourth record printed")
        follower.send_signal(signal.SIGINT)  # Ctrl-C: a clean end
        assert follower.wait(FOLLOW_TIMEOUT_S) == 0, err.read_text()
    finally:
        if follower.poll() is None:
            stop_process(follower, 10.0, signal.SIGKILL)
    assert out.read_bytes() == b"first\nsecond\nthird\nfourth\n"


def test_a_plain_read_of_a_missing_log_fails_in_one_line(app):
    config, _ = app
    result = CliRunner().invoke(bkctl_cli, ["log", "read", "nothere", "--config", str(config)])
    assert result.exit_code == 1
    assert result.output == "Error: NoSuchLogError: log 'nothere' does not exist\n"
    done = bkctl("log", "read", "nothere", config=config, text=True)  # a real process too
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == "Error: NoSuchLogError: log 'nothere' does not exist\n"


def test_a_reader_made_to_wait_for_its_log_reads_it_once_it_is_written(app):
    _, client = app
    log = client.log("later")
    with pytest.raises(NoSuchLogError, match="'later' does not exist"):
        log.reader()
    with log.reader(wait_for_log=True) as r, log.reader(start_txid=2, wait_for_log=True) as r2:
        assert r.waiting_for_log and r.read(timeout_s=0.2) == []
        _write(client, "later", [b"a", b"b", b"c"])
        got = r.read(max_records=10, timeout_s=FOLLOW_TIMEOUT_S)
        assert not r.waiting_for_log
        assert [(rec.txid, rec.payload) for rec in got] == [(1, b"a"), (2, b"b"), (3, b"c")]
        got2 = r2.read(max_records=10, timeout_s=FOLLOW_TIMEOUT_S)
        assert [rec.payload for rec in got2] == [b"b", b"c"]


def test_follow_waits_for_a_log_the_log_service_creates(service, tmp_path):
    """As on an appliance started by ``bkctl up``: the records come through
    the log service (``bkctl log append``), the follower reads them from it."""
    config, _ = service
    follower, out, err = _follow(config, "viaservice", tmp_path, "--json")
    try:
        appended = bkctl("log", "append", "viaservice", "-", config=config, input=b"x\ny\n")
        assert appended.returncode == 0, appended.stderr
        wait_for(lambda: out.read_bytes().count(b"\n") >= 2 or follower.poll() is not None,
                 FOLLOW_TIMEOUT_S, what="the two records printed")
        follower.send_signal(signal.SIGTERM)
        assert follower.wait(FOLLOW_TIMEOUT_S) == 0, err.read_text()
    finally:
        if follower.poll() is None:
            stop_process(follower, 10.0, signal.SIGKILL)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["txid"], base64.b64decode(r["payload"])) for r in records] == \
        [(1, b"x"), (2, b"y")]
