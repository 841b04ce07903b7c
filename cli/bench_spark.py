"""``bkctl bench spark``: Spark ingest from the appliance (the ``bookkeeper``
source) next to ``spark.read.parquet`` of the same rows, in the same run;
``bkctl bench spark-log``: a log's records hot and cold, through the
source and ``read_log``;
``bkctl bench spark-stream``: Structured Streaming over logs."""

from __future__ import annotations

import click

from cli.common import echo_json, json_option, library_errors


def _sizes(ctx, param, value: str) -> list[int]:
    try:
        sizes = [int(s) for s in value.split(",") if s.strip()]
    except ValueError:
        raise click.BadParameter("a comma-separated list of byte sizes, like 100,1024") from None
    if not sizes or min(sizes) < 1:
        raise click.BadParameter("give at least one size, each >= 1")
    return sizes


def _choices(allowed: set[str], message: str):
    """A click callback: a comma-separated list of names from ``allowed``, in
    the order given; ``message`` is the error for an empty list or another name."""
    def callback(ctx, param, value: str) -> tuple[str, ...]:
        names = tuple(n.strip() for n in value.split(",") if n.strip())
        if not names or set(names) - allowed:
            raise click.BadParameter(message)
        return names
    return callback


@click.command("spark", short_help="Spark batch ingest rows/s and MB/s.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, exists=True),
              default=None, help="A running appliance (default: a temporary one of its own).")
@click.option("--sizes", default="100,1024", show_default=True, callback=_sizes,
              help="Entry payload sizes in bytes, comma-separated.")
@click.option("--entries", type=click.IntRange(min=1), default=50_000, show_default=True,
              help="Entries per ledger (written once; reused on a running appliance).")
@click.option("--ledgers", type=click.IntRange(min=1), default=2, show_default=True,
              help="Ledgers per size (one or more partitions each).")
@click.option("--repeat", type=click.IntRange(min=1), default=3, show_default=True,
              help="Timed runs of each query; the best one is reported.")
@click.option("--master", default="local[2]", show_default=True, help="Spark master.")
@click.option("--dir", "directory", type=click.Path(file_okay=False, exists=True),
              default=None, help="Temp files (appliance, Parquet) under DIR (default: $TMPDIR).")
@click.option("--read-batch-entries", type=click.IntRange(1, 65_536), default=None,
              help="The temporary appliance's entries per read request "
                   "(server.batch_entries_max and client.read_batch_entries_max; default: "
                   "theirs). Not with --config: set them in its config.")
@json_option
@library_errors
def spark(config_path, sizes, entries, ledgers, repeat, master, directory, read_batch_entries,
          as_json):
    """Ingest rows/s and MB/s of spark.read.format("bookkeeper"), of
    spark.read.parquet on the same rows, and of an in-memory Python source
    (the ceiling of any Python data source), measured in the same run.

    \b
    Example:
      bkctl bench spark --json
      bkctl bench spark --config configs/local.toml --entries 500000 --sizes 100
      bkctl bench spark --entries 300000 --read-batch-entries 8192
    """
    if config_path is not None and read_batch_entries is not None:
        raise click.UsageError("--read-batch-entries sets up the temporary appliance; with "
                               "--config set server.batch_entries_max and "
                               "client.read_batch_entries_max in that config")
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.bench.spark import run_spark_bench

    result = run_spark_bench(config_path, sizes, entries, ledgers, repeat, master, directory,
                             read_batch_entries)
    if as_json:
        echo_json(result)
        return
    for run in result["sizes"]:
        click.echo(f"{run['size']} B x {run['rows']:,} rows, {run['partitions']} partitions")
        for name in ("bookkeeper", "parquet", "python_memory_source"):
            m = run[name]
            click.echo(f"  {name:<21}{m['rows_per_s']:>12,.0f} rows/s {m['mb_per_s']:>9,.1f} MB/s"
                       f"  (best of {m['runs_s']} s)")
        click.echo(f"  bookkeeper / parquet = {run['ratio_to_parquet']:.2f}, "
                   f"bookkeeper / in-memory source = {run['ratio_to_memory_source']:.2f}")


@click.command("spark-log", short_help="Spark batch rows/s over a log, hot and cold.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, exists=True),
              default=None, help="A running appliance with [cold_storage] (default: a "
                                 "temporary one of its own).")
@click.option("--records", type=click.IntRange(min=1), default=1_000_000, show_default=True,
              help="Records in each tier's log (written once; reused on a running appliance).")
@click.option("--size", type=click.IntRange(min=1), default=100, show_default=True,
              help="Record payload size in bytes.")
@click.option("--segments", type=click.IntRange(min=1), default=5, show_default=True,
              help="About how many segments the temporary appliance cuts a log into "
                   "(a segment rolls at records/segments records, at an entry's end).")
@click.option("--tiers", default="hot,cold", show_default=True,
              callback=_choices({"hot", "cold"}, "hot, cold or hot,cold"),
              help="What to measure: hot (a log on the bookies), cold (a log whose sealed "
                   "segments all moved to cold storage).")
@click.option("--repeat", type=click.IntRange(min=1), default=3, show_default=True,
              help="Timed rounds (each query once a round, tiers in turn); the best run of "
                   "each query is reported.")
@click.option("--master", default="local[2]", show_default=True, help="Spark master.")
@click.option("--dir", "directory", type=click.Path(file_okay=False, exists=True),
              default=None, help="Temp files (appliance, cold files) under DIR.")
@json_option
@library_errors
def spark_log(config_path, records, size, segments, tiers, repeat, master, directory,
              as_json):
    """Rows/s of spark.read.format("bookkeeper").option("log", NAME) and of
    appliance.spark.read_log (cold files read by Spark's own Parquet reader)
    over a log on the bookies and over a log of the same shape moved to cold
    storage, next to spark.read.parquet of the cold files; the queries of
    both tiers run in turn, with the load average after each run.  Moving
    to cold storage cannot be undone: the cold tier's log stays cold, the
    hot tier's log (its name ends in -hot) is never moved.

    \b
    Example:
      bkctl bench spark-log
      bkctl bench spark-log --records 200000 --size 1024 --json
      bkctl bench spark-log --config configs/local.toml --tiers cold
    """
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.bench.spark_log import run_spark_log_bench

    doc = run_spark_log_bench(config_path, size, records, segments, repeat, master, tiers,
                              directory)
    if as_json:
        echo_json(doc)
        return
    click.echo(f"{records:,} records of {size} B a log")
    for tier in tiers:
        run = doc[tier]
        calls = run["read_log_call_s"]
        click.echo(f"  {tier}: log {doc['logs'][tier]}, {run['segments']} segments, "
                   f"{run['partitions']} partitions (read_log: {run['read_log_partitions']}; "
                   f"its call {calls['first']} s, again {calls['cached']} s)")
        for name in ("bookkeeper", "read_log", "parquet_direct"):
            if name in run:
                m = run[name]
                click.echo(f"    {name:<15}{m['rows_per_s']:>12,.0f} rows/s  (runs {m['runs_s']} "
                           f"s, load average {m['load_avg_1m']})")
    if "cold_to_hot" in doc:
        click.echo(f"  cold / hot = {doc['cold_to_hot']:.2f} (bookkeeper source), "
                   f"{doc['cold_native_to_hot']:.2f} (cold read_log / hot source)")


@click.command("spark-stream", short_help="Spark streaming: backlog rows/s, latency, sink.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, exists=True),
              default=None, help="A running appliance with its log service (default: a "
                                 "temporary one of its own).")
@click.option("--records", type=click.IntRange(min=1), default=1_000_000, show_default=True,
              help="Records in the backlog log (written once; reused on a running appliance).")
@click.option("--size", type=click.IntRange(min=8), default=100, show_default=True,
              help="Record payload size in bytes.")
@click.option("--rate", type=click.IntRange(min=1), default=1_000, show_default=True,
              help="Records/s the latency part's writer appends.")
@click.option("--duration-s", type=click.FloatRange(min=0.1), default=20.0, show_default=True,
              help="Seconds the latency part's writer runs.")
@click.option("--parts", default="backlog,latency,sink", show_default=True,
              callback=_choices({"backlog", "latency", "sink"},
                                "a comma-separated list of backlog, latency, sink"),
              help="What to measure: backlog (streaming against batch read into noop), "
                   "latency (write to foreachBatch, 100 ms trigger), sink (batch and "
                   "streaming writes into a log).")
@click.option("--master", default="local[2]", show_default=True, help="Spark master.")
@click.option("--dir", "directory", type=click.Path(file_okay=False, exists=True),
              default=None, help="Temp files (appliance, checkpoints) under DIR; keep its "
                                 "path short: the log server's Unix socket lives under it.")
@json_option
@library_errors
def spark_stream(config_path, records, size, rate, duration_s, parts, master, directory,
                 as_json):
    """Structured Streaming over logs, in one run: a backlog of --records
    records read by a streaming query (availableNow) and by the batch source
    into the noop sink (rows/s, and their ratio); the latency from a write
    to the row in a foreachBatch function (100 ms trigger) at --rate
    records/s for --duration-s seconds (p50, p99, after a warm-up of
    min(5, duration / 4) s); rows/s of the batch sink and of a log-to-log
    stream (availableNow) into new logs, whose records are then counted.
    The 1-minute load average follows each part.

    \b
    Example:
      bkctl bench spark-stream
      bkctl bench spark-stream --records 200000 --parts backlog,sink --json
      bkctl bench spark-stream --config configs/local.toml --parts latency --rate 5000
    """
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.bench.spark_stream import run_spark_stream_bench

    doc = run_spark_stream_bench(config_path, records, size, rate, duration_s, master, parts,
                                 directory)
    if as_json:
        echo_json(doc)
        return
    if "backlog" in doc:
        b = doc["backlog"]
        click.echo(f"backlog: log {doc['log']}, {records:,} records of {size} B, into noop")
        click.echo(f"  batch source    {b['batch']['rows_per_s']:>12,.0f} rows/s "
                   f"({b['batch']['s']} s)")
        click.echo(f"  streaming query {b['stream']['rows_per_s']:>12,.0f} rows/s "
                   f"({b['stream']['s']} s from start(), {b['stream']['batches']} batches, "
                   f"addBatch {b['stream']['add_batch_s']:.2f} s)")
        click.echo(f"  stream / batch = {b['stream_to_batch']:.2f}  "
                   f"(load average {b['load_avg_1m']})")
    if "latency" in doc:
        m = doc["latency"]
        click.echo(f"latency: {m['rate']:,} records/s for {m['duration_s']:g} s, trigger "
                   f"{m['trigger']}, foreachBatch; first {m['warmup_s']:g} s skipped "
                   f"({m['rows_measured']:,} rows)")
        click.echo(f"  p50 {m['p50_ms']:,.1f} ms  p99 {m['p99_ms']:,.1f} ms  max "
                   f"{m['max_ms']:,.1f} ms  (load average {m['load_avg_1m']})")
    if "sink" in doc:
        s = doc["sink"]
        click.echo(f"sink: {records:,} records into a log")
        for kind in ("batch", "stream"):
            click.echo(f"  {kind:<6} {s[kind]['rows_per_s']:>12,.0f} rows/s ({s[kind]['s']} s, "
                       f"log {s[kind]['log']} holds {s[kind]['records_in_log']:,})")
        click.echo(f"  (load average {s['load_avg_1m']})")
