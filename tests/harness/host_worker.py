"""``python -m tests.harness.host_worker CMD --config PATH ...``: client
work run inside a host's network namespace by ``tests.harness.hosts``.
Prints one JSON object per line (``event`` names it), flushed at once, so
the harness sees every acknowledgement the moment it happens.

* ``write``: create a ledger (with ``--ensemble-with PREFIX``: until its
  ensemble names a bookie whose id starts with PREFIX; ``--ensemble-at-most
  PREFIX=N``, repeatable: until it names at most N of them, for each; the
  others are deleted),
  then add entries one at a time: ``created``, one ``acked`` per entry the
  appliance acknowledged, then ``closed`` (after ``--entries`` or once the
  stop file exists) or ``error`` (the first failed add: class and message;
  the worker then stops adding).
* ``read``: open a ledger (``--recovery`` fences and recovers it) and read
  every entry up to its last: ``read`` with the last entry id, the count
  and the ids whose payload is not the one ``write`` wrote.
* ``produce``: write ``--records`` records to the log ``--log`` through
  the log service, one at a time, with a producer of id ``--producer``
  (payload ``b"ID:i"``): one ``acked`` per write with its DLSN, then
  ``done``, or ``error`` (the first failed write; the worker stops).
* ``read-log``: read the log ``--log`` whole: ``log`` with its records'
  payloads and DLSNs in log order.
* Any appliance error (connecting included) is an ``error`` event, exit 0;
  anything else is a traceback on stderr and a non-zero exit.

Payload of entry e of ledger L: ``b"L:e:"`` padded with ``.`` to ``--size``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

import appliance
from appliance.errors import BKError

READ_CHUNK_ENTRIES = 1_000
ENSEMBLE_TRIES_MAX = 64


def payload(ledger_id: int, entry_id: int, size: int) -> bytes:
    return f"{ledger_id}:{entry_id}:".encode().ljust(size, b".")


def emit(event: str, **fields) -> None:
    sys.stdout.write(json.dumps({"event": event, "t": time.monotonic(), **fields}) + "\n")
    sys.stdout.flush()


def _error(exc: BaseException) -> dict:
    return {"error": type(exc).__name__, "message": str(exc)}


def _wanted(ensemble: list[str], args) -> bool:
    """``--ensemble-with P``: at least one P* bookie; each ``--ensemble-at-most
    P=N``: at most N."""
    if args.ensemble_with and not any(b.startswith(args.ensemble_with) for b in ensemble):
        return False
    for bound in args.ensemble_at_most:
        prefix, _, most = bound.partition("=")
        if sum(b.startswith(prefix) for b in ensemble) > int(most):
            return False
    return True


def _counters(bk) -> dict:
    """The client transport's counters (disconnects, timeouts...), for diagnosis."""
    return dict(bk.driver.transport.counters)


def _create(bk, args):
    for _ in range(ENSEMBLE_TRIES_MAX):
        lh = bk.create_ledger(password=args.password.encode())
        ensemble = list(bk.ledger_metadata(lh.id).ensembles[0][1])
        if _wanted(ensemble, args):
            return lh, ensemble
        lh.close()
        bk.delete_ledger(lh.id)
    raise RuntimeError(f"no ensemble as asked in {ENSEMBLE_TRIES_MAX} tries")


def write(args) -> int:
    with appliance.connect(args.config) as bk:
        lh, ensemble = _create(bk, args)
        emit("created", ledger=lh.id, ensemble=ensemble)
        for i in range(args.entries):
            if os.path.exists(args.stop_file):
                break
            try:
                entry_id = lh.add(payload(lh.id, i, args.size))
            except BKError as exc:
                emit("error", entry=i, transport=_counters(bk), **_error(exc))
                return 0
            emit("acked", entry=entry_id)
            if args.interval_ms:
                time.sleep(args.interval_ms / 1000)  # pacing, not waiting for anything
        try:
            lh.close()
        except BKError as exc:
            emit("error", entry=None, **_error(exc))
            return 0
        emit("closed", ledger=lh.id, last=lh.last_add_confirmed, transport=_counters(bk))
    return 0


def read(args) -> int:
    with appliance.connect(args.config) as bk:
        try:
            rh = bk.open_ledger(args.ledger, password=args.password.encode(),
                                recovery=args.recovery)
            last, count, bad = rh.last_add_confirmed, 0, []
            for first in range(0, last + 1, READ_CHUNK_ENTRIES):
                for e in rh.read(first, min(last, first + READ_CHUNK_ENTRIES - 1)):
                    count += 1
                    if e.payload != payload(args.ledger, e.entry_id, len(e.payload)):
                        bad.append(e.entry_id)
        except BKError as exc:
            emit("error", **_error(exc))
            return 0
        md = bk.ledger_metadata(args.ledger)
        emit("read", ledger=args.ledger, last=last, count=count, bad=bad[:100],
             state=md.state, ensembles=[[first, list(b)] for first, b in md.ensembles])
    return 0


def produce(args) -> int:
    with appliance.connect(args.config) as bk:
        producer = bk.log(args.log).producer(args.producer.encode().ljust(16, b".")[:16])
        emit("started", producer=args.producer)
        for i in range(args.records):
            if os.path.exists(args.stop_file):
                break
            try:
                dlsn = producer.write(f"{args.producer}:{i}".encode())
            except BKError as exc:
                emit("error", record=i, **_error(exc))
                return 0
            emit("acked", record=i, dlsn=list(dlsn))
        producer.close()
        emit("done", producer=args.producer)
    return 0


def read_log(args) -> int:
    with appliance.connect(args.config) as bk:
        reader = bk.log(args.log).reader()
        records = []
        try:
            while batch := reader.read(1000, timeout_s=2.0):  # [] once at the end
                records += [(bytes(rec.payload).decode(), list(rec.dlsn)) for rec in batch]
        finally:
            reader.close()
        emit("log", records=records)
    return 0


COMMANDS = {"write": write, "read": read, "produce": produce, "read-log": read_log}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        p = sub.add_parser(name)
        p.add_argument("--config", required=True)
        p.add_argument("--password", default="secret")
        p.add_argument("--stop-file", default=os.devnull + ".none")
    w = sub.choices["write"]
    w.add_argument("--entries", type=int, default=10**9)
    w.add_argument("--size", type=int, default=1024)
    w.add_argument("--interval-ms", type=float, default=0.0)
    w.add_argument("--ensemble-with", default=None)
    w.add_argument("--ensemble-at-most", action="append", default=[])
    r = sub.choices["read"]
    r.add_argument("--ledger", type=int, required=True)
    r.add_argument("--recovery", action="store_true")
    for name in ("produce", "read-log"):
        sub.choices[name].add_argument("--log", required=True)
    sub.choices["produce"].add_argument("--producer", required=True)
    sub.choices["produce"].add_argument("--records", type=int, default=10**9)
    args = parser.parse_args(argv)
    logging.basicConfig(level=os.environ.get("BK_WORKER_LOG_LEVEL", "WARNING"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return COMMANDS[args.command](args)
    except BKError as exc:  # connecting, creating: reported like a failed add
        emit("error", **_error(exc))
        return 0


if __name__ == "__main__":
    sys.exit(main())
