"""``bkctl bench write`` and ``bkctl bench read``: durable adds and catch-up
reads end to end, on a temporary appliance of their own (four bookies under a
temp dir, removed afterwards) or on a running one with ``--config``.
How the figures are counted: ``appliance.bench.ledgers``."""

from __future__ import annotations

import click

from cli.common import client_knob_options, echo_json, json_option, library_errors
from cli.ledger import quorum_options


def _bench_options(f):
    """The options both commands share."""
    options = [
        click.option("--config", "config_path", type=click.Path(dir_okay=False, exists=True),
                     default=None, help="Bench this running appliance (default: start a "
                                        "temporary one with four bookies)."),
        click.option("--entries", type=click.IntRange(min=1), default=100_000,
                     show_default=True, help="Entries per client (an upper bound with "
                                             "--duration-s)."),
        click.option("--size", type=click.IntRange(min=0), default=1024, show_default=True,
                     help="Payload bytes per entry."),
        click.option("--inflight", type=click.IntRange(min=1), default=10_000,
                     show_default=True, help="Adds in flight per client."),
        click.option("--clients", type=click.IntRange(1, 64), default=1, show_default=True,
                     help="Client processes (each with a ledger of its own)."),
        click.option("--journal/--no-journal", default=None,
                     help="Temporary appliance: journal_write_data (default on: fsync before "
                          "every ack). --no-journal is BP-46 mode: not durable on a crash."),
        click.option("--duration-s", type=click.FloatRange(min=0, min_open=True), default=None,
                     help="Stop after this many seconds."),
        click.option("--dir", "workdir", type=click.Path(file_okay=False, exists=True),
                     default=None, help="Temporary appliance under DIR (default: $TMPDIR)."),
        click.option("--baseline-s", type=click.FloatRange(min=0), default=0.5,
                     show_default=True, help="Seconds for each raw disk baseline (temporary "
                                             "appliance only; 0 = skip)."),
        click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
                     help="Write latency-over-time and histogram plots to this PNG."),
        json_option,
        quorum_options,
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _options(config_path, journal, **kwargs):
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.bench.ledgers import BenchOptions

    if config_path is not None and journal is not None:
        raise click.UsageError("--journal/--no-journal applies to the temporary appliance; "
                               "a running one uses its config's journal_write_data")
    if config_path is not None and kwargs.get("metrics"):
        raise click.UsageError("--metrics applies to the temporary appliance; a running one "
                               "uses its config's [[bookies]] metrics_address")
    if config_path is not None and kwargs.get("entry_log_per_ledger"):
        raise click.UsageError("--entry-log-per-ledger applies to the temporary appliance; "
                               "a running one uses its config's storage.entry_log_per_ledger")
    if config_path is not None and kwargs.get("compaction_rate") is not None:
        raise click.UsageError("--compaction-rate applies to the temporary appliance; a running "
                               "one uses its config's storage.compaction_rate_bytes_per_s")
    return BenchOptions(journal=True if journal is None else journal, **kwargs).validate()


def _echo(doc: dict, rate_key: str, what: str) -> None:
    for line in summary_lines(doc, rate_key, what):
        click.echo(line)


def summary_lines(doc: dict, rate_key: str, what: str) -> list[str]:
    """The figures of a run in words, a line each (--json has every figure
    and option)."""
    quorum = (f"E{doc['ensemble']}/W{doc['write_quorum']}/A{doc['ack_quorum']}: each entry on "
              f"{doc['write_quorum']} of {doc['ensemble']} bookies")
    done = (f"adds/s acknowledged (durable on {doc['ack_quorum']} bookies at least)"
            if what == "write" else "entries/s read back from a closed ledger")
    rss = doc["bookie_peak_rss_mb"]
    lines = [
        f"{what:<6}{doc[rate_key]:>12,.0f} {done}, {doc['mb_per_s']:,.1f} MB/s of payload "
        f"({doc['entries']:,} entries x {doc['size']} B, {quorum}; {doc['clients']} client "
        f"process(es))",
        f"{'':<6}latency {latency_words(doc)}: p50 {doc['p50_ms']:.2f}  p95 "
        f"{doc['p95_ms']:.2f}  p99 {doc['p99_ms']:.2f}  p99.9 {doc['p999_ms']:.2f} ms",
        f"cpu   per 1,000 entries: {doc['client_cpu_s_per_1000_entries']:.3f} s in the client "
        f"processes, {doc['bookie_cpu_s_per_1000_entries']:.3f} s in the bookies; the "
        f"largest bookie's peak memory (RSS) {'?' if rss is None else f'{rss:.0f}'} MB"]
    if doc.get("disk_fdatasync_per_s"):
        direct = doc["disk_direct_mb_per_s"]
        lines.append(f"disk  the raw disk under the appliance, measured just before the run, "
                     f"to compare with: {doc['disk_fdatasync_per_s']:,.0f} "
                     f"fdatasync/s, {'-' if direct is None else f'{direct:,.0f}'} MB/s of "
                     f"direct (O_DIRECT) writes")
    if doc.get("plot"):
        lines.append(f"plot  {doc['plot']}")
    return lines


def latency_words(doc: dict) -> str:
    """What one latency sample is, and under what load it was taken."""
    timed = f"one in {doc['sample_every']} timed" if doc["sample_every"] > 1 else "every one timed"
    if doc["kind"] == "read":
        return ("per chunk of read_chunks() (the bulk API)" if doc["read_chunks"] else
                f"of one read() call of {doc['read_batch']:,} entries, call to return")
    if doc["loop"] == "open":
        return (f"of one add, from its scheduled send time to its acknowledgement, "
                f"{doc['rate']:,.0f} adds/s offered by all clients (open loop; {timed})")
    return (f"of one add, call to acknowledgement, with {doc['inflight']:,} adds in flight "
            f"per client (closed loop: a new add as soon as one completes; {timed})")


def _echo_compaction(doc: dict) -> None:
    c = doc["compaction"]
    took = "still running at the end" if c["done_s"] is None else \
        f"{c['done_s'] - c['asked_s']:.1f} s"
    click.echo(f"compaction  asked at {c['asked_s']} s, {took}: "
               f"{c['bytes_copied'] / 1e6:,.0f} MB copied by {c['bookies_done']} bookies, "
               f"{c['throttled_s']:.1f} s waiting for the rate limit"
               + (f" ({c['error']})" if c["error"] else ""))
    for key, what in (("during_compaction", "during"), ("outside_compaction", "outside")):
        row = doc[key]
        if row["samples"]:
            click.echo(f"  adds sent {what:<7} p50 {row['p50_ms']:.2f}  p99 {row['p99_ms']:.2f}"
                       f"  p99.9 {row['p999_ms']:.2f} ms  ({row['samples']:,} samples)")


@click.command("write", short_help="Durable adds/s, MB/s, latency and CPU.")
@click.option("--rate", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Open loop: adds/s over all clients, latency from the scheduled send "
                   "time (0 = closed loop: keep --inflight adds in flight).")
@click.option("--sample-every", type=click.IntRange(min=1), default=16, show_default=True,
              help="Time every N-th add (a callback per add costs the client CPU).")
@click.option("--add-batch", type=click.IntRange(min=1), default=1, show_default=True,
              help="Closed loop: queue adds N at a time with WriteHandle.add_many_async "
                   "(1 = one add_async per entry).")
@click.option("--ledgers", type=click.IntRange(1, 4096), default=1, show_default=True,
              help="Ledgers each client writes concurrently, round robin (--inflight is "
                   "shared between them).")
@click.option("--entry-log-per-ledger/--entry-log-interleaved", "entry_log_per_ledger",
              default=False, show_default=True,
              help="Temporary appliance: storage.entry_log_per_ledger (BP-32), with "
                   "entry_logs_open_max at least clients x ledgers.")
@click.option("--metrics/--no-metrics", default=False, show_default=True,
              help="Temporary appliance: every bookie serves Prometheus /metrics "
                   "(metrics_address 127.0.0.1:0), to measure what metrics cost.")
@click.option("--compact-during", "compact_during_mb", type=click.IntRange(min=0), default=0,
              show_default=True, metavar="MB",
              help="First write MB of 64 KiB entries to 12 ledgers and delete 8 of them, "
                   "then ask every bookie for a major compaction --compact-after-s into "
                   "the run; also prints the latency of the adds sent while it ran.")
@click.option("--compact-after-s", type=click.FloatRange(min=0), default=2.0,
              show_default=True, help="With --compact-during: when the compaction starts.")
@click.option("--compaction-rate", type=click.IntRange(min=0), default=None,
              help="Temporary appliance: storage.compaction_rate_bytes_per_s (bytes/s "
                   "compaction copies; 0 = no limit; default: the config's default).")
@client_knob_options
@_bench_options
@library_errors
def write(config_path, journal, plot_path, workdir, as_json, **kwargs):
    """Durable adds/s, MB/s, latency percentiles and CPU per 1,000 adds.

    \b
    Example:
      bkctl bench write                         # 100,000 x 1 KB, E3/W3/A2
      bkctl bench write --size 65536 --entries 20000 --json
      bkctl bench write --rate 10000 --duration-s 10 --plot write.png
      bkctl bench write --add-batch 512         # adds queued 512 at a time
      bkctl bench write --ledgers 256 --entry-log-per-ledger   # BP-32 vs interleaved
      bkctl bench write --metrics               # the cost of /metrics (vs --no-metrics)
      bkctl bench write --ledgers 1000 --gc-threshold 50000   # many ledgers, less GC
      bkctl bench write --ledgers 1000 --switch-interval-us 50000   # fewer GIL swaps
      bkctl bench write --ledgers 1000 --rate 10000 --add-messages-inflight 0   # no hold
      bkctl bench write --rate 10000 --duration-s 30 --compact-during 1000 \\
          --compaction-rate 0               # add p99 while a major compaction runs
    """
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.bench.ledgers import run_bench

    options = _options(config_path, journal, **kwargs)
    doc = run_bench("write", options, config_path, workdir, plot_path)
    if as_json:
        echo_json(doc)
        return
    _echo(doc, "adds_per_s", "write")
    if "compaction" in doc:
        _echo_compaction(doc)


@click.command("read", short_help="Catch-up reads of a closed ledger.")
@click.option("--read-batch", type=click.IntRange(1, 10_000), default=1000, show_default=True,
              help="Entries per ReadHandle.read call (latency is per call).")
@click.option("--chunks", "read_chunks", is_flag=True, default=False,
              help="Read with ReadHandle.read_chunks (bulk: one buffer per chunk, no Entry "
                   "per entry) instead of read() calls; latency is per chunk.")
@_bench_options
@library_errors
def read(config_path, journal, plot_path, workdir, as_json, **kwargs):
    """Catch-up reads of a closed ledger: entries/s, MB/s, per-call latency.

    Each client first writes --entries entries (not timed), closes the
    ledger, then reads it back from the start.

    \b
    Example:
      bkctl bench read                          # 100,000 x 1 KB
      bkctl bench read --entries 200000 --read-batch 5000 --json
      bkctl bench read --chunks                 # the bulk API, same ledger shape
    """
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.bench.ledgers import run_bench

    options = _options(config_path, journal, **kwargs)
    doc = run_bench("read", options, config_path, workdir, plot_path)
    echo_json(doc) if as_json else _echo(doc, "reads_per_s", "read")
