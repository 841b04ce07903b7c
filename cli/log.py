"""bkctl log: list, describe, append to, read (and follow), truncate and
delete logs (seed 003; docs/LOGS.md).  A few lines each over the client
binding's ``bk.log``."""

from __future__ import annotations

import base64
import json
import signal
import sys

import click

from appliance.errors import BKError
from cli.common import (
    PayloadLines,
    config_option,
    echo_json,
    is_terminal,
    json_option,
    library_errors,
    list_command,
    password_options,
)

APPEND_WINDOW = 10_000  # records written before their positions are awaited


def _connect(config_path: str):
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    import appliance

    return appliance.connect(config_path)


def _password(f):
    return password_options("The log's password (every writer and reader gives the same; "
                            "default: none).")(f)


def _dlsn(ctx, param, value):
    if value is None:
        return None
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance import DLSN

    try:
        return DLSN.parse(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None


@click.group(short_help="Named logs: many producers or one writer, tailing readers.")
def log():
    """Named logs: streams of records on ledgers (docs/LOGS.md).  Any number
    of producers, in any processes, write a log at once through the log
    service (the log servers `bkctl up` starts, `[log] servers`); an
    exclusive writer fences any other.  Readers start at a position or a
    txid and tail the end.

    
    Example:
      seq 1 1000 | bkctl log append orders -
      bkctl log read orders --from-txid 998
    """


def _log_names(config_path: str) -> list[str]:
    with _connect(config_path) as bk:
        return bk.list_logs()


list_ = list_command(log, "log names", _log_names)


@log.command(short_help="Show a log's segments.")
@click.argument("name")
@json_option
@config_option
@library_errors
def describe(name, as_json, config_path):
    """Show a log's segments: sequence number, ledger id, state, tier (hot:
    on the bookies, cold: in cold storage, with its file), first/last txid,
    last DLSN and records, and the log server that owns the log now
    (`log_server`; null when no log server writes it).  The header's
    records and last txid are what readers see now, the open segment's
    confirmed records included (--json: `readable`, `last_txid`; `records`
    and `completed_last_txid`: the completed segments' alone).

    \b
    Example:
      bkctl log describe orders --json
    """
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.logs.log import describe as describe_log

    with _connect(config_path) as bk:
        md = bk.logs.read_log(name)[0]
        doc = describe_log(md)
        handle = bk.log(name)
        doc["log_server"] = handle.log_server()
        for seg, out in zip(md.segments, doc["segments"], strict=True):
            if seg.state != "COMPLETED" and out.get("tier", "hot") == "hot":
                out["confirmed"] = _confirmed_tail(handle, seg)
    _add_readable(doc)
    if as_json:
        echo_json(doc)
        return
    click.echo(f"log {doc['name']}: {len(doc['segments'])} segment(s), "
               f"{doc['readable']} record(s) readable ({doc['records']} in completed "
               f"segments), last txid "
               f"{doc['last_txid']}, writer epoch {doc['epoch']} ({doc['owner'] or 'none'}), "
               f"truncated before {doc['truncated_before']}, log server "
               f"{doc['log_server'] or 'none'}")
    for s in doc["segments"]:
        cold = f" cold {s['cold']['uri']}" if s.get("cold") else ""
        seen = s.get("confirmed")
        if seen and "error" in seen:
            click.echo(f"  segment {s['seq']}: ledger {s['ledger_id']} {s['state']:<11} "
                       f"{s['tier']:<4} records unknown now ({seen['error']})")
            continue
        if seen:  # an open segment: what readers see now
            click.echo(f"  segment {s['seq']}: ledger {s['ledger_id']} {s['state']:<11} "
                       f"{s['tier']:<4} records {seen['records']:<8} (confirmed so far) "
                       f"last txid {seen['last_txid']} last {seen['last_dlsn']}")
            continue
        click.echo(f"  segment {s['seq']}: ledger {s['ledger_id']} {s['state']:<11} "
                   f"{s['tier']:<4} records {s['records']:<8} "
                   f"txids {s['first_txid']}..{s['last_txid']} last {s['last_dlsn']}{cold}")


def _add_readable(doc: dict) -> None:
    """What readers see now, open segments' confirmed records included:
    ``readable`` (records) and ``last_txid`` (the last readable record's;
    ``completed_last_txid`` keeps the completed segments' alone)."""
    tails = [s["confirmed"] for s in doc["segments"] if "records" in (s.get("confirmed") or {})]
    doc["readable"] = doc["records"] + sum(t["records"] for t in tails)
    txids = [t for t in (doc["last_txid"], *(t["last_txid"] for t in tails)) if t is not None]
    doc["completed_last_txid"] = doc["last_txid"]
    doc["last_txid"] = max(txids, default=None)


def _confirmed_tail(handle, seg) -> dict | None:
    """The open segment's confirmed records, or None when its ledger cannot
    be read now (no bookie answers, another password): describe still works."""
    try:
        return handle.confirmed_tail(seg)
    except BKError as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


@log.command(short_help="Write the lines of a file to a log.")
@click.argument("name")
@click.argument("file", type=click.File("rb"))
@click.option("--txid-from", type=int, default=None,
              help="The first record's txid (the next ones count up from it); default: "
                   "the log's last txid + 1.")
@_password
@config_option
@library_errors
def append(name, file, txid_from, password, config_path):
    """Write each line of FILE ('-' for stdin) as a record of log NAME
    (created if needed) and print the last record's DLSN.

    While the log service runs (log servers registered), the lines go
    through it as one producer: writers and producers of the log go on
    undisturbed.  Otherwise, and with --txid-from or a password, the log's
    exclusive writer is used (any other writer of the log is fenced).

    \b
    Example:
      seq 1 1000 | bkctl log append orders -
      bkctl log append orders events.txt --txid-from 5000
    """
    with _connect(config_path) as bk:
        handle = bk.log(name, password.encode())
        if txid_from is None and not password and handle.service_running():
            with handle.producer() as p:
                last, count = _write_lines(file, lambda line, _txid: p.write_async(line), None,
                                           p.flush)
        else:
            with handle.writer() as w:
                last, count = _write_lines(file, w.write_async, txid_from, w.flush)
    if last is None:
        click.echo("no records written", err=True)
        return
    click.echo(str(last))
    click.echo(f"{count} record(s) written to log {name}", err=True)


def _write_lines(file, write_async, txid, flush):
    """Every line as a record, at most APPEND_WINDOW awaited at once; (the
    last DLSN, records written)."""
    pending, last, count = [], None, 0
    for line in file:
        pending.append(write_async(line.rstrip(b"\n"), txid))
        txid = None if txid is None else txid + 1
        count += 1
        if len(pending) >= APPEND_WINDOW:
            last = pending[-1].result()
            pending.clear()
    flush()
    if pending:
        last = pending[-1].result()
    return last, count


@log.command(short_help="Print a log's records.")
@click.argument("name")
@click.option("--from", "start", callback=_dlsn, default=None, metavar="DLSN",
              help="Start at this position (seq/entry/slot, as printed by append).")
@click.option("--from-txid", type=int, default=None,
              help="Start at the first record whose txid is >= this.")
@click.option("--follow", "-f", is_flag=True,
              help="Keep waiting for new records until Ctrl-C; a log that does not exist "
                   "yet is waited for (like tail -F).")
@_password
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object per record, one a line: dlsn, txid, payload "
                   "(base64).")
@config_option
@library_errors
def read(name, start, from_txid, follow, password, as_json, config_path):
    """Print the records of log NAME, one per line. With --json, each line is
    one JSON object per record: {"dlsn": "3/17/0", "txid": 5000,
    "payload": base64}; lines, not one document, so that --follow prints
    each record as it comes. To a pipe or a file the payloads are written
    as they are; on a terminal, a payload that is not printable text is
    shown escaped (\\x00) and --json gives its exact bytes.

    With --follow, a log that does not exist yet is waited for (said once
    on stderr) and read from its first record once it is created, like
    tail -F; without it, a missing log is an error. Bookies out of reach
    for a while (one down, one restarting) are said once on stderr and
    read again from the same position: no record is skipped or repeated.

    \b
    Example:
      bkctl log read orders
      bkctl log read orders --from 3/17/0 --json
      bkctl log read orders --from-txid 5000 --follow
      bkctl log read not-yet-written --follow
    """
    if start is not None and from_txid is not None:
        raise click.UsageError("give --from or --from-txid, not both")
    out, lines = sys.stdout.buffer, PayloadLines(is_terminal())
    stop = []
    if follow:  # Ctrl-C / SIGTERM end the tail cleanly, after the records printed
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.append(True))
    with _connect(config_path) as bk:
        with bk.log(name, password.encode()).reader(start=start, start_txid=from_txid,
                                                    wait_for_log=follow) as r:
            if r.waiting_for_log:
                click.echo(f"log {name} does not exist yet: waiting for it (Ctrl-C to stop)",
                           err=True)
            outage: list = []  # following: bookies out of reach (said once)
            while not stop:
                records = _read_some(r, follow, outage)
                for rec in records:
                    out.write(_json_record(rec) if as_json else lines.line(rec.payload))
                out.flush()
                if not records and not follow:
                    break


def _read_some(r, follow: bool, outage: list) -> list:
    """The reader's next records (none waited for unless ``follow``).
    Following, bookies out of reach (a retryable error) are said once on
    stderr, while ``outage`` holds it, and the next call reads again from
    the reader's position; any other error ends the command."""
    try:
        records = r.read(max_records=1000, timeout_s=0.2 if follow else 0)
    except BKError as exc:
        if not (follow and exc.retryable):
            raise
        if not outage:
            click.echo(f"{type(exc).__name__}: {exc} (following on: trying again)", err=True)
            outage.append(exc)
        return []
    outage.clear()
    return records


def _json_record(rec) -> bytes:
    """One line of ``log read --json`` (CONTRACT: one object per record:
    dlsn, txid, payload base64)."""
    doc = {"dlsn": str(rec.dlsn), "txid": rec.txid,
           "payload": base64.b64encode(rec.payload).decode()}
    return json.dumps(doc, sort_keys=True).encode() + b"\n"


@log.command(short_help="Drop a log's segments before a position.")
@click.argument("name")
@click.option("--before", callback=_dlsn, required=True, metavar="DLSN",
              help="Drop the records before this position (whole segments: the segment "
                   "holding it stays).")
@_password
@config_option
@library_errors
def truncate(name, before, password, config_path):
    """Drop the whole segments of log NAME before DLSN and delete their
    ledgers.

    \b
    Example:
      bkctl log truncate orders --before 12/0/0
    """
    with _connect(config_path) as bk:
        dropped = bk.log(name, password.encode()).truncate(before)
    click.echo(f"{len(dropped)} segment(s) dropped" +
               (f": {', '.join(map(str, dropped))}" if dropped else ""))


@log.command(short_help="Move a log's sealed segments to cold storage now.")
@click.argument("name")
@click.option("--before", callback=_dlsn, default=None, metavar="DLSN",
              help="Move only the sealed segments whose records are all before this "
                   "position (default: every sealed segment).")
@_password
@json_option
@config_option
@library_errors
def offload(name, before, password, as_json, config_path):
    """Move every sealed segment of log NAME (before DLSN) to cold storage
    ([cold_storage] uri) now, print how many moved; also deletes the ledgers
    of segments moved delete_after_ms ago and orphan files.

    \b
    Example:
      bkctl log offload orders
      bkctl log offload orders --before 12/0/0 --json
    """
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.cold.mover import offloader

    with _connect(config_path) as bk:
        mover = offloader(bk, password.encode())
        result = mover.offload(name, before)
    if as_json:
        echo_json(result.to_json())
        return
    click.echo(f"{len(result.moved)} segment(s) moved to cold storage" +
               (f": {', '.join(map(str, result.moved))}" if result.moved else "") +
               f" ({result.bytes_moved} bytes); {len(result.ledgers_deleted)} ledger(s) "
               f"deleted, {len(result.orphans_removed)} orphan file(s) removed")


@log.command(short_help="Delete a log and its segments.")
@click.argument("name")
@_password
@config_option
@library_errors
def delete(name, password, config_path):
    """Delete log NAME: its writer is fenced, its segments' ledgers and its
    metadata removed.

    \b
    Example:
      bkctl log delete orders
    """
    with _connect(config_path) as bk:
        bk.delete_log(name, password.encode())
    click.echo(f"log {name} deleted")
