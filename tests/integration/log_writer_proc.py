"""A log writer in a process of its own, for the chaos test: writes records
``<tag>-<i>`` as fast as they are acknowledged (at most ``window`` in
flight) and prints ``ACK <dlsn> <payload>`` for each acknowledged one, then
``FENCED`` / ``ERROR`` if its writer fails.  Killed with SIGKILL by the test;
SIGTERM closes the writer cleanly.

    python -m tests.integration.log_writer_proc CONFIG LOG TAG
"""

from __future__ import annotations

import signal
import sys
import threading

import appliance
from appliance.errors import LogFencedError

WINDOW = 50


def main(config: str, name: str, tag: str) -> int:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    out = sys.stdout
    lock = threading.Lock()

    def acked(payload: bytes):
        def done(fut):
            if fut.exception() is None:
                with lock:
                    out.write(f"ACK {fut.result()} {payload.decode()}\n")
                    out.flush()
        return done

    with appliance.connect(config) as bk:
        w = bk.log(name).writer()
        print("OPEN", flush=True)
        pending: list = []
        i = 0
        try:
            while not stop.is_set():
                payload = f"{tag}-{i}".encode()
                fut = w.write_async(payload)
                fut.add_done_callback(acked(payload))
                pending.append(fut)
                i += 1
                if len(pending) >= WINDOW:
                    pending.pop(0).result(timeout=120)
            w.close()
        except LogFencedError:
            print("FENCED", flush=True)
            return 3
        except Exception as exc:  # noqa: BLE001 - reported to the test
            print(f"ERROR {type(exc).__name__}: {exc}", flush=True)
            return 4
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
