"""A producer process for the log service's tests.

    python -m tests.logservice.producer_proc CONFIG LOG NAME COUNT OUT [PRODUCER_ID]

With a PRODUCER_ID, record i is written with sequence number i + 1: a run
started again with the same id writes everything again, and what an earlier
run stored is answered, not stored twice.

Writes ``COUNT`` records ``NAME:i`` to log ``LOG`` (even records with
``write``, odd ones with ``write_async``, a few in flight), touches
``OUT.started`` once a tenth are stored, and at the end writes ``OUT``: one
JSON line ``[i, "seq/entry/slot"]`` per record.  Exit 0 only if every write
returned a DLSN.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import appliance

WINDOW = 8  # write_async futures in flight


def main(config: str, log_name: str, name: str, count: int, out: str,
         producer_id: str | None = None) -> int:
    out_path = Path(out)
    positions: dict[int, object] = {}
    with appliance.connect(config) as bk:
        with bk.log(log_name).producer(producer_id) as p:
            pending = []
            for i in range(count):
                payload = f"{name}:{i}".encode()
                seq = i + 1 if producer_id else None
                if i % 2 == 0:
                    positions[i] = p.write(payload, seq)
                else:
                    pending.append((i, p.write_async(payload, seq)))
                if len(pending) >= WINDOW:
                    for j, fut in pending:
                        positions[j] = fut.result(timeout=120)
                    pending.clear()
                if i == count // 10:
                    out_path.with_suffix(".started").touch()
            p.flush()
            for j, fut in pending:
                positions[j] = fut.result(timeout=120)
            print(f"{name}: {p.stats}", flush=True)  # retries, redirects, timeouts
    tmp = out_path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps([i, str(positions[i])]) + "\n" for i in range(count)))
    tmp.rename(out_path)
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(main(args[0], args[1], args[2], int(args[3]), args[4], *args[5:]))
