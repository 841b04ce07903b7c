"""The log service's simulation (tests/sim/logservicesim.py): 1,000 seeds of
producers writing one to three logs through crashing, restarting and
pausing log servers over a lossy, duplicating, reordering network keep
every invariant, with each process's requests (and the answers for it)
sent one at a time or together in multi-log messages, and owners refusing
requests their log's ledger window has no room for; with the duplicate
filter switched off, or an unknown producer started at its first number
instead of its oldest unacknowledged write, the checker fails.  The owner of
each log is the real core (appliance.protocol.log_owner)."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.sim.logservicesim import random_config, run_service_seed

SEEDS = 1000


def test_every_invariant_holds_over_1000_seeds():
    failures, totals = [], Counter()
    for seed in range(SEEDS):
        result = run_service_seed(seed)
        totals.update(result.stats)
        if result.violation:
            failures.append(f"seed {seed}: {result.violation}")
    assert failures == [], "\n".join(failures[:5])
    # the seeds did what they are for: takeovers after crashes, retries answered
    # from the filter, commits fenced, unacknowledged records kept by a fence
    assert totals["takeovers"] > SEEDS and totals["crashes"] > SEEDS // 2
    assert totals["duplicates"] > 10 * SEEDS and totals["gap"] > SEEDS
    assert totals["fenced_commits"] > 0 and totals["kept_unacked"] > 0
    # both kinds of seeds ran, and multi-log messages carried several sections
    # and answers, some with a section redirected beside a section written
    assert totals["mux_seeds"] > SEEDS // 2 and totals["single_seeds"] > SEEDS // 10
    assert totals["mux_sections"] > 10 * SEEDS and totals["mux_answers"] > 10 * SEEDS
    assert totals["mux_mixed"] > 0
    # and owners whose ledger window was full answered "retry" before judging
    assert totals["busy"] > 10 * SEEDS
    # the real owner core ran: logs handed over, control entries after pauses
    assert totals["handovers"] > 0 and totals["leases_lost"] > 0
    assert totals["control_entries"] > SEEDS


def test_every_invariant_holds_with_every_request_in_multi_log_messages():
    failures, totals = [], Counter()
    for seed in range(500):
        result = run_service_seed(seed, mux=True)
        totals.update(result.stats)
        if result.violation:
            failures.append(f"seed {seed}: {result.violation}")
    assert failures == [], "\n".join(failures[:5])
    assert totals["takeovers"] > 500 and totals["duplicates"] > 5_000
    assert totals["not_owner"] > 100 and totals["mux_mixed"] > 0


@pytest.mark.parametrize("mux", [False, True], ids=["single", "multi-log"])
def test_switching_the_duplicate_filter_off_is_caught(mux):
    caught = Counter()
    for seed in range(200):
        result = run_service_seed(seed, break_dedup=True, mux=mux)
        if result.violation:
            caught[result.violation.split(":")[0]] += 1
    assert sum(caught.values()) >= 150, caught
    assert caught["stored-once"] >= 100, caught


def test_starting_an_unknown_producer_at_its_first_number_is_caught():
    # single requests: a producer's requests that leave in one multi-log message
    # cannot overtake one another, so that case is the one to break
    caught = Counter()
    for seed in range(200):
        result = run_service_seed(seed, break_oldest=True, mux=False)
        if result.violation:
            caught[result.violation.split(":")[0]] += 1
    assert caught["acked-kept"] >= 50, caught


def test_configs_and_runs_are_deterministic_per_seed():
    assert random_config(7) == random_config(7)
    assert run_service_seed(7).stats == run_service_seed(7).stats
