"""Wire round-trip benchmark: single 1 KB ADDs vs ADD_BATCH, over ipc://.

Starts ``python -m ipc.memserver`` in a subprocess (an in-memory bookie: no
disk, so this measures the wire, the codec and the Python loops on both
sides only), drives it through ``ipc.client.Transport`` with a bounded
window of requests in flight, and prints one JSON document::

    python -m ipc.bench [--seconds 3] [--entry-bytes 1024] [--batch 64]

Numbers are noisy on a shared machine: compare rows of one run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from appliance.protocol.errors import OK
from ipc.client import Transport
from ipc.requests import AddBatchRequest, AddItem, AddRequest

KEY = bytes(32)
ENTRY_IDS_MAX = 4096  # entry ids wrap: the in-memory bookie overwrites, memory stays bounded


def _start_server(endpoint: str, defer_acks: bool) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "ipc.memserver", "--endpoint", endpoint]
    if defer_acks:
        cmd.append("--defer-acks")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line.startswith("READY"):
        proc.kill()
        raise RuntimeError(f"memserver did not start: {line!r}")
    return proc


def _run(transport: Transport, make_request, entries_per_msg: int, window: int,
         seconds: float) -> dict:
    """Keep ``window`` requests in flight for ``seconds``; count completions."""
    sent = done = 0
    deadline = time.monotonic() + seconds
    start = time.monotonic()
    while True:
        now = time.monotonic()
        while now < deadline and sent - done < window:
            transport.send("b", make_request(sent), 10000)
            sent += 1
        if done == sent:
            break
        for event in transport.next_events(10000):
            if event.status != OK:
                raise RuntimeError(f"request failed with code {event.status}")
            done += 1
    elapsed = time.monotonic() - start
    return {"messages": done, "seconds": round(elapsed, 3),
            "msgs_per_s": round(done / elapsed), "entries_per_s":
            round(done * entries_per_msg / elapsed), "window": window}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--entry-bytes", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--defer-acks", action="store_true",
                        help="server acks via the deferred (durability fd) path")
    args = parser.parse_args(argv)
    payload = bytes(args.entry_bytes)

    def single(i: int) -> AddRequest:
        return AddRequest(1, i % ENTRY_IDS_MAX, KEY, payload)

    def batch(i: int) -> AddBatchRequest:
        base = (i * args.batch) % ENTRY_IDS_MAX
        return AddBatchRequest([AddItem(2, base + k, KEY, payload) for k in range(args.batch)])

    with tempfile.TemporaryDirectory(prefix="bkbench") as tmp:
        endpoint = f"ipc://{Path(tmp) / 'b.sock'}"
        proc = _start_server(endpoint, args.defer_acks)
        try:
            with Transport(inflight_per_bookie_max=1024) as transport:
                transport.add_bookie("b", endpoint)
                results = {
                    "single_add_window_1": _run(transport, single, 1, 1, args.seconds),
                    "single_add_window_64": _run(transport, single, 1, 64, args.seconds),
                    f"add_batch_{args.batch}_window_8": _run(transport, batch, args.batch, 8,
                                                             args.seconds),
                }
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    print(json.dumps({"entry_bytes": args.entry_bytes, "defer_acks": args.defer_acks,
                      "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
