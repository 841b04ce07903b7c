"""``bkctl bench metadata``: compare-and-swap throughput of the metadata store."""

from __future__ import annotations

import click

from cli.common import echo_json, json_option, library_errors


def _counts(_ctx, _param, text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise click.BadParameter(f"not a comma-separated list of integers: {text!r}") from exc
    if not counts or any(not 1 <= c <= 64 for c in counts):
        raise click.BadParameter("process counts must be between 1 and 64")
    return counts


@click.command("metadata", short_help="CAS operations per second on metadata.")
@click.option("--uri", "uris", multiple=True,
              help="Bench this store (repeatable). Default: a temporary SQLite file and a "
                   "temporary ZooKeeper server (from pyspark's jars).")
@click.option("--backend", type=click.Choice(["all", "sqlite", "zk"]), default="all",
              show_default=True, help="Temporary backends to bench when no --uri is given.")
@click.option("--ops", "ops_per_process", type=click.IntRange(1, 1_000_000), default=2_000,
              show_default=True, help="Successful CAS operations per process.")
@click.option("--processes", "process_counts", default="1,4", show_default=True,
              callback=_counts, help="Comma-separated numbers of concurrent processes.")
@click.option("--warmup", "warmup_ops", type=click.IntRange(0, 1_000_000), default=3_000,
              show_default=True, help="Untimed CAS operations first (JVM warm-up).")
@json_option
@library_errors
def bench_metadata(uris, backend, ops_per_process, process_counts, warmup_ops, as_json):
    """CAS operations per second on the metadata store, from 1 and 4 processes.

    Each process repeats get + set(expected_version) and retries conflicts;
    "shared" runs contend on one node, "own" runs give each process a node.

    \b
    Example:
      bkctl bench metadata --ops 1000 --processes 1,4
      bkctl bench metadata --uri zk://127.0.0.1:2181/bench --json
    """
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.bench.metadata import run_matrix, temporary_store_uri

    rows = []
    if uris:
        for uri in uris:
            found = run_matrix(uri, process_counts, ops_per_process, warmup_ops)
            rows += [{"store": uri, **r} for r in found]
    else:
        for name in (["sqlite", "zk"] if backend == "all" else [backend]):
            with temporary_store_uri(name) as uri:
                found = run_matrix(uri, process_counts, ops_per_process, warmup_ops)
            rows += [{"store": name, **r} for r in found]
    if as_json:
        echo_json({"benchmark": "metadata-cas", "ops_per_process": ops_per_process,
                   "warmup_ops": warmup_ops, "results": rows})
        return
    click.echo(f"{'store':<10} {'procs':>5} {'node':<6} {'CAS/s':>8} {'conflicts':>9} "
               f"{'seconds':>8}")
    for r in rows:
        click.echo(f"{r['store'][:10]:<10} {r['processes']:>5} {r['node']:<6} "
                   f"{r['cas_per_s']:>8} {r['conflicts']:>9} {r['seconds']:>8}")
    click.echo("CAS/s: successful compare-and-swaps per second, all processes together; "
               "conflicts: swaps that lost to another process and were retried; node: "
               "shared (every process swaps one node) or own (one each)")
