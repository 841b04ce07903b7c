"""Read your writes in the simulation: tailing readers are told by the
writer (a log's owner answering them) how far its entries are acknowledged,
a network delay after it said so, and read that far past the bookies' LAC
(``LedgerReader.learn_lac``), among every fault of the random scenarios.
No invariant fails (no reader LAC past the writer's: ``phantom-lac``; reads
agree with the writer and the closed ledger); a writer that claims one
entry more than it has acknowledged is caught."""

from __future__ import annotations

import dataclasses

from tests.sim.apps import ReaderApp
from tests.sim.config import random_config
from tests.sim.runner import play

SEEDS = 300


def _run(seed: int, broken: bool):
    cluster, violation = play(dataclasses.replace(random_config(seed), told_lac_p=0.8,
                                                  told_lac_broken=broken), seed)
    told = sum(a.told_lacs for a in cluster.apps if isinstance(a, ReaderApp))
    return violation, told


def test_readers_told_the_writers_lac_break_no_invariant():
    told_total = 0
    for seed in range(SEEDS):
        violation, told = _run(seed, broken=False)
        assert violation is None, (seed, violation)
        told_total += told
    assert told_total > SEEDS  # the path ran: readers were told, many times


def test_a_writer_claiming_an_unacknowledged_entry_is_caught():
    caught = [seed for seed in range(SEEDS) if _run(seed, broken=True)[0] is not None]
    assert len(caught) > SEEDS // 10, caught
