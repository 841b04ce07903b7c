#!/bin/bash
# The round-3 target runs, one after the other, from the repository root:
#   bash docs/perf/round3c/run.sh [OUTDIR]
# Each writes its JSON (and plots) to OUTDIR; run.log has the load average
# before each.  Nothing else should run on the machine meanwhile.
set -euo pipefail
out=${1:-docs/perf/round3c}
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
