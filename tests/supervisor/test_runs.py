"""What the supervisor records of each bookie's runs (restarts since `bkctl
up`, start time, last exit) in its owner-only state file, and what `bkctl
status` / `bkctl bookie info` make of it.  Injected clocks and a fake child
process: no bookie runs here."""

from __future__ import annotations

import json
import os
import signal
import stat

import pytest

from appliance.bookie.exit_codes import EXIT_REFUSED
from appliance.supervisor import runs
from appliance.supervisor import supervisor as sup_mod
from tests.supervisor.fakes import WALL_T0, fake_supervisor


@pytest.fixture
def supervised(tmp_path, monkeypatch):
    """A supervisor of one bookie whose spawns are fake children (pids 1000,
    1001, ...), with a monotonic and a wall clock moved together."""
    sup, config, children, clock, wall = fake_supervisor(
        tmp_path, monkeypatch, 1, supervisor={"restart_backoff_min_ms": 100})

    def advance(seconds: float) -> None:
        clock.now += seconds
        wall.now += seconds

    sup.start_all()
    return sup, config, children, advance


def _state(config) -> dict:
    return sup_mod.read_state(config)


def test_a_killed_bookie_is_counted_with_its_signal_and_time(supervised):
    sup, config, children, advance = supervised
    run = _state(config)["runs"]["bookie-1"]
    assert (run["pid"], run["restarts"], run["last_exit"]) == (1000, 0, None)
    assert run["started_at"] == WALL_T0

    advance(5.0)
    children[0].end(-signal.SIGKILL)
    sup.watch_once()  # seen: recorded at once, restarted after the backoff
    run = _state(config)["runs"]["bookie-1"]
    assert run["last_exit"] == {"code": None, "signal": "SIGKILL",
                                "at": "2026-12-04T08:00:05+00:00"}
    assert (run["pid"], run["restarts"]) == (None, 0)

    advance(0.2)
    sup.watch_once()
    run = _state(config)["runs"]["bookie-1"]
    assert (run["pid"], run["restarts"], run["started_at"]) == (1001, 1, WALL_T0 + 5.2)
    assert run["last_exit"]["signal"] == "SIGKILL"

    advance(30.0)
    children[1].end(3)
    sup.watch_once()
    assert _state(config)["runs"]["bookie-1"]["last_exit"] == {
        "code": 3, "signal": None, "at": "2026-12-04T08:00:35+00:00"}


def test_a_bookie_that_refused_to_start_is_left_down_with_its_reason(supervised):
    sup, config, children, advance = supervised
    refusal = ("bookie bookie-1: refusing to start: CookieMismatchError: journal_dir x has "
               "no cookie ... `bkctl bookie fix-cookie bookie-1`")
    (config.run_path / "bookie-1.log").write_text(f"a line before\n{refusal}\n\n")
    advance(1.0)
    children[0].end(EXIT_REFUSED)
    sup.watch_once()
    advance(60.0)  # far past any backoff: still not restarted
    sup.watch_once()
    assert len(children) == 1
    run = _state(config)["runs"]["bookie-1"]
    assert (run["given_up"], run["restarts"], run["pid"]) == (True, 0, None)
    assert run["last_exit"]["reason"] == refusal
    seen = runs.supervision(_state(config), "bookie-1", None, WALL_T0 + 61)
    assert seen["left_down"] is True
    assert runs.describe_exit(seen["last_exit"]).endswith(f"left down: {refusal}")


def test_the_state_file_is_owner_only_and_keeps_the_pid_map(supervised):
    _sup, config, _children, _advance = supervised
    path = sup_mod.state_path(config)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    doc = json.loads(path.read_text())
    assert doc["bookies"] == {"bookie-1": 1000}  # what `bkctl down` and adoption read
    assert not path.with_suffix(".json.tmp").exists()


def test_supervision_reads_the_record_of_the_live_process():
    state = {"runs": {"b1": {"pid": 7, "started_at": WALL_T0, "restarts": 2,
                             "last_exit": runs.exit_record(-9, WALL_T0 - 1)}}}
    seen = runs.supervision(state, "b1", 7, WALL_T0 + 12.34)
    assert seen == {"restarts": 2, "uptime_s": 12.3, "left_down": False,
                    "stopped_by_operator": False, "last_exit": {
        "code": None, "signal": "SIGKILL", "at": "2026-12-04T07:59:59+00:00"}}
    down = runs.supervision(state, "b1", None, WALL_T0 + 60)
    assert (down["restarts"], down["uptime_s"]) == (2, None)
    # no supervisor records it (started by hand), and it is not a process of this host
    assert runs.supervision(None, "b1", None, WALL_T0) == {
        "restarts": None, "uptime_s": None, "last_exit": None, "left_down": None,
        "stopped_by_operator": None}


def test_exits_read_as_people_say_them():
    assert runs.describe_exit(None) == "-"
    assert runs.describe_exit(runs.exit_record(-15, WALL_T0)) == \
        "SIGTERM at 2026-12-04T08:00:00+00:00"
    assert runs.describe_exit(runs.exit_record(2, WALL_T0)).startswith("code 2 at ")
    assert "code unknown" in runs.describe_exit(runs.exit_record(None, WALL_T0))


def test_a_restart_is_on_record_before_the_next_process_is_pinged(tmp_path, monkeypatch):
    """`bkctl status` pairs a bookie's live pid with the state file's run
    record: a restarted bookie must not answer with its new pid while the
    file still holds the old count.  A ping of another process (up to a
    second) used to come between the spawn and the write."""
    sup, config, children, clock, wall = fake_supervisor(
        tmp_path, monkeypatch, 2, supervisor={"restart_backoff_min_ms": 100})
    seen_at_ping: list[dict] = []

    def ping(endpoint, *a, **k):  # bookie-2 is pinged after bookie-1 is looked at
        if endpoint == config.bookies[1].endpoint:
            seen_at_ping.append(dict(_state(config)["runs"]["bookie-1"]))
        return {"pid": 1}

    monkeypatch.setattr(sup_mod, "bookie_info", ping)
    sup.start_all()
    children[0].end(-signal.SIGKILL)
    sup.watch_once()  # the exit
    clock.now += 0.2
    wall.now += 0.2
    sup.watch_once()  # the restart of bookie-1, then the ping of bookie-2
    assert (seen_at_ping[-1]["pid"], seen_at_ping[-1]["restarts"]) == (1002, 1)


def test_a_due_restart_does_not_wait_behind_the_pings_of_the_others(tmp_path, monkeypatch):
    """The last process's restart (here bookie-3's) is made before the
    others are pinged: each ping of a busy process can take up to a second,
    and a restarted log server is where its logs go back."""
    sup, config, children, clock, wall = fake_supervisor(
        tmp_path, monkeypatch, 3, supervisor={"restart_backoff_min_ms": 100})
    spawned_at_ping: list[int] = []

    def ping(endpoint, *a, **k):
        spawned_at_ping.append(len(children))
        return {"pid": 1}

    monkeypatch.setattr(sup_mod, "bookie_info", ping)
    sup.start_all()
    children[2].end(-signal.SIGKILL)
    sup.watch_once()  # the exit
    clock.now += 0.2
    wall.now += 0.2
    spawned_at_ping.clear()
    sup.watch_once()  # the restart of bookie-3, then the pings
    assert spawned_at_ping and spawned_at_ping[0] == 4  # bookie-3's new process already
    assert _state(config)["runs"]["bookie-3"]["restarts"] == 1


def test_an_exit_signalled_during_the_pings_is_recorded_before_the_next_ping(
        tmp_path, monkeypatch):
    """SIGCHLD during a watch: the exit (for a log server, the release of
    its leases) is seen before the next process is pinged, not after all
    the pings (up to a second each from busy processes)."""
    sup, config, children, clock, wall = fake_supervisor(
        tmp_path, monkeypatch, 3, supervisor={"restart_backoff_min_ms": 100})
    exit_seen_at_ping: list[object] = []

    def ping(endpoint, *a, **k):
        if endpoint == config.bookies[0].endpoint:
            children[2].end(-signal.SIGKILL)
            sup.child_exited()  # what the SIGCHLD handler calls
        exit_seen_at_ping.append(_state(config)["runs"]["bookie-3"]["last_exit"])
        return {"pid": 1}

    monkeypatch.setattr(sup_mod, "bookie_info", ping)
    sup.start_all()
    sup.watch_once()
    assert exit_seen_at_ping[0] is None  # bookie-1's ping: bookie-3 still ran
    assert exit_seen_at_ping[1]["signal"] == "SIGKILL"  # recorded before bookie-2's
