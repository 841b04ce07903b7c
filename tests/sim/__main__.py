"""``python -m tests.sim --seeds N [--seed S] [--disable PROTECTION]``

Exit 0 when no invariant was violated, 1 otherwise (printing each failing
seed, its configuration and the trace leading to the violation).
"""

from __future__ import annotations

import argparse
import os
import sys

from appliance.protocol.quorum import PROTECTION_NAMES
from tests.sim.runner import run_seed, run_seeds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.sim", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=100, help="how many seeds to run")
    parser.add_argument("--first", type=int, default=0, help="first seed (default 0)")
    parser.add_argument("--seed", type=int, help="run this one seed and print its trace")
    parser.add_argument("--disable", action="append", default=[], choices=PROTECTION_NAMES,
                        help="switch a protection off (the checker should then fail)")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                        help="worker processes")
    parser.add_argument("--stop-at-first", action="store_true",
                        help="stop at the first violation")
    parser.add_argument("--trace", action="store_true", help="with --seed: print the trace "
                        "even when no invariant failed")
    parser.add_argument("--show", type=int, default=3, help="failing seeds to print in full")
    args = parser.parse_args(argv)
    disabled = tuple(args.disable)

    if args.seed is not None:
        result = run_seed(args.seed, disabled, trace_max=100_000 if args.trace else 400,
                          keep_trace=args.trace)
        if result.ok:
            print("\n".join(result.trace))
            print(f"seed {args.seed}: ok ({result.outcome}); {result.summary}; "
                  f"{result.steps} steps, {result.sim_ms} simulated ms")
            return 0
        print(result.report(disabled))
        return 1

    summary = run_seeds(range(args.first, args.first + args.seeds), disabled, args.jobs,
                        args.stop_at_first)
    rate = summary.seeds / summary.wall_s if summary.wall_s else 0.0
    outcomes = ", ".join(f"{k}={v}" for k, v in sorted(summary.outcomes.items()))
    print(f"ran {summary.seeds} seeds in {summary.wall_s:.1f}s ({rate:.0f} seeds/s, "
          f"{summary.steps} steps) with {args.jobs} job(s)"
          + (f", protections off: {', '.join(disabled)}" if disabled else "")
          + f": {len(summary.failures)} violation(s); outcomes: {outcomes}")
    r = summary.repair
    print(f"BP-46 repair: {r['started']} repairs started, {r['copied']} entries copied, "
          f"{r['cleared']} limbo cleared, {r['peers_lost_checks']} repaired bookies read "
          "alone (peers lost)")
    print(f"re-replication under a writing writer: {r['repointed_sealed']} sealed fragments "
          "re-pointed")
    print(f"reads around stalls: {r['bookie_stalls']} bookie stalls, {r['speculative_reads']} "
          f"speculative reads, {r['quarantines']} bookies quarantined, "
          f"{r['negative_reads_checked']} negative reads checked (each backed by every replica)")
    print(f"delayed ensemble change: {r['healed']} short entries healed by the writer in "
          f"{r['heal_runs']} runs; {r['heal_checks']} writer closes checked (short-healed)")
    print(f"scrub: {r['scrubbed']} closed ledgers found short on a bookie and repaired; "
          f"every closed ledger's share checked at the end (short-scrubbed)")
    for result in summary.failures[:args.show]:
        print(result.report(disabled))
    if len(summary.failures) > args.show:
        print("other failing seeds:", " ".join(str(r.seed) for r in summary.failures[args.show:]))
    return 1 if summary.failures else 0


if __name__ == "__main__":
    sys.exit(main())
