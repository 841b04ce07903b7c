"""A supervisor without processes: injected clocks and fake children
(``Popen``'s ``poll`` / ``returncode`` / ``wait``), so its watch and its
operator requests run in the test's thread with nothing started."""

from __future__ import annotations

from appliance.config import load_config
from appliance.supervisor import supervisor as sup_mod
from tests.support.launch import write_config

WALL_T0 = 1_796_371_200.0  # 2026-12-04T08:00:00Z


class Clock:
    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


class FakeChild:
    """Popen's ``poll`` / ``returncode`` / ``wait``, ended by ``end(rc)``."""

    def __init__(self, pid: int):
        self.pid, self.returncode = pid, None

    def poll(self):
        return self.returncode

    def end(self, returncode: int) -> None:
        self.returncode = returncode

    def wait(self):
        return self.returncode


def fake_supervisor(tmp_path, monkeypatch, n_bookies: int, **sections):
    """(supervisor, config, children, clock, wall): a supervisor of
    ``n_bookies`` bookies (no log servers unless ``log=`` says) whose spawns
    are fake children (pids 1000, 1001, ...) and whose pings all answer;
    nothing is started yet (``sup.start_all()``)."""
    path = write_config(tmp_path, n_bookies, quorums=(1, 1, 1),
                        **{"log": {"servers": 0}, **sections})
    clock, wall = Clock(100.0), Clock(WALL_T0)
    config = load_config(path)
    sup = sup_mod.Supervisor(config, clock=clock, wall_clock=wall)
    config.run_path.mkdir(parents=True, exist_ok=True)
    monkeypatch.setattr(sup_mod, "bookie_info", lambda *a, **k: {"pid": 1})
    monkeypatch.setattr(sup_mod, "log_server_info", lambda *a, **k: {"pid": 1})
    children: list[FakeChild] = []

    def spawn(b):
        b.popen = FakeChild(1000 + len(children))
        children.append(b.popen)
        b.pid, b.started_s, b.last_answer_s = b.popen.pid, clock.now, clock.now
        b.started_at = wall.now

    monkeypatch.setattr(sup, "_spawn", spawn)
    return sup, config, children, clock, wall
