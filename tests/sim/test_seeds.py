"""Random seeds: every fault on, every invariant checked after every step.

* 2,000 seeds with all protections on: no violation (and the runs did real
  work: they closed ledgers, lost messages, crashed bookies).
* Each protection switched off: a 3,000-seed sweep finds a violation (stops
  at the first), so the checker can fail and each protection matters.
  ``late-refusal`` needs a longer sweep: its shape (a bookie's refusal
  reaching the writer after the ack quorum confirmed the entry, and the
  writer going on) is rare in random runs (the first is seed 5,898).
"""

import os
import time

import pytest

from appliance.protocol.quorum import PROTECTION_NAMES
from tests.sim.config import random_config
from tests.sim.runner import run_seeds

JOBS = min(2, os.cpu_count() or 1)
SWEEP_SEEDS = {"late-refusal": 10_000}  # the rest: 3,000


def test_two_thousand_random_seeds_violate_nothing():
    started = time.monotonic()
    summary = run_seeds(range(2_000), jobs=JOBS)
    elapsed_s = time.monotonic() - started
    assert [f.report() for f in summary.failures] == []
    assert summary.seeds == 2_000
    # the runs did real work: ledgers got closed, many steps were checked
    assert summary.outcomes["closed"] >= 1_900, summary.outcomes
    assert summary.steps >= 500_000
    print(f"2000 seeds: {elapsed_s:.1f}s, {summary.steps} steps, {dict(summary.outcomes)}")


def test_the_seeds_cover_every_configuration_and_fault():
    configs = [random_config(seed) for seed in range(2_000)]
    quorums = {(c.ensemble, c.write_quorum, c.ack_quorum) for c in configs}
    assert (1, 1, 1) in quorums and (5, 3, 2) in quorums and len(quorums) >= 15
    assert sum(not c.journal for c in configs) >= 400  # BP-46 journal-less bookies
    assert sum(c.drop_p > 0 for c in configs) >= 1_000
    assert sum(c.dup_p > 0 for c in configs) >= 400
    assert sum(bool(c.crashes) or c.crash_budget > 0 for c in configs) >= 1_000
    assert sum(bool(c.partitions) for c in configs) >= 300
    assert sum(c.zombie_recovery_p > 0 for c in configs) >= 500
    assert sum(bool(c.read_only) for c in configs) >= 400  # bookies refusing adds a while


@pytest.mark.parametrize("protection", PROTECTION_NAMES)
def test_switching_a_protection_off_lets_the_checker_find_a_violation(protection):
    seeds = SWEEP_SEEDS.get(protection, 3_000)
    summary = run_seeds(range(seeds), disabled=(protection,), jobs=JOBS, stop_at_first=True)
    assert summary.failures, f"no violation in {seeds} seeds with {protection} off"
    failure = summary.failures[0]
    assert failure.violation in {"ack-after-close", "no-divergence", "acked-lost",
                                 "core-invariant", "repair-incomplete", "placement",
                                 "closed-quorum", "acked-sent", "refused-kept",
                                 "read-negative", "repoint-durable", "short-healed",
                                 "short-scrubbed"}, \
        failure.report((protection,))
