"""The bench's bookie CPU figure counts the clients' loops only: not their
ledgers' close and delete after the loop, which with thousands of ledgers
was most of what the bookies did in the window."""

from __future__ import annotations

import time

from appliance.bench import ledgers as bench

CLEANUP_S = 1.0


def _client_with_slow_cleanup(kind, config, options, index, ready, done, go) -> None:
    """A client process's message sequence, its cleanup taking CLEANUP_S."""
    ready.put(("ready", index, None))
    go.wait(60)
    ready.put(("looped", index, None))
    started = time.monotonic()
    time.sleep(CLEANUP_S)  # stands for closing and deleting many ledgers
    done.put(("done", index, {"cleanup_started": started, "cleanup_ended": time.monotonic()}))


def test_bookie_cpu_stops_counting_when_the_loops_end(monkeypatch):
    readings: list[float] = []

    def cpu_s(pids) -> float:
        readings.append(time.monotonic())
        return 0.0

    monkeypatch.setattr(bench, "_cpu_s", cpu_s)
    results, _ = bench._run_clients("write", "unused.toml", bench.BenchOptions(clients=2), {},
                                    target=_client_with_slow_cleanup)
    assert len(results) == 2 and len(readings) == 2
    # the second reading comes once both loops ended, before their cleanups did
    assert readings[1] < min(r["cleanup_ended"] for r in results)
    assert readings[1] > readings[0]
