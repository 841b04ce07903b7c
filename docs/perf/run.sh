#!/bin/bash
# The target runs of docs/PERFORMANCE.md, one after the other (~4 minutes):
#   bash docs/perf/run.sh [OUTDIR]
# Each writes its JSON (and plots) to OUTDIR; OUTDIR/run.log has the load
# average after each.  OUTDIR defaults to a new temp dir; it may not be
# inside docs/ (results belong in a commit message or the page, not the
# tree).  Runs from the repository root whatever the current directory.
# Nothing else should run on the machine meanwhile.
set -euo pipefail
usage="usage: bash docs/perf/run.sh [OUTDIR]  (default: a new temp dir; never inside docs/)"
case "${1:-}" in -h|--help) echo "$usage"; exit 0 ;; esac
[ $# -le 1 ] || { echo "$usage" >&2; exit 2; }
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out=$(realpath -m -- "${1:-$(mktemp -d "${TMPDIR:-/tmp}/bk-perf.XXXXXX")}")
case "$out/" in "$(realpath -m -- "$root/docs")/"*)
  echo "run.sh: $out is inside docs/; name a folder outside it" >&2; exit 2 ;;
esac
mkdir -p "$out"
cd "$root"   # python -m puts the working directory first on sys.path
echo "run.sh: results in $out"
bk() { .venv/bin/python -m cli.main bench "$@"; }
log() { echo "$(date +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg) $1" >> "$out/run.log"; }
: > "$out/run.log"
log start
bk write --rate 10000 --duration-s 10 --sample-every 1 --json --plot "$out/write-rate10k.png" > "$out/r10k.json"; log r10k
bk write --rate 50000 --entries 500000 --duration-s 10 --sample-every 1 --json --plot "$out/write-rate50k.png" > "$out/r50k.json"; log r50k
bk write --entries 300000 --json > "$out/w1k.json"; log w1k
bk write --clients 4 --entries 100000 --json > "$out/w1k_4c.json"; log w1k_4c
bk write --size 65536 --entries 30000 --json > "$out/w64k.json"; log w64k
bk spark --sizes 100,1024 --entries 300000 --json > "$out/spark.json"; log spark
bk scale ledgers --points 1,100,1000,10000 --json --plot "$out/ledgers.png" > "$out/ledgers.json"; log scale
log done
echo "run.sh: done; results in $out"
