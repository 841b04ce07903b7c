"""Many ledgers sharing bookie messages (tests/sim/multisim.py): 500 seeds of
2-12 writers whose adds travel in one message per bookie, with replies
applied in one step (``writer_multi``), over a network that drops,
duplicates and reorders, and bookies that refuse entries or leave one out
of a reply, keep every invariant; with the rows taken by position instead
of matched to the entries they name, the checker fails."""

from __future__ import annotations

from collections import Counter

from tests.sim.multisim import random_config, run_multi_seed

SEEDS = 500


def test_every_invariant_holds_over_500_seeds():
    failures, totals = [], Counter()
    for seed in range(SEEDS):
        result = run_multi_seed(seed)
        totals.update(result.stats)
        if result.violation:
            failures.append(f"seed {seed}: {result.violation}")
    assert failures == [], "\n".join(failures[:5])
    # the seeds did what they are for: messages of several ledgers, replies a
    # row short (each such part refused: a bookie replaced), acks despite them
    assert totals["parts"] > 1.5 * totals["messages"]
    assert totals["lost_rows"] > SEEDS and totals["ensemble_changes"] > SEEDS
    assert totals["acked"] > 50 * SEEDS


def test_taking_rows_by_position_is_caught():
    caught = Counter()
    for seed in range(200):
        result = run_multi_seed(seed, break_rows=True)
        if result.violation:
            caught[result.violation.split(":")[0]] += 1
    assert caught["acked-quorum"] >= 50, caught


def test_configs_and_runs_are_deterministic_per_seed():
    assert random_config(7) == random_config(7)
    assert run_multi_seed(7).stats == run_multi_seed(7).stats
