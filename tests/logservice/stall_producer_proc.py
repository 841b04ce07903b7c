"""A producer process for the failover stall test (``test_failover_stall``).

    python -m tests.logservice.stall_producer_proc CONFIG LOG NAME DIR

Writes records ``NAME:i`` to log ``LOG`` with ``Producer.write`` (each
waits for its DLSN) until ``DIR/stop`` exists.  Touches ``DIR/NAME.started``
after ``STARTED_AFTER`` writes, and ``DIR/NAME.<mark>`` after its first
write that returned once ``DIR/<mark>`` existed, for each mark of
``MARKS`` in turn.  At the end writes
``DIR/NAME.out``: one JSON line ``[i, "seq/entry/slot", wall time the write
returned]`` per record.  Exit 0 only if every write returned a DLSN.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import appliance

STARTED_AFTER = 50
LOOK_EVERY = 10  # writes between looks for the stop file
MARKS = ("killed", "settled")


def main(config: str, log_name: str, name: str, folder: str) -> int:
    root = Path(folder)
    written: list[tuple[int, str, float]] = []
    marks, seen = list(MARKS), None
    with appliance.connect(config) as bk, bk.log(log_name).producer() as p:
        while True:
            i = len(written)
            dlsn = p.write(f"{name}:{i}".encode())
            written.append((i, str(dlsn), time.time()))
            if i == STARTED_AFTER:
                (root / f"{name}.started").touch()
            if seen is not None:  # this write returned after the mark existed
                (root / f"{name}.{seen}").touch()
                seen = None
            if marks and (root / marks[0]).exists():
                seen = marks.pop(0)
            if i % LOOK_EVERY == 0 and (root / "stop").exists():
                break
        print(f"{name}: {p.stats}", flush=True)  # retries, redirects, timeouts
    tmp = root / f"{name}.tmp"
    tmp.write_text("".join(json.dumps(list(w)) + "\n" for w in written))
    tmp.rename(root / f"{name}.out")
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(main(args[0], args[1], args[2], args[3]))
