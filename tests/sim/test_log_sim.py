"""The log layer's simulation (tests/sim/logsim.py): 2,000 seeds of writer
handovers (the superseded writer often still alive), segment rollovers,
bookie crashes, message loss and reordering, tailing and resumed readers,
with every log-level invariant holding; and the fencing step removed, the
checker catches it."""

from __future__ import annotations

from tests.sim.logsim import random_log_config, run_log_seed

SEEDS = 2000


def test_every_log_invariant_holds_over_2000_seeds():
    failures, totals = [], {}
    for seed in range(SEEDS):
        result = run_log_seed(seed)
        for k, v in result.stats.items():
            totals[k] = totals.get(k, 0) + v
        if result.violation:
            failures.append(f"seed {seed} [{result.violation}] {result.detail}")
    assert failures == [], "\n".join(failures[:5])
    # the seeds did what they are for: takeovers, fenced writers, rollovers, acks
    assert totals["handovers"] > SEEDS and totals["fenced_writers"] > SEEDS // 2
    assert totals["segments"] > 4 * SEEDS and totals["acked"] > 20 * SEEDS


def test_removing_the_fencing_step_is_caught():
    caught = []
    for seed in range(200):
        result = run_log_seed(seed, break_fence=True)
        if result.violation:
            caught.append((seed, result.violation))
    assert len(caught) >= 20, caught  # caught often, not by luck
    assert {name for _, name in caught} <= {"log-acked-lost", "log-duplicate", "log-order",
                                            "log-tail", "log-resume", "liveness"}
    assert any(name == "log-acked-lost" for _, name in caught)


def test_configs_are_deterministic_per_seed():
    assert random_log_config(7) == random_log_config(7)
    a, b = run_log_seed(11), run_log_seed(11)
    assert (a.violation, a.stats) == (b.violation, b.stats)
