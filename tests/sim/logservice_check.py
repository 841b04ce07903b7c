"""The log service simulation's checker (``tests/sim/logservicesim``): the
invariants read from the simulated logs (the entries the ledgers stored,
in order) and from what each producer's application was told (its
``Settle`` / ``Fail`` actions), once the run ended."""

from __future__ import annotations

from collections import Counter

from tests.sim.logservice_model import END_MS


def check(world) -> str | None:
    """The first invariant broken, or None."""
    for state in world.logs.values():
        seen = Counter(state.records)
        twice = [rec for rec, n in seen.items() if n > 1]
        if twice:
            pid, seq = twice[0]
            return f"stored-once: {len(twice)} records stored twice in {state.name}, " \
                f"e.g. seq {seq} of {pid[:1]}"
    for p in world.producers:
        problem = _check_producer(world, p)
        if problem:
            return problem
    return None


def _check_producer(world, p) -> str | None:
    records = world.logs[p.log].records
    mine = [seq for pid, seq in records if pid == p.pid]
    if mine != sorted(mine):
        return f"producer-order: {p.name}'s records in the log: {mine[:20]}"
    if any(pid == p.pid for q in world.logs.values() if q.name != p.log
           for pid, _ in q.records):
        return f"acked-kept: {p.name}'s records in another log"
    entries = world.logs[p.log].entries
    for seq, dlsn in p.settled.items():
        if dlsn is None:
            if (p.pid, seq) not in records:
                return f"acked-kept: {p.name} seq {seq} acknowledged, not in the log"
            continue
        _, entry, slot = dlsn
        if entry >= len(entries) or slot >= len(entries[entry]) or \
                entries[entry][slot] != (p.pid, seq):
            return f"acked-kept: {p.name} seq {seq} acknowledged at {tuple(dlsn)}, not there"
    if p.failed:
        seq, error = next(iter(p.failed.items()))
        return f"liveness: {p.name} write {seq} failed: {error}"
    if p.written < world.cfg.records or p.unsettled():
        return f"liveness: {p.name} did not finish by {END_MS} ms " \
            f"({len(p.settled)} of {world.cfg.records} settled)"
    return None
