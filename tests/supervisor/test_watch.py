"""The supervisor's watch rule, with an injected clock and probe: a starting
bookie (journal replay) is judged by start_timeout_ms until it first
answers; only then does ping_timeout_ms apply (a replay is never a hang)."""

from __future__ import annotations

import pytest

from appliance.config import load_config
from appliance.supervisor import supervisor as sup_mod
from tests.support.launch import write_config


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def watched(tmp_path, monkeypatch):
    path = write_config(tmp_path, 1, quorums=(1, 1, 1), supervisor={"ping_timeout_ms": 3000,
                                                 "start_timeout_ms": 60_000},
                        log={"servers": 0})  # the bookie's rule alone
    clock = Clock()
    sup = sup_mod.Supervisor(load_config(path), clock=clock)
    answers = {"up": False}
    killed = []
    monkeypatch.setattr(sup_mod, "bookie_info",
                        lambda endpoint, timeout_ms, **_: {"pid": 1} if answers["up"] else None)
    monkeypatch.setattr(sup_mod._Bookie, "alive", lambda self: True)
    monkeypatch.setattr(sup, "_kill", lambda b: killed.append(clock.now))
    b = sup.bookies[0]
    b.started_s = b.last_answer_s = clock.now  # as _spawn does
    b.serving = False
    return sup, clock, answers, killed


def test_a_replaying_bookie_is_not_killed_by_the_ping_timeout(watched):
    sup, clock, answers, killed = watched
    for _ in range(50):  # 50 s of replay: far past ping_timeout_ms (3 s)
        clock.now += 1.0
        sup.watch_once()
    assert killed == []
    answers["up"] = True
    sup.watch_once()
    assert sup.bookies[0].serving and killed == []


def test_a_bookie_that_never_serves_is_killed_after_start_timeout(watched):
    sup, clock, _answers, killed = watched
    clock.now += 59.0
    sup.watch_once()
    assert killed == []
    clock.now += 2.0
    sup.watch_once()
    assert killed == [clock.now]


def test_once_serving_the_ping_timeout_applies(watched):
    sup, clock, answers, killed = watched
    answers["up"] = True
    clock.now += 5.0
    sup.watch_once()
    answers["up"] = False
    clock.now += 2.0
    sup.watch_once()
    assert killed == []
    clock.now += 1.5  # 3.5 s since the last answer
    sup.watch_once()
    assert killed == [clock.now]
