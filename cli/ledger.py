"""bkctl ledger: create, append, read, list, inspect and delete ledgers.

Each command is a few lines over the Python client binding
(``appliance.connect``); library errors become one line on stderr and a
non-zero exit (``cli.common.library_errors``).
"""

from __future__ import annotations

import base64
import contextlib
import json
import sys

import click

from appliance.errors import BKError, UnauthorizedError
from cli.common import (
    PayloadLines,
    config_option,
    echo_json,
    echo_list,
    is_terminal,
    json_option,
    library_errors,
    password_options,
)

READ_CHUNK_ENTRIES = 1024  # entries fetched per read call while streaming a ledger


def _connect(config_path: str):
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    import appliance

    return appliance.connect(config_path)


def quorum_options(f):
    f = click.option("-a", "--ack-quorum", default=2, show_default=True,
                     help="Bookies that must acknowledge each entry.")(f)
    f = click.option("-w", "--write-quorum", default=3, show_default=True,
                     help="Bookies each entry is written to.")(f)
    f = click.option("-e", "--ensemble", default=3, show_default=True,
                     help="Bookies the ledger is striped over.")(f)
    return f


def password_option(f):
    return password_options("Ledger password (default: none).")(f)


def _progress(length: int | None, label: str):
    """A progress bar on stderr when it is a terminal; otherwise nothing."""
    if not sys.stderr.isatty():
        return contextlib.nullcontext(None)
    return click.progressbar(length=length, label=label, file=sys.stderr)


@click.group(short_help="Create, read, inspect and delete ledgers.")
def ledger():
    """Create, append to, read, list, inspect and delete ledgers."""


@ledger.command()
@quorum_options
@password_option
@click.option("--digest", type=click.Choice(["crc32c", "hmac-sha256"]), default="crc32c",
              show_default=True, help="Entry digest.")
@config_option
@library_errors
def create(ensemble, write_quorum, ack_quorum, password, digest, config_path):
    """Create an empty ledger and print its id.

    \b
    Example:
      bkctl ledger create -e 3 -w 3 -a 2 --password secret
    """
    with _connect(config_path) as bk:
        lh = bk.create_ledger(ensemble=ensemble, write_quorum=write_quorum,
                              ack_quorum=ack_quorum, password=password.encode(), digest=digest)
        click.echo(lh.id)


@ledger.command(short_help="Write the lines of a file as a new ledger.")
@quorum_options
@password_option
@click.argument("file", type=click.File("rb"))
@config_option
@library_errors
def append(ensemble, write_quorum, ack_quorum, password, file, config_path):
    """Write each line of FILE ('-' for stdin) as an entry of a new ledger,
    close the ledger and print its id.

    \b
    Example:
      bkctl ledger append -e 3 -w 3 -a 2 access.log
      seq 1 1000 | bkctl ledger append -
    """
    with _connect(config_path) as bk:
        lh = bk.create_ledger(ensemble=ensemble, write_quorum=write_quorum,
                              ack_quorum=ack_quorum, password=password.encode())
        pending = []
        with _progress(None, f"ledger {lh.id}") as bar:
            for line in file:
                pending.append(lh.add_async(line.rstrip(b"\n")))
                if len(pending) >= READ_CHUNK_ENTRIES:
                    _wait_all(pending, bar)
            _wait_all(pending, bar)
        lh.close()
        click.echo(lh.id)


def _wait_all(futures: list, bar) -> None:
    for fut in futures:
        fut.result()
    if bar is not None:
        bar.update(len(futures))
    futures.clear()


@ledger.command(short_help="Print a ledger's entries.")
@click.argument("ledger_id", type=int)
@click.option("--first", type=int, default=0, show_default=True, help="First entry id.")
@click.option("--last", type=int, default=None,
              help="Last entry id (default: the last entry; of an open ledger, the last "
                   "add confirmed).")
@password_option
@click.option("--recover", is_flag=True,
              help="Fence and recover an open ledger first, then read it to its end: its "
                   "writer can add no more (for a writer that died).")
@click.option("--no-recovery", is_flag=True, hidden=True,
              help="Accepted for old scripts; reading without recovery is the default.")
@json_option
@config_option
@library_errors
def read(ledger_id, first, last, password, recover, no_recovery, as_json, config_path):
    """Print the entries of a ledger, one per line (--json: a JSON array with
    one object per entry, payload base64). To a pipe or a file the payloads
    are written as they are; on a terminal, a payload that is not printable
    text is shown escaped (\\x00) and --json gives its exact bytes.

    An open ledger is read up to its last add confirmed, and its writer
    keeps writing undisturbed. With --recover an open ledger is fenced and
    closed first, so its writer can add no more; use it for a ledger whose
    writer died.

    \b
    Example:
      bkctl ledger read 7 --first 0 --last 99
      bkctl ledger read 7 --json
      bkctl ledger read 7 --recover
    """
    del no_recovery  # the default now: kept so that old scripts still run
    with _connect(config_path) as bk:
        rh = bk.open_ledger(ledger_id, password=password.encode(), recovery=recover)
        last = _last_to_read(rh, ledger_id, last)
        out, lines = sys.stdout.buffer, PayloadLines(is_terminal())
        if as_json:
            out.write(b"[")
        count = 0
        with _progress(max(last - first + 1, 0), f"ledger {ledger_id}") as bar:
            for start in range(first, last + 1, READ_CHUNK_ENTRIES):
                end = min(start + READ_CHUNK_ENTRIES - 1, last)
                for e in rh.read(start, end):
                    out.write(_json_entry(e, count) if as_json else lines.line(e.payload))
                    count += 1
                if bar is not None:
                    bar.update(end - start + 1)
        if as_json:
            out.write(b"\n]\n")
        out.flush()


def _last_to_read(rh, ledger_id: int, last: int | None) -> int:
    """``--last``, or the ledger's last readable entry; one clear line for
    a ``--last`` past it."""
    readable = rh.last_add_confirmed
    if last is None:
        return readable
    if last > readable:
        what = (f"ends at entry {readable}" if rh.metadata.state == "CLOSED" else
                f"is open: its last add confirmed is {readable} (--recover reads it to its "
                f"end, and stops its writer)")
        raise click.ClickException(f"--last {last}: ledger {ledger_id} {what}")
    return last


def _json_entry(e, index: int) -> bytes:
    doc = {"ledger_id": e.ledger_id, "entry_id": e.entry_id,
           "payload": base64.b64encode(bytes(e.payload)).decode()}
    return (b"\n" if index == 0 else b",\n") + json.dumps(doc, sort_keys=True).encode()


@ledger.command(name="list", short_help="List ledger ids (--all: log segments too).")
@click.option("--all", "show_all", is_flag=True,
              help="Also list the ledgers that hold log segments, each marked with its log.")
@json_option
@config_option
@library_errors
def list_(show_all, as_json, config_path):
    """List ledger ids, one per line (--json: a JSON list of ids). The
    ledgers that hold the segments of logs (bkctl log) are left out.

    With --all they are listed too, each followed by its log and segment
    number (--json: a list of objects: ledger_id, log, segment; log and
    segment are null for a ledger that is not a log's).

    \b
    Example:
      bkctl ledger list --json
      bkctl ledger list --all
    """
    with _connect(config_path) as bk:
        ids = bk.list_ledgers()
        segments = bk.logs.segment_ledgers()
    if not show_all:
        echo_list([i for i in ids if i not in segments], as_json)
    elif as_json:
        echo_json([_listed(i, segments.get(i)) for i in ids])
    else:
        for i in ids:
            log_name, seq = segments.get(i, (None, None))
            click.echo(i if log_name is None else f"{i}  (log {log_name}, segment {seq})")


def _listed(ledger_id: int, segment: tuple[str, int] | None) -> dict:
    log_name, seq = segment if segment is not None else (None, None)
    return {"ledger_id": ledger_id, "log": log_name, "segment": seq}


@ledger.command(short_help="Show a ledger's metadata and ensembles.")
@click.argument("ledger_id", type=int)
@password_options("The ledger's password: an open ledger's last add confirmed is read from "
                  "its bookies with it (default: none).")
@json_option
@config_option
@library_errors
def meta(ledger_id, password, as_json, config_path):
    """Show a ledger's state, last entry, quorums and ensembles, with each
    fragment's hosts (as live bookies publish them; a bookie not up counts
    as its own host) and whether every write set is on distinct hosts (on
    an appliance of one host, said once).

    An open ledger has no last entry yet (-1): its last add confirmed (the
    last entry a reader can see now) is read from its bookies, without
    disturbing its writer; a ledger with a password needs it for that.

    \b
    Example:
      bkctl ledger meta 7 --json
      bkctl ledger meta 7 --password-file pw.txt
    """
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.protocol.placement import location_of, meets_rule

    with _connect(config_path) as bk:
        md = bk.ledger_metadata(ledger_id)
        where = bk.driver.locations
        lac, lac_note = md.last_entry_id, ""
        if md.state != "CLOSED":
            try:
                with bk.open_ledger(ledger_id, password=password.encode(),
                                    recovery=False) as rh:
                    lac = rh.last_add_confirmed
            except UnauthorizedError:
                lac = None
                lac_note = ("unknown (wrong password)" if password else
                            "unknown: give the ledger's password (--password-file, "
                            "$BKCTL_PASSWORD or --ask-password)")
            except BKError as exc:  # the metadata is still worth showing
                lac, lac_note = None, f"unknown (its bookies: {type(exc).__name__})"
    placement = [{"first_entry_id": first,
                  "hosts": [location_of(b, where).host for b in bookies],
                  "write_sets_on_distinct_hosts": meets_rule(bookies, md.write_quorum, where)}
                 for first, bookies in md.ensembles]
    doc = {
        "ledger_id": ledger_id,
        "state": md.state,
        "last_entry_id": md.last_entry_id,
        "last_add_confirmed": lac,
        "ensemble_size": md.ensemble_size,
        "write_quorum": md.write_quorum,
        "ack_quorum": md.ack_quorum,
        "ensembles": [[first, list(bookies)] for first, bookies in md.ensembles],
        "placement": placement,
    }
    if as_json:
        echo_json(doc)
        return
    click.echo(f"ledger {ledger_id}: {md.state}, last entry {md.last_entry_id}, "
               f"last add confirmed {lac_note or lac}, "
               f"E{md.ensemble_size}/W{md.write_quorum}/A{md.ack_quorum}")
    live_hosts = {loc.host for loc in where.values()} if where else set()
    one_host = len(live_hosts) == 1 and all(set(p["hosts"]) <= live_hosts for p in placement)
    if one_host:
        click.echo(f"  one host ({next(iter(live_hosts))}): write sets cannot be spread "
                   "over hosts")
    for (first, bookies), place in zip(md.ensembles, placement, strict=True):
        if one_host:
            click.echo(f"  from entry {first}: {', '.join(bookies)}")
            continue
        spread = "distinct" if place["write_sets_on_distinct_hosts"] else "SHARED"
        click.echo(f"  from entry {first}: {', '.join(bookies)}  (hosts: "
                   f"{', '.join(place['hosts'])}; write sets on {spread} hosts)")


@ledger.command(short_help="Delete a ledger.")
@click.argument("ledger_id", type=int)
@password_options("The ledger's password: checked before deleting (wrong: refused).")
@click.option("--force", is_flag=True,
              help="Delete a password-protected ledger without its password: the override "
                   "of the account that owns the metadata (logged).")
@config_option
@library_errors
def delete(ledger_id, password, force, config_path):
    """Delete a ledger (its metadata now; bookies reclaim the space later).
    A ledger with a password needs it (--password-file, $BKCTL_PASSWORD,
    --ask-password) or --force; a wrong password is refused even with
    --force.

    \b
    Example:
      bkctl ledger delete 7
      bkctl ledger delete 7 --ask-password
      bkctl ledger delete 7 --force
    """
    with _connect(config_path) as bk:
        bk.delete_ledger(ledger_id, password.encode() if password else None, force=force)
    click.echo(f"deleted ledger {ledger_id}")
