"""Adds/s and latency across three simulated hosts (network namespaces, a
ZooKeeper ensemble, tcp bookies); needs root, so it is a harness bench, run
from a checkout, not a ``bkctl bench`` command of the installed package:

    sudo .venv/bin/python -m tests.harness.bench_hosts --entries 20000 --json

How it is set up and counted: ``tests.harness.hosts_bench``."""

from __future__ import annotations

import click

from cli.bench_appliance import latency_words
from cli.common import echo_json, json_option, library_errors
from cli.ledger import quorum_options


@click.command("hosts", short_help="Adds/s and latency across host namespaces.")
@click.option("--entries", type=click.IntRange(min=1), default=20_000, show_default=True,
              help="Entries written (closed loop, one ledger).")
@click.option("--size", type=click.IntRange(min=0), default=1024, show_default=True,
              help="Payload bytes per entry.")
@click.option("--inflight", type=click.IntRange(min=1), default=1_000, show_default=True,
              help="Adds in flight.")
@click.option("--delay-ms", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="One-way delay added on every host's link (tc netem; needs sch_netem).")
@click.option("--delay-mode", type=click.Choice(["netem", "relay", "auto"]), default="netem",
              show_default=True,
              help="How the delay is made: tc netem, or a userspace relay in front of each "
                   "host's bookies (kernels without netem; --delay-ms 0 --delay-mode relay is "
                   "its baseline), or auto (netem if the kernel has it).")
@click.option("--curve/--no-curve", default=False, show_default=True,
              help="CURVE on every tcp endpoint (a key pair per host and for the client).")
@click.option("--dir", "workdir", type=click.Path(file_okay=False, exists=True), default=None,
              help="Put the hosts' data under DIR (default: $TMPDIR).")
@json_option
@quorum_options
@library_errors
def hosts(entries, size, inflight, delay_ms, delay_mode, curve, workdir, as_json, ensemble,
          write_quorum, ack_quorum):
    """Durable adds/s and p50/p99 from a client namespace to bookies on
    three host namespaces over tcp (as root; everything is removed after).

    Default: 20,000 x 1 KB, E3/W3/A2; --delay-ms 1 adds 1 ms each way between
    hosts; --curve is the same run with CURVE on.

    \b
    Example (as root, from the checkout):
      sudo .venv/bin/python -m tests.harness.bench_hosts
      sudo .venv/bin/python -m tests.harness.bench_hosts --delay-ms 1 --json
      sudo .venv/bin/python -m tests.harness.bench_hosts --curve
      sudo .venv/bin/python -m tests.harness.bench_hosts --delay-ms 1 --delay-mode relay
    """
    # on use: the namespaces' code only when a run starts
    from tests.harness.hosts_bench import run_hosts_bench

    try:
        doc = run_hosts_bench(entries, size=size, inflight=inflight, delay_ms=delay_ms,
                              quorums=(ensemble, write_quorum, ack_quorum), workdir=workdir,
                              curve=curve, delay_mode=delay_mode)
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        echo_json(doc)
        return
    for line in hosts_lines(doc):
        click.echo(line)


def hosts_lines(doc: dict) -> list[str]:
    """The figures in words, a line each (--json has them all)."""
    delay = (f"{doc['delay_ms']} ms added each way between hosts ({doc['delay_mode']})"
             if doc["delay_ms"] else f"no delay added ({doc['delay_mode']})")
    return [
        f"hosts {doc['adds_per_s']:>10,.0f} adds/s acknowledged ({doc['entries']:,} x "
        f"{doc['size']} B, E{doc['ensemble']}/W{doc['write_quorum']}/A{doc['ack_quorum']}, "
        f"{doc['hosts']} hosts x {doc['bookies'] // doc['hosts']} bookies over tcp"
        f"{' + CURVE' if doc['curve'] else ''}; {delay})",
        f"      latency {latency_words(doc)}: p50 {doc['p50_ms']:.2f}  p99 {doc['p99_ms']:.2f} ms"]


if __name__ == "__main__":
    hosts(prog_name="python -m tests.harness.bench_hosts")
