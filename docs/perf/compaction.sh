#!/bin/bash
# Add latency at 10,000 adds/s while every bookie runs a major compaction
# (docs/PERFORMANCE.md), one case after the other (~4 minutes):
#   bash docs/perf/compaction.sh [OUTDIR]
# Each case is one `bkctl bench write --compact-during` on a temporary
# appliance: 1,000 MB of 64 KiB entries over 12 ledgers, 8 deleted, then a
# 30 s open-loop run of 1 KB adds with the compaction asked 5 s into it.
# Cases: none (asked after the run ended), no limit, 64 MiB/s, the default
# (storage.compaction_rate_bytes_per_s, 16 MiB/s).  JSON per case in
# OUTDIR; OUTDIR/run.log has the load average after each.  OUTDIR defaults
# to a new temp dir, never inside docs/.  Nothing else should run meanwhile.
set -euo pipefail
usage="usage: bash docs/perf/compaction.sh [OUTDIR]  (default: a new temp dir; never inside docs/)"
case "${1:-}" in -h|--help) echo "$usage"; exit 0 ;; esac
[ $# -le 1 ] || { echo "$usage" >&2; exit 2; }
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out=$(realpath -m -- "${1:-$(mktemp -d "${TMPDIR:-/tmp}/bk-compact.XXXXXX")}")
case "$out/" in "$(realpath -m -- "$root/docs")/"*)
  echo "compaction.sh: $out is inside docs/; name a folder outside it" >&2; exit 2 ;;
esac
mkdir -p "$out"
cd "$root"   # python -m puts the working directory first on sys.path
echo "compaction.sh: results in $out"
bk() { .venv/bin/python -m cli.main bench write --rate 10000 --entries 300000 --duration-s 30 \
         --sample-every 1 --baseline-s 0 --compact-during 1000 "$@"; }
log() { echo "$(date +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg) $1" >> "$out/run.log"; }
: > "$out/run.log"
log start
bk --compact-after-s 3600 --json > "$out/none.json"; log none
bk --compact-after-s 5 --compaction-rate 0 --json > "$out/unlimited.json"; log unlimited
bk --compact-after-s 5 --compaction-rate 67108864 --json > "$out/64mib.json"; log 64mib
bk --compact-after-s 5 --json > "$out/default.json"; log default
log done
echo "compaction.sh: done; results in $out"
