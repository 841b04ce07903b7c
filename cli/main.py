"""bkctl: start, stop and inspect the appliance; read and write ledgers;
run benchmarks.  Every command takes ``--config PATH``.

Every command is listed here, in the two tables below, so `bkctl --help`
and this file's header name everything the tool offers."""

from __future__ import annotations

import click

from appliance import __version__
from cli import (
    admin,
    autorecovery,
    bench_appliance,
    bench_log,
    bench_metadata,
    bench_repair,
    bench_scale,
    bench_spark,
    bench_storage,
    bookie,
    keys,
    ledger,
    log,
    processes,
    top,
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="bkctl")
def cli():
    """Control a BookKeeper appliance.

    \b
    Example:
      bkctl up --detach --config configs/local.toml
      echo hello | bkctl ledger append -
    """


@cli.group(short_help="Benchmarks of the appliance.")
def bench():
    """Benchmarks; each prints its results (or one JSON document with --json)."""


# `bkctl bench ...`: one benchmark per feature module.
BENCH_COMMANDS = (
    bench_metadata.bench_metadata,
    bench_storage.storage,
    bench_appliance.write,
    bench_appliance.read,
    bench_spark.spark,
    bench_spark.spark_log,
    bench_spark.spark_stream,
    bench_repair.autorecovery,
    bench_log.log,
    bench_repair.repair,
    bench_repair.reclaim,
    bench_repair.boot,
    bench_scale.scale,
)

# `bkctl ...`: the top-level commands and groups.
TOP_COMMANDS = (
    admin.up,
    admin.down,
    admin.status,
    top.top,
    ledger.ledger,
    log.log,
    bookie.bookie,
    processes.log_server,
    autorecovery.autorecovery,
    keys.keys,
)


def _register_commands() -> None:
    """Attach the tables' commands to their groups."""
    for command in BENCH_COMMANDS:
        bench.add_command(command)
    bookie.bookie.add_command(autorecovery.decommission)
    for command in processes.commands(processes.BOOKIE, "bookie-2"):
        bookie.bookie.add_command(command)  # bkctl bookie start|stop|restart ID
    for command in processes.commands(processes.LOG_SERVER, "logserver-1"):
        processes.log_server.add_command(command)
    for command in TOP_COMMANDS:
        cli.add_command(command)


_register_commands()


def main() -> None:
    cli(prog_name="bkctl")


if __name__ == "__main__":
    main()
