"""``bkctl bench log``: the log layer's records/s, catch-up reads and tail
latency against a durable Redis Stream in the same run
(``appliance.bench.logs`` says how each figure is counted)."""

from __future__ import annotations

import click

from cli.common import echo_json, json_option, library_errors


@click.command("log", short_help="Write, catch-up read and tail a log.")
@click.option("--size", "sizes", type=click.IntRange(min=8, max=1 << 20), multiple=True,
              default=(100,), show_default=True,
              help="Record size in bytes (repeat for several: --size 100 --size 1024).")
@click.option("--records", type=click.IntRange(min=1000), default=500_000, show_default=True,
              help="Records written (and read back) per size.")
@click.option("--rate", type=click.IntRange(min=1), default=10_000, show_default=True,
              help="Records/s of the tail-latency run.")
@click.option("--tail-seconds", type=click.FloatRange(min=0.5), default=5.0,
              show_default=True, help="Length of the tail-latency run.")
@click.option("--peer", type=click.Path(dir_okay=False), default=None,
              help="The Redis Stream peer script (default: ../shared/peers/redis_stream.sh).")
@click.option("--no-peer", is_flag=True, help="Do not run the Redis Stream peer.")
@click.option("--dir", "workdir", type=click.Path(file_okay=False), default=None,
              help="Where the temporary appliance lives (default: the temp dir).")
@json_option
@library_errors
def log(sizes, records, rate, tail_seconds, peer, no_peer, workdir, as_json):
    """Write, catch-up read and tail a log (E3/W3/A2, one writer) on a
    temporary appliance of its own; compare with a durable Redis Stream.

    \b
    Example:
      bkctl bench log --size 100 --json
      bkctl bench log --size 100 --size 1024 --records 200000
    """
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.bench.logs import default_peer, run_log_bench

    script = None if no_peer else (peer or str(default_peer()))
    doc = run_log_bench(list(sizes), records, rate, tail_seconds, script, workdir,
                        on_progress=lambda line: click.echo(line, err=True))
    if as_json:
        echo_json(doc)
        return
    for r in doc["runs"]:
        click.echo(f"{r['size']} B records: write {r['records_per_s']:,}/s "
                   f"({r['records_per_entry']} per entry; "
                   f"{r['batched_records_per_s']:,}/s batched), catch-up read "
                   f"{r['read_records_per_s']:,}/s, tail at {r['tail_rate']:,}/s: "
                   f"p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms")
        p = r.get("peer")
        if p and "records_per_s" in p:
            click.echo(f"  redis stream: write {p['records_per_s']:,}/s, read "
                       f"{p['read_records_per_s']:,}/s -> {r['write_vs_peer']}x write, "
                       f"{r['read_vs_peer']}x read")
        elif p:
            click.echo(f"  redis stream peer did not run: {p['error']}")
    click.echo(f"load average {doc['load_average']}")
