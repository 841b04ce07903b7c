"""Cold storage's simulation (tests/sim/coldsim.py): the real mover killed at
random I/O calls while real log readers step between them; every invariant
holds; and with the swap to cold made before the file exists, the checker
catches it."""

from __future__ import annotations

from tests.sim.coldsim import random_cold_config, run_cold_seed

SEEDS = 150


def test_every_cold_invariant_holds_with_movers_killed_anywhere():
    failures, totals = [], {}
    for seed in range(SEEDS):
        result = run_cold_seed(seed)
        for k, v in result.stats.items():
            totals[k] = totals.get(k, 0) + v
        if result.violation:
            failures.append(f"seed {seed} [{result.violation}] {result.detail}")
    assert failures == [], "\n".join(failures[:5])
    # the seeds did what they are for: crashes, moves, orphans collected, readers
    assert totals["crashes"] > SEEDS // 2 and totals["moved"] > SEEDS
    assert totals["orphans_removed"] > 0 and totals["reader_steps"] > 10 * SEEDS


def test_swapping_to_cold_before_the_file_exists_is_caught():
    caught = [run_cold_seed(seed, break_order=True).violation for seed in range(30)]
    assert caught.count("cold-unreadable") == 30


def test_runs_are_deterministic_per_seed():
    assert random_cold_config(5) == random_cold_config(5)
    a, b = run_cold_seed(9), run_cold_seed(9)
    assert (a.violation, a.stats) == (b.violation, b.stats)
