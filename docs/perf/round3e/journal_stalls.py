"""10,000 adds/s for 10 s on a temporary appliance whose bookies serve
metrics; then each bookie's journal group-commit histogram
(``bookkeeper_journal_sync_latency_seconds``: how many commits took up to
5/10/25/50/100/250 ms, cumulative), to line a run's latency spikes up with
the disk's.  From the repository root:

    .venv/bin/python docs/perf/round3e/journal_stalls.py /tmp/rate10k.png
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request

sys.path.insert(0, os.getcwd())

import zmq  # noqa: E402

from appliance.bench.launcher import temporary_appliance  # noqa: E402
from appliance.config import load_config  # noqa: E402
from ipc.replies import decode_reply  # noqa: E402
from ipc.requests import InfoRequest, encode_request  # noqa: E402

BUCKETS = ("0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "+Inf")
SYNC = "bookkeeper_journal_sync_latency_seconds"


def metrics_url(ctx, endpoint: str) -> str:
    sock = ctx.socket(zmq.DEALER)
    try:
        sock.connect(endpoint)
        sock.send_multipart(encode_request(InfoRequest(request_id=1)))
        return decode_reply(sock.recv_multipart()).info["metrics_url"]
    finally:
        sock.close(0)


def main(plot: str) -> None:
    with temporary_appliance(4, None, client={"inflight_adds_max": 10_000},
                             every_bookie={"metrics_address": "127.0.0.1:0"}) as (config, _):
        bench = [sys.executable, "-m", "cli.main", "bench", "write", "--config", str(config),
                 "--rate", "10000", "--duration-s", "10", "--sample-every", "1", "--json",
                 "--plot", plot]
        result = json.loads(subprocess.run(bench, capture_output=True, text=True,
                                           check=True).stdout)
        print(f"p50 {result['p50_ms']:.2f} p99 {result['p99_ms']:.2f} "
              f"p99.9 {result['p999_ms']:.2f} ms")
        ctx = zmq.Context()
        try:
            for bookie in load_config(str(config)).bookies:
                url = metrics_url(ctx, bookie.endpoint)
                text = urllib.request.urlopen(url, timeout=10).read().decode()
                rows = re.findall(SYNC + r'_bucket\{le="([^"]+)"\} (\S+)', text)
                count = re.search(SYNC + r"_count (\S+)", text).group(1)
                print(bookie.id, "commits", count,
                      " ".join(f"<={le}s:{float(v):.0f}" for le, v in rows if le in BUCKETS))
        finally:
            ctx.term()


if __name__ == "__main__":
    main(sys.argv[1])
