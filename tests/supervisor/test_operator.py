"""Operator requests to a running supervisor (`bkctl bookie start|stop|restart
ID`, `bkctl log-server ...`, fix-cookie on a running appliance): one process
is stopped, started or restarted, the others are not touched; a process the
operator stopped is not restarted and its exit is not a failure.  Injected
clocks, fake children and recorded signals: no process runs here, except the
control socket's round trip at the end (ZeroMQ over ipc:// in a temp dir)."""

from __future__ import annotations

import signal

import pytest
import zmq

from appliance.bookie.exit_codes import EXIT_REFUSED
from appliance.config import load_config
from appliance.supervisor import control
from appliance.supervisor import supervisor as sup_mod
from tests.supervisor.fakes import fake_supervisor
from tests.support.launch import write_config


@pytest.fixture
def supervised(tmp_path, monkeypatch):
    """Two bookies and one log server, started (pids 1000, 1001, 1002);
    signals sent are recorded as (pid, signal), never delivered."""
    sup, config, children, clock, _wall = fake_supervisor(
        tmp_path, monkeypatch, 2, log={"servers": 1},
        supervisor={"restart_backoff_min_ms": 100, "stop_timeout_ms": 5000})
    sent: list[tuple[int, int]] = []

    def record(pid, sig):  # a SIGKILL ends the fake child, as it would a process
        sent.append((pid, sig))
        if sig == signal.SIGKILL:
            next(c for c in children if c.pid == pid).end(-signal.SIGKILL)

    monkeypatch.setattr(sup_mod, "_signal", record)
    sup.start_all()
    return sup, config, children, clock, sent


def _run(config, process_id: str) -> dict:
    return sup_mod.read_state(config)["runs"][process_id]


def test_a_stopped_bookie_is_left_down_and_its_exit_is_not_a_failure(supervised):
    sup, config, children, clock, sent = supervised
    reply = sup.control("stop", "bookie-2")
    assert reply["ok"] and reply["was_pid"] == 1001 and reply["note"] == "stopping"
    assert sent == [(1001, signal.SIGTERM)]  # bookie-1 and the log server untouched
    assert _run(config, "bookie-2")["stopped_by_operator"] is True
    children[1].end(0)
    sup.watch_once()
    run = _run(config, "bookie-2")
    assert (run["pid"], run["restarts"], run["last_exit"]["by_operator"]) == (None, 0, True)
    clock.now += 600.0  # far past any backoff
    sup.watch_once()
    assert len(children) == 3 and _run(config, "bookie-2")["pid"] is None
    assert [_run(config, i)["pid"] for i in ("bookie-1", "logserver-1")] == [1000, 1002]


def test_a_stop_not_obeyed_within_stop_timeout_is_a_kill(supervised):
    sup, config, children, clock, sent = supervised
    sup.control("stop", "logserver-1")
    clock.now += 4.0
    sup.watch_once()
    assert sent == [(1002, signal.SIGTERM)]
    clock.now += 2.0  # past stop_timeout_ms (5 s)
    sup.watch_once()
    assert sent == [(1002, signal.SIGTERM), (1002, signal.SIGKILL)]
    run = _run(config, "logserver-1")
    assert (run["pid"], run["last_exit"]["signal"], run["last_exit"]["by_operator"]) == (
        None, "SIGKILL", True)


def test_start_brings_an_operator_stopped_bookie_back_at_once(supervised):
    sup, config, children, _clock, _sent = supervised
    sup.control("stop", "bookie-1")
    children[0].end(0)
    sup.watch_once()
    reply = sup.control("start", "bookie-1")
    assert (reply["ok"], reply["note"], reply["pid"]) == (True, "started", 1003)
    run = _run(config, "bookie-1")
    assert (run["pid"], run["stopped_by_operator"], run["restarts"]) == (1003, False, 0)
    assert _run(config, "bookie-2")["pid"] == 1001


def test_start_of_a_running_bookie_changes_nothing(supervised):
    sup, _config, children, _clock, sent = supervised
    reply = sup.control("start", "bookie-2")
    assert (reply["note"], reply["pid"], len(children), sent) == (
        "already running", 1001, 3, [])


def test_restart_starts_it_again_once_it_exited_and_is_not_counted(supervised):
    sup, config, children, _clock, sent = supervised
    reply = sup.control("restart", "bookie-2")
    assert reply["ok"] and sent == [(1001, signal.SIGTERM)]
    sup.watch_once()  # still stopping: nothing new
    assert len(children) == 3
    children[1].end(0)
    sup.watch_once()
    run = _run(config, "bookie-2")
    assert (run["pid"], run["restarts"], run["stopped_by_operator"]) == (1003, 0, False)
    assert _run(config, "bookie-1")["pid"] == 1000


def test_start_brings_back_a_bookie_left_down_after_it_refused(supervised):
    """The disk-swap path: the bookie refused (no cookie), the supervisor
    left it down; once fixed, an operator start runs it at once."""
    sup, config, children, clock, _sent = supervised
    children[0].end(EXIT_REFUSED)
    sup.watch_once()
    clock.now += 60.0
    sup.watch_once()
    assert _run(config, "bookie-1")["given_up"] is True and len(children) == 3
    reply = sup.control("start", "bookie-1")
    assert reply["pid"] == 1003
    run = _run(config, "bookie-1")
    assert (run["given_up"], run["pid"]) == (False, 1003)
    children[3].end(-signal.SIGKILL)  # and it is supervised again: a crash restarts it
    sup.watch_once()
    clock.now += 1.0
    sup.watch_once()
    assert _run(config, "bookie-1")["pid"] == 1004


def test_an_unknown_process_is_refused_naming_the_known_ones(supervised):
    sup, _config, _children, _clock, sent = supervised
    reply = sup.control("stop", "bookie-9")
    assert not reply["ok"] and "bookie-1, bookie-2, logserver-1" in reply["error"]
    assert sent == []


def test_the_control_socket_answers_requests_and_refuses_garbage(short_tmp):
    config = load_config(write_config(short_tmp, 1, quorums=(1, 1, 1)))
    config.run_path.mkdir(parents=True)
    server = control.ControlSocket(config)
    asked = []
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    try:
        sock.connect(control.control_endpoint(config))
        sock.send(b'{"op": "start", "id": "bookie-1"}')
        sock.send(b"not json")
        sock.send(b'{"op": "format", "id": "bookie-1"}')
        replies = []
        deadline_polls = 50
        while len(replies) < 3 and deadline_polls:
            server.wait(100, lambda op, pid: asked.append((op, pid)) or {"ok": True})
            while sock.poll(0):
                replies.append(sock.recv_json())
            deadline_polls -= 1
    finally:
        sock.close()
        server.close()
    assert asked == [("start", "bookie-1")]
    assert replies[0] == {"ok": True}
    assert replies[1] == {"ok": False, "error": "request is not JSON"}
    assert not replies[2]["ok"] and "start, stop, restart" in replies[2]["error"]
    assert not (config.run_path / control.SOCKET_NAME).exists()


def test_ask_without_a_supervisor_is_none_within_its_deadline(short_tmp):
    config = load_config(write_config(short_tmp, 1, quorums=(1, 1, 1)))
    assert control.ask(config, "stop", "bookie-1", 200) is None


def test_the_control_socket_is_its_owners_alone(short_tmp):
    config = load_config(write_config(short_tmp, 1, quorums=(1, 1, 1)))
    config.run_path.mkdir(parents=True)
    server = control.ControlSocket(config)
    try:
        mode = (config.run_path / control.SOCKET_NAME).stat().st_mode & 0o777
    finally:
        server.close()
    assert mode == 0o600


def test_a_run_folder_too_deep_for_a_socket_leaves_the_supervisor_running_without_it(short_tmp):
    """A unix socket path holds 107 bytes: past that the supervisor still
    runs its processes, and says why it takes no requests."""
    deep = short_tmp / ("d" * 100) / "run"
    config = load_config(write_config(short_tmp, 1, quorums=(1, 1, 1),
                                      supervisor={"run_dir": str(deep)}))
    deep.mkdir(parents=True)
    server = control.ControlSocket(config)
    try:
        server.wait(0, lambda op, pid: pytest.fail("no request can arrive"))
    finally:
        server.close()
    assert "[supervisor] run_dir" in server.unavailable
    assert control.control_unavailable(config) == server.unavailable
