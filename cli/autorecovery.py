"""bkctl autorecovery status|enable|disable, and bkctl bookie decommission:
automatic re-replication seen and steered from the command line
(``appliance.autorecovery``)."""

from __future__ import annotations

import time

import click

from appliance.errors import BKError
from cli.common import config_option, echo_json, json_option, library_errors


def _store(config_path):
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.config import load_config
    from storage.metadata import open_store

    config = load_config(config_path)
    return config, open_store(config.metadata.uri, base_dir=config.base_dir,
                              **config.metadata.store_options())


@click.group(short_help="Automatic re-replication of lost copies.")
def autorecovery():
    """Automatic re-replication: the auditor marks ledgers that lost a
    replica, workers in the bookies copy them back (docs/OPERATIONS.md)."""


@autorecovery.command(short_help="Show auditor, maintenance switch and marks.")
@json_option
@config_option
@library_errors
def status(as_json, config_path):
    """Show the auditor, the maintenance switch, the under-replicated marks
    (and which worker holds each), and every worker's progress and last error.

    \b
    Example:
      bkctl autorecovery status --json
    """
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.autorecovery.marks import Marks

    config, store = _store(config_path)
    with store:
        marks = Marks(store)
        doc = {"configured": config.autorecovery.enabled, "enabled": marks.enabled(),
               "auditor": marks.auditor(), "marks": {str(k): v for k, v in marks.marks().items()},
               "locks": {str(k): v for k, v in marks.locks().items()},
               "workers": marks.workers()}
    if as_json:
        echo_json(doc)
        return
    state = "enabled" if doc["enabled"] else "DISABLED (bkctl autorecovery enable)"
    if not doc["configured"]:
        state += "; autorecovery.enabled = false in the config: no auditor or worker runs"
    click.echo(f"autorecovery {state}; auditor: {doc['auditor'] or 'none'}")
    click.echo(f"{len(doc['marks'])} ledger(s) marked under-replicated")
    for ledger_id, mark in sorted(doc["marks"].items(), key=lambda kv: int(kv[0])):
        holder = doc["locks"].get(ledger_id)
        click.echo(f"  ledger {ledger_id}: missing {', '.join(mark.get('missing', []))}"
                   f" ({'; '.join(mark.get('reasons', []))})"
                   + (f", being copied by {holder}" if holder else ""))
    for name, w in sorted(doc["workers"].items()):
        click.echo(f"  worker {name}: {w.get('healed', 0)} healed, "
                   f"{w.get('entries_copied', 0)} entries copied"
                   + (f", copying ledger {w['copying']}" if w.get("copying") is not None else "")
                   + (f"; last error: {w['last_error']}" if w.get("last_error") else ""))


def _switch(config_path, enabled: bool) -> None:
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.autorecovery.marks import Marks

    _, store = _store(config_path)
    with store:
        Marks(store).set_enabled(enabled)
    click.echo("autorecovery " + ("enabled" if enabled else
                                  "disabled: no new copies start (marks are kept)"))


@autorecovery.command(short_help="Resume automatic re-replication.")
@config_option
@library_errors
def enable(config_path):
    """Resume automatic re-replication (the auditor and workers pick up at
    once).

    \b
    Example:
      bkctl autorecovery enable
    """
    _switch(config_path, True)


@autorecovery.command(short_help="Pause automatic re-replication.")
@config_option
@library_errors
def disable(config_path):
    """Stop automatic re-replication for maintenance: the auditor marks
    nothing and workers start no new copy (a copy in progress finishes its
    ledger). Kept in the metadata store until `enable`.

    \b
    Example:
      bkctl autorecovery disable
    """
    _switch(config_path, False)


@click.command(short_help="Move every ledger off a live bookie.")
@click.argument("bookie_id")
@click.option("--timeout-s", type=click.FloatRange(min=1), default=3600.0, show_default=True,
              help="Give up waiting after this long (the copies go on).")
@config_option
@library_errors
def decommission(bookie_id, timeout_s, config_path):
    """Move every ledger off the live bookie BOOKIE_ID (the autorecovery
    workers copy its share to other bookies and re-point the metadata),
    then remove its cookie and registration. Stop its process and remove
    it from the config afterwards.

    \b
    Example:
      bkctl bookie decommission bookie-4
    """
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.autorecovery.marks import Marks
    from appliance.errors import NoSuchLedgerError
    from appliance.meta.bookies import AVAILABLE_ROOT, BookieRegistry
    from appliance.meta.ledgers import LedgerManager

    config, store = _store(config_path)
    with store:
        marks, ledgers = Marks(store), LedgerManager(store)
        if not config.autorecovery.enabled or not marks.enabled():
            raise click.ClickException("autorecovery is disabled (config or `bkctl "
                                       "autorecovery disable`): enable it, or move the data "
                                       "with `bkctl bookie recover`")

        def naming() -> list[int]:
            found = []
            for ledger_id in ledgers.list_ledgers():
                try:
                    if bookie_id in ledgers.read_ledger(ledger_id)[0].bookies():
                        found.append(ledger_id)
                except NoSuchLedgerError:
                    continue
            return found

        todo = naming()
        for ledger_id in todo:
            marks.mark(ledger_id, [bookie_id], "decommission", int(time.time() * 1000))
        click.echo(f"{len(todo)} ledger(s) name {bookie_id}: marked for re-replication",
                   err=True)
        deadline = time.monotonic() + timeout_s
        while todo:
            if time.monotonic() > deadline:
                raise click.ClickException(f"{len(todo)} ledger(s) still name {bookie_id} "
                                           f"after {timeout_s:.0f} s; see `bkctl "
                                           "autorecovery status`")
            time.sleep(1.0)
            left = naming()
            if len(left) != len(todo):
                click.echo(f"{len(todo) - len(left)} more moved; {len(left)} left", err=True)
            todo = left
        registry = BookieRegistry(store)
        found = registry.read_cookie(bookie_id)
        if found is not None:
            registry.delete_cookie(bookie_id, found[1])
        try:
            store.delete(f"{AVAILABLE_ROOT}/{bookie_id}")
        except BKError:
            pass
    click.echo(f"{bookie_id} holds no ledger any more; its cookie and registration are "
               "removed: stop its process and remove it from the config")

