"""A ledger writer in a process of its own, for tests that kill the writer:
creates a ledger (E3/W3/A2, password ``secret``), adds ``before``, prints
``LEDGER <id>``, waits for a line on stdin, then adds ``count`` entries
``payload(i)`` spread over ``spread_s`` seconds, prints ``ACKED <n>`` once
every one is acknowledged, and waits (the ledger open, its short entries
still held) until it is killed.

    python -m tests.integration.ledger_writer_proc CONFIG COUNT SPREAD_S
"""

from __future__ import annotations

import sys
import time

import appliance

PW = b"secret"
PAYLOAD_BYTES = 2_048


def payload(i: int) -> bytes:
    head = b"entry-%06d-" % i
    return head + b"p" * (PAYLOAD_BYTES - len(head))


def main(config: str, count: int, spread_s: float) -> int:
    with appliance.connect(config) as bk:
        lh = bk.create_ledger(3, 3, 2, password=PW)
        lh.add(b"before")
        print(f"LEDGER {lh.id}", flush=True)
        sys.stdin.readline()
        started = time.monotonic()
        futures = []
        for i in range(count):  # spread over the stall: the load's shape, no wait
            futures.append(lh.add_async(payload(i)))
            time.sleep(max(0.0, started + spread_s * (i + 1) / count - time.monotonic()))
        acked = [f.result(timeout=120) for f in futures]
        print(f"ACKED {len(acked)}", flush=True)
        sys.stdin.readline()  # killed here
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3])))
