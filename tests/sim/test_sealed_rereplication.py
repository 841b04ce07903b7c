"""Re-replication of an OPEN ledger's sealed fragments while its writer
writes (tests/sim/rerep.py): nothing acknowledged is lost, the writer is never
fenced or failed by it, its own metadata write over the version the
re-pointing made stale (a close, an ensemble change) adopts the change and
succeeds, and a re-replicator that re-points before its copies are durable
is caught (``repoint-durable``)."""

from __future__ import annotations

import dataclasses

from appliance.errors import LedgerFencedError, MetadataVersionError
from tests.sim.config import random_config
from tests.sim.rerep import SealedRereplicator
from tests.sim.runner import play

SEEDS = 600


def _run(seed: int, broken: bool = False):
    cluster, violation = play(dataclasses.replace(random_config(seed),
                                                  rereplicate_broken=broken), seed)
    apps = [a for a in cluster.apps if isinstance(a, SealedRereplicator)]
    return cluster, apps, violation


def test_sealed_fragments_are_re_pointed_under_a_writer_that_keeps_writing():
    repointed = closes = 0
    for seed in range(SEEDS):
        cfg = random_config(seed)
        if not cfg.rereplications:
            continue
        cluster, apps, violation = _run(seed)
        assert violation is None, (seed, violation)
        assert cluster.finished and cluster.outcome == "closed", (seed, cluster.outcome)
        if not any(app.outcome == "re-pointed" for app in apps):
            continue
        # re-pointing never fenced the writer: only a recovery (none starts
        # before cfg.recoveries / the heal) may
        first_recovery = min(cfg.recoveries + [cfg.heal_at_ms])
        fenced = [at for at, code in cluster.writer.failures if code == LedgerFencedError.code]
        assert all(at >= first_recovery for at in fenced), (seed, fenced, first_recovery)
        # nor did a metadata conflict on the re-pointed fragment fail its adds
        assert MetadataVersionError.code not in {code for _, code in cluster.writer.failures}
        for app in apps:
            if app.outcome == "re-pointed":
                repointed += 1
                if app.writer_close_asked and cluster.writer.closed_at is not None:
                    closes += 1  # its close, over the stale version, succeeded
    assert repointed >= 15, repointed
    # the writer's own CAS over the version our re-pointing made stale adopted it
    # (with the adoption removed from the writer core, this count drops to 0)
    assert closes >= 5, closes


def test_re_pointing_before_the_copies_are_durable_is_caught():
    caught = []
    for seed in range(SEEDS):
        if not random_config(seed).rereplications:
            continue
        _, _, violation = _run(seed, broken=True)
        if violation is not None:
            caught.append(violation)
    assert len(caught) >= 10, caught
    assert "repoint-durable" in caught
