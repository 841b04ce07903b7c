"""bkctl bookie: re-replicate a lost bookie's data, list under-replicated ledgers.

Thin commands over ``appliance.rereplication``: progress lines go to stderr,
the summary (or one JSON document with ``--json``) to stdout; the exit code
is non-zero when any ledger was skipped or failed.
"""

from __future__ import annotations

import click

from cli.common import config_option, echo_json, json_option, library_errors


@click.group()
def bookie():
    """Bookie maintenance: re-replicate a lost bookie's ledgers."""


@bookie.command()
@click.argument("bookie_id")
@click.option("--password", "passwords", multiple=True,
              help="Ledger password (repeat for several; default: none). Ledgers whose "
                   "password matches none are skipped and reported.")
@click.option("--recover-open", is_flag=True,
              help="Fence and close OPEN / IN_RECOVERY ledgers first (stops their writer).")
@click.option("--dry-run", is_flag=True, help="Only show what would be copied, and where.")
@json_option
@config_option
@library_errors
def recover(bookie_id, passwords, recover_open, dry_run, as_json, config_path):
    """Copy every entry BOOKIE_ID held to other bookies and update the ledger
    metadata, so each fragment has its full write quorum again.

    CLOSED ledgers only, unless --recover-open. Exit code 1 when a ledger was
    skipped (open, wrong password, no writable replacement) or failed.

    \b
    Example:
      bkctl bookie recover bookie-3 --password secret --dry-run
      bkctl bookie recover bookie-3 --password secret --json
    """
    import appliance
    from appliance.rereplication.rereplicator import Rereplicator

    keys = [p.encode() for p in passwords] or [b""]
    with appliance.connect(config_path) as bk, Rereplicator(
            bk.ledgers, bk.registry, passwords=keys, open_ledger=_opener(bk),
            on_progress=lambda line: click.echo(line, err=True)) as rr:
        report = rr.recover(bookie_id, recover_open=recover_open, dry_run=dry_run)
    if as_json:
        echo_json(report.to_json())
    else:
        _print_summary(report)
    if not report.ok:
        click.get_current_context().exit(1)


def _opener(bk):
    def open_ledger(ledger_id: int, password: bytes) -> None:
        bk.open_ledger(ledger_id, password=password, recovery=True)
    return open_ledger


def _print_summary(report) -> None:
    verb = "would copy" if report.dry_run else "copied"
    for f in report.fragments:
        if "replacement" in f:
            click.echo(f"ledger {f['ledger_id']} entries {f['first_entry_id']}.."
                       f"{f['last_entry_id']}: {report.bookie_id} -> {f['replacement']} "
                       f"({verb} {f['entries']})")
        else:
            click.echo(f"ledger {f['ledger_id']}: {f['action']}")
    for s in report.skipped:
        click.echo(f"skipped ledger {s['ledger_id']}: {s['reason']}")
    for s in report.failed:
        click.echo(f"FAILED ledger {s['ledger_id']}: {s['reason']}")
    if report.dry_run:
        click.echo(f"dry run: {len(report.fragments)} fragment(s) planned, "
                   f"{len(report.skipped)} ledger(s) would be skipped")
        return
    click.echo(f"{len(report.ledgers_recovered)} ledger(s) re-replicated, "
               f"{report.entries_copied} entries copied, {len(report.skipped)} skipped, "
               f"{len(report.failed)} failed")


@bookie.command(name="underreplicated")
@json_option
@config_option
@library_errors
def underreplicated_(as_json, config_path):
    """List ledgers whose fragments name a bookie that is not registered now
    (down or gone): what `bkctl bookie recover` would act on.

    \b
    Example:
      bkctl bookie underreplicated --json
    """
    import appliance
    from appliance.rereplication.rereplicator import underreplicated

    with appliance.connect(config_path) as bk:
        found = underreplicated(bk.ledgers, bk.registry)
    if as_json:
        echo_json(found)
        return
    for item in found:
        click.echo(f"ledger {item['ledger_id']} ({item['state']}): missing "
                   f"{', '.join(item['missing'])}")
