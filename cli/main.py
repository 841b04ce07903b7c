"""bkctl: start, stop and inspect the appliance; read and write ledgers;
run benchmarks.  Every command takes ``--config PATH``."""

from __future__ import annotations

import click

from appliance import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="bkctl")
def cli():
    """Control a BookKeeper appliance.

    \b
    Example:
      bkctl up --detach --config configs/local.toml
      echo hello | bkctl ledger append -
    """


@cli.group()
def bench():
    """Benchmarks; each prints its results (or one JSON document with --json)."""


def _register_commands() -> None:
    """Each feature module adds its commands here (kept in one place so
    `bkctl --help` lists everything)."""
    from cli.bench_metadata import bench_metadata

    bench.add_command(bench_metadata)
    from cli.bench_storage import storage as bench_storage

    bench.add_command(bench_storage)
    from cli.bench_appliance import read as bench_read
    from cli.bench_appliance import write as bench_write

    bench.add_command(bench_write)
    bench.add_command(bench_read)
    from cli.bench_spark import spark as bench_spark

    bench.add_command(bench_spark)
    from cli.bench_repair import autorecovery as bench_autorecovery
    from cli.bench_repair import boot as bench_boot
    from cli.bench_repair import reclaim as bench_reclaim
    from cli.bench_repair import repair as bench_repair

    bench.add_command(bench_autorecovery)
    from cli.bench_hosts import hosts as bench_hosts

    bench.add_command(bench_hosts)
    from cli.bench_log import log as bench_log

    bench.add_command(bench_log)
    bench.add_command(bench_repair)
    bench.add_command(bench_reclaim)
    bench.add_command(bench_boot)
    from cli.bench_scale import scale as bench_scale

    bench.add_command(bench_scale)
    from cli.admin import down, status, up
    from cli.autorecovery import autorecovery, decommission
    from cli.bookie import bookie
    from cli.keys import keys
    from cli.ledger import ledger
    from cli.log import log
    from cli.top import top

    bookie.add_command(decommission)
    for command in (up, down, status, top, ledger, log, bookie, autorecovery, keys):
        cli.add_command(command)


_register_commands()


def main() -> None:
    cli(prog_name="bkctl")


if __name__ == "__main__":
    main()
