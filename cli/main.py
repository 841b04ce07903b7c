"""bkctl: start, stop and inspect the appliance; read and write ledgers;
run benchmarks.  Every command takes ``--config PATH``.

Every command is listed here, in the two tables below, so `bkctl --help`
and this file's header name everything the tool offers."""

from __future__ import annotations

import os
import select
import signal
import sys

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

# The status a shell reports for a command ended by SIGPIPE (``cat`` in
# ``cat big | head -1``): what bkctl exits with when its reader goes away.
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE


class QuietPipeGroup(click.Group):
    """bkctl's top group: output piped to a reader that stops early
    (``bkctl status | head -1``) ends the command quietly, as ``cat`` does,
    instead of ``Error: [Errno 32] Broken pipe``.  A broken pipe that is not
    stdout's is an error like any other."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            if not _stdout_reader_gone():
                raise
            _silence_stdout()
            ctx.exit(EXIT_BROKEN_PIPE)


def _stdout_reader_gone() -> bool:
    """Is stdout a pipe whose reader closed it?  (True when stdout has no
    file descriptor to ask, as under click's test runner.)"""
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError):
        return True
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & select.POLLERR for _, events in poller.poll(0))


def _silence_stdout() -> None:
    """Point stdout's descriptor at /dev/null, so what is still buffered
    is flushed there at exit, not into another BrokenPipeError."""
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


@click.group(cls=QuietPipeGroup, context_settings={"help_option_names": ["-h", "--help"]})
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
