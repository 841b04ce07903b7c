"""Run seeds: one seed is one deterministic run (config, faults and every
random choice come from it).  A failing seed replays exactly with
``python -m tests.sim --seed S``."""

from __future__ import annotations

import multiprocessing
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field

from appliance.protocol.invariant import InvariantViolation
from appliance.protocol.quorum import Protections
from tests.sim.cluster import Cluster
from tests.sim.config import random_config
from tests.sim.world import Violation, World

RUN_AFTER_HEAL_MS = 60_000  # a run that has not finished by then is stuck
STEPS_MAX = 400_000


@dataclass
class RunResult:
    seed: int
    violation: str | None
    detail: str
    outcome: str
    summary: str
    steps: int
    sim_ms: int
    trace: list[str] = field(default_factory=list)
    repair: Counter = field(default_factory=Counter)  # BP-46 phase two in this run

    @property
    def ok(self) -> bool:
        return self.violation is None

    def report(self, disabled: tuple[str, ...] = ()) -> str:
        flags = "".join(f" --disable {d}" for d in disabled)
        lines = [f"VIOLATION seed={self.seed} [{self.violation}] {self.detail}",
                 f"  config: {self.summary}",
                 f"  after {self.steps} steps, {self.sim_ms} simulated ms",
                 "  trace (last lines):"]
        lines += [f"    {line}" for line in self.trace]
        lines.append(f"  replay: python -m tests.sim --seed {self.seed}{flags}")
        return "\n".join(lines)


def play(cfg, seed: int) -> tuple[Cluster, str | None]:
    """One run of ``cfg`` (a scenario test's variant of a seed's config) with
    every protection on: the cluster as it ended, and the name of the
    invariant the run broke (None)."""
    world = World(seed)
    cluster = Cluster(cfg, Protections(), world)
    try:
        cluster.start_random()
        world.run(until_ms=cfg.heal_at_ms + RUN_AFTER_HEAL_MS, steps_max=STEPS_MAX,
                  until=lambda: cluster.finished)
    except Violation as exc:
        return cluster, exc.name
    except InvariantViolation as exc:
        return cluster, exc.rule or "core-invariant"
    return cluster, None


def run_seed(seed: int, disabled: tuple[str, ...] = (), trace_max: int = 60,
             keep_trace: bool = False) -> RunResult:
    cfg = random_config(seed)
    world = World(seed, trace_max)
    cluster = Cluster(cfg, Protections.without(*disabled), world)
    violation, detail = None, ""
    try:
        cluster.start_random()
        world.run(until_ms=cfg.heal_at_ms + RUN_AFTER_HEAL_MS, steps_max=STEPS_MAX,
                  until=lambda: cluster.finished)
        if not cluster.finished:
            cluster._stuck(f"run not finished after {world.steps} steps")
    except Violation as exc:
        violation, detail = exc.name, exc.detail
    except InvariantViolation as exc:
        violation, detail = exc.rule or "core-invariant", str(exc)
    except Exception as exc:  # a bug in the core or the harness: report it, never hide it
        violation = "crash"
        detail = f"{type(exc).__name__}: {exc}\n" + traceback.format_exc()
    repair = Counter(peers_lost_checks=cluster.peers_lost_checks,
                     repointed_sealed=cluster.repointed_sealed)
    for bookie in cluster.bookies.values():
        repair.update(bookie.repair_stats)
    for app in [*cluster.apps, cluster.final_reader]:
        health = getattr(app, "health", None)
        if health is not None:
            repair.update(speculative_reads=health.speculative_reads,
                          quarantines=health.quarantines)
    repair.update(negative_reads_checked=cluster.checker.read_negatives_checked,
                  bookie_stalls=len(cfg.bookie_stalls))
    writer = getattr(cluster, "writer", None)
    if writer is not None:  # the delayed ensemble change: entries healed by the writer
        repair.update(healed=writer.core.healed_entries,
                      heal_runs=int(writer.core.healed_entries > 0),
                      heal_checks=cluster.checker.heal_checks)
    return RunResult(seed, violation, detail, cluster.outcome, cfg.summary(), world.steps,
                     world.now_ms, world.trace_lines() if violation or keep_trace else [],
                     repair)


def _run_one(args) -> RunResult:
    seed, disabled = args
    return run_seed(seed, disabled)


@dataclass
class Summary:
    seeds: int
    wall_s: float
    failures: list[RunResult]
    outcomes: Counter
    steps: int
    repair: Counter = field(default_factory=Counter)


def run_seeds(seeds: range | list[int], disabled: tuple[str, ...] = (), jobs: int = 1,
              stop_at_first: bool = False) -> Summary:
    """Run every seed (in ``jobs`` processes); with ``stop_at_first`` stop at
    the first violation found."""
    started = time.monotonic()
    failures: list[RunResult] = []
    outcomes: Counter = Counter()
    steps = ran = 0
    repair: Counter = Counter()
    work = [(seed, tuple(disabled)) for seed in seeds]
    if jobs <= 1:
        results = map(_run_one, work)
        pool = None
    else:
        pool = multiprocessing.get_context("fork").Pool(jobs)
        results = pool.imap_unordered(_run_one, work, chunksize=8)
    try:
        for result in results:
            ran += 1
            steps += result.steps
            repair.update(result.repair)
            outcomes[result.outcome.split(" ")[0] if result.ok else "violation"] += 1
            if not result.ok:
                failures.append(result)
                if stop_at_first:
                    break
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
    failures.sort(key=lambda r: r.seed)
    return Summary(ran, time.monotonic() - started, failures, outcomes, steps, repair)
