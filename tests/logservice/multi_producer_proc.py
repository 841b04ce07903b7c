"""A producer process writing several logs, for the log service's tests.

    python -m tests.logservice.multi_producer_proc CONFIG LOGS NAME COUNT OUT

One producer per log of ``LOGS`` (comma-separated), all in this process: they
share its producer I/O thread and, per log server, one connection (multi-log
requests: ``appliance.logs.producer_loop``).  Writes ``COUNT`` records
``NAME:i`` to each log, round robin over the logs (on every log, even records
with ``write_async`` a few in flight, every seventh with a blocking
``write``), touches ``OUT.started`` once a tenth are stored, and at the end
writes ``OUT``: one JSON line ``[log, i, "seq/entry/slot"]`` per record, and
``OUT.mux``: the multi-log messages this process sent (JSON).  Exit 0 only if
every write returned a DLSN.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import appliance
from appliance.logs.producer_loop import ProducerLoop

WINDOW = 16  # write_async futures in flight per log


def main(config: str, logs: str, name: str, count: int, out: str) -> int:
    out_path = Path(out)
    names = logs.split(",")
    positions: dict[tuple[str, int], object] = {}
    with appliance.connect(config) as bk:
        producers = {log: bk.log(log).producer() for log in names}
        pending: dict[str, list] = {log: [] for log in names}
        try:
            for i in range(count):
                for log, p in producers.items():
                    payload = f"{name}:{i}".encode()
                    if i % 7 == 3:
                        positions[log, i] = p.write(payload)
                    else:
                        pending[log].append((i, p.write_async(payload)))
                    if len(pending[log]) >= WINDOW:
                        for j, fut in pending[log]:
                            positions[log, j] = fut.result(timeout=120)
                        pending[log].clear()
                if i == count // 10:
                    out_path.with_suffix(".started").touch()
            for log, p in producers.items():
                p.flush()
                for j, fut in pending[log]:
                    positions[log, j] = fut.result(timeout=120)
        finally:
            for log, p in producers.items():
                p.close()
                print(f"{name} {log}: {p.stats}", flush=True)  # retries, redirects, timeouts
    out_path.with_suffix(".mux").write_text(json.dumps(ProducerLoop.get().snapshot()))
    tmp = out_path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps([log, i, str(positions[log, i])]) + "\n"
                           for log in names for i in range(count)))
    tmp.rename(out_path)
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(main(args[0], args[1], args[2], int(args[3]), args[4]))
