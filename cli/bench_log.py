"""``bkctl bench log``: the log layer's records/s, catch-up reads and tail
latency against a durable Redis Stream in the same run
(``appliance.bench.logs`` says how each figure is counted); with
``--producers N``, N producer processes writing one log through the log
service (``appliance.bench.log_producers``)."""

from __future__ import annotations

import click

from cli.common import echo_json, json_option, library_errors


@click.command("log", short_help="Write, catch-up read and tail a log.")
@click.option("--size", "sizes", type=click.IntRange(min=8, max=1 << 20), multiple=True,
              default=(100,), show_default=True,
              help="Record size in bytes (repeat for several: --size 100 --size 1024).")
@click.option("--records", type=click.IntRange(min=100), default=None,
              help="Records written (and read back) per size [default: 500,000; with "
                   "--producers 100,000 per mode, shared by the producers].")
@click.option("--rate", type=click.IntRange(min=1), default=None,
              help="Records/s of the tail-latency run [default: 10,000]; with --producers, "
                   "the records/s offered by all producers together, open loop (latency "
                   "counted from each record's scheduled time) [default: as fast as they "
                   "are answered].")
@click.option("--producers", type=click.IntRange(min=1, max=256), default=None,
              help="Run N producer processes writing one log through the log service "
                   "instead of one exclusive writer.")
@click.option("--logs", type=click.IntRange(min=1, max=10_000), default=1, show_default=True,
              help="With --producers: the producers write N logs (spread over them), all "
                   "owned by one log server ([log] servers = 1: N ledgers written at once); "
                   "each mode also runs with one log first, for vs_one_log.")
@click.option("--sync", "sync_mode", is_flag=True,
              help="With --producers: each write waits for its DLSN (the Redis peer at "
                   "pipeline 1).")
@click.option("--async", "async_mode", is_flag=True,
              help="With --producers: pipelined write_async, --window records in flight per "
                   "producer.  Neither flag: both runs.")
@click.option("--window", type=click.IntRange(min=1, max=4096), default=1000,
              show_default=True,
              help="With --producers --async: records in flight per producer (and the Redis "
                   "peer's pipeline).")
@click.option("--baseline-records", type=click.IntRange(min=100), default=None,
              help="With --producers: records of the baselines, the exclusive writer and "
                   "(pipelined, no --rate) the one-log run of --logs, when --records is "
                   "fewer [default: 400,000; shorter runs are mostly their start and "
                   "end].")
@click.option("--kill-owner", is_flag=True,
              help="With --producers: the producers write synchronously and the log server "
                   "owning their log is killed -9 once in the middle (the supervisor restarts "
                   "it): the longest stall of a producer, and the log read back (nothing lost "
                   "or stored twice).  Only --size, --dir and --kill-after-seconds apply.")
@click.option("--kill-after-seconds", type=click.FloatRange(min=0.5, max=600), default=2.0,
              show_default=True,
              help="With --kill-owner: how long the producers write before the kill (a new "
                   "owner rereads the records of about the last two minutes).")
@click.option("--tail-seconds", type=click.FloatRange(min=0.5), default=5.0,
              show_default=True, help="Length of the tail-latency run.")
@click.option("--peer", type=click.Path(dir_okay=False), default=None,
              help="The Redis Stream peer script (default: ../shared/peers/redis_stream.sh).")
@click.option("--no-peer", is_flag=True, help="Do not run the Redis Stream peer.")
@click.option("--dir", "workdir", type=click.Path(file_okay=False), default=None,
              help="Where the temporary appliance lives (default: the temp dir).")
@json_option
@library_errors
def log(sizes, records, rate, producers, logs, sync_mode, async_mode, window,
        baseline_records, tail_seconds, peer, no_peer, workdir, as_json, kill_owner,
        kill_after_seconds):
    """Write, catch-up read and tail a log (E3/W3/A2, one writer) on a
    temporary appliance of its own; compare with a durable Redis Stream.
    With --producers N: N producer processes write one log through the log
    service (the appliance's log servers), synchronously and/or pipelined,
    beside one exclusive writer and the Redis peer with N clients.

    \b
    Example:
      bkctl bench log --size 100 --json
      bkctl bench log --size 100 --size 1024 --records 200000
      bkctl bench log --producers 8 --records 100000 --json
      bkctl bench log --producers 8 --sync --rate 10000 --records 50000
      bkctl bench log --producers 8 --async --logs 1000 --no-peer   # vs one log
      bkctl bench log --producers 8 --kill-owner --json   # failover: the longest stall
    """
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.bench.logs import default_peer, run_log_bench

    if kill_owner:
        _kill_owner(producers, sizes, workdir, as_json, kill_after_seconds)
        return
    script = None if no_peer else (peer or str(default_peer()))
    if producers:
        _producers(producers, records, sizes, rate, sync_mode, async_mode, window, script,
                   workdir, as_json, logs, baseline_records)
        return
    if sync_mode or async_mode or logs != 1 or baseline_records is not None:
        raise click.UsageError("--sync, --async, --logs and --baseline-records go with "
                               "--producers")
    doc = run_log_bench(list(sizes), records or 500_000, rate or 10_000, tail_seconds, script,
                        workdir, on_progress=lambda line: click.echo(line, err=True))
    if as_json:
        echo_json(doc)
        return
    for line in writer_lines(doc):
        click.echo(line)


def writer_lines(doc: dict) -> list[str]:
    """``bench log``'s figures in words, a line each (--json has them all)."""
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.bench.logs import BATCH

    lines = []
    for r in doc["runs"]:
        lines += [
            f"{r['size']} B records, one exclusive writer (E3/W3/A2):",
            f"  write {r['records_per_s']:,} records/s durable (write_async, one record a "
            f"call; {r['records_per_entry']:,} records packed per ledger entry), "
            f"{r['batched_records_per_s']:,} records/s with write_many_async ({BATCH:,} "
            f"records a call)",
            f"  catch-up read {r['read_records_per_s']:,} records/s (one reader from the first "
            f"record)",
            f"  tail: written at {r['tail_rate']:,} records/s, each record reached a reader in "
            f"another process p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms after it was written"]
        p = r.get("peer")
        if p and "records_per_s" in p:
            lines.append(f"  redis stream (fsync always), the same records: write "
                         f"{p['records_per_s']:,} records/s, read {p['read_records_per_s']:,}"
                         f"/s; the log writes {r['write_vs_peer']}x and reads "
                         f"{r['read_vs_peer']}x as many")
        elif p:
            lines.append(f"  redis stream peer did not run: {p['error']}")
    return lines + [f"load average (1, 5, 15 min) {doc['load_average']}"]


def _kill_owner(producers, sizes, workdir, as_json, kill_after_s) -> None:
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.bench.log_failover import run_failover_bench

    if not producers or len(sizes) != 1:
        raise click.UsageError("--kill-owner goes with --producers N and one --size")
    doc = run_failover_bench(producers, sizes[0], workdir,
                             on_progress=lambda line: click.echo(line, err=True),
                             kill_after_s=kill_after_s)
    if as_json:
        echo_json(doc)
        return
    for line in failover_lines(doc):
        click.echo(line)


def failover_lines(doc: dict) -> list[str]:
    """``bench log --producers N --kill-owner``'s figures in words."""
    t = doc["timeline"]
    return [
        f"{doc['producers']} producer processes writing one log synchronously "
        f"({doc['size']} B records), its owner {doc['owner_killed']} killed -9 once, "
        f"{doc['kill_after_s']} s after they started:",
        f"  longest stall of a producer {doc['longest_stall_ms']:,} ms (the largest gap "
        f"between two acknowledged writes of one producer, from the kill on; usual gap p99 "
        f"{doc['usual_gap_p99_ms']} ms before it)",
        f"  the first write sent after the kill acknowledged {doc['first_ack_after_kill_ms']} "
        f"ms after it, every producer's after {doc['all_resumed_ms']} ms",
        f"  read back: {doc['records_acknowledged']:,} records acknowledged, "
        f"{doc['records_stored']:,} stored, {doc['lost']} lost, {doc['duplicated']} stored "
        f"twice, {len(doc['out_of_order'])} producer(s) out of order",
        f"  ms from the kill: supervisor released the leases {t.get('supervisor_released')}, "
        f"restarted the server {t.get('supervisor_restarted')}; a producer looked for the "
        f"owner again {t['producers_noticed_first']} (the last {t['producers_noticed_last']})",
        "  registry: " + ", ".join(f"{what} {value or 'gone'} at {when}"
                                   for when, what, value in t["registry"]),
        *(f"  {sid}: " + ", ".join(f"{what} at {when}" for when, what in t[sid])
          for sid in ("logserver-1", "logserver-2") if t[sid]),
        "  a take-over after the run, ms per step: " + ", ".join(
            f"{k} {v}" for k, v in doc["take_over_ms"].items() if k != "records_learnt")
        + f" ({doc['take_over_ms']['records_learnt']:,} records learnt)",
        f"load average (1, 5, 15 min) {doc['load_average']}"]


def _producers(producers, records, sizes, rate, sync_mode, async_mode, window, script, workdir,
               as_json, logs, baseline_records) -> None:
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.bench.log_producers import BASELINE_RECORDS_MIN, run_producers_bench

    if len(sizes) != 1:
        raise click.UsageError("--producers takes one --size")
    modes = [m for m, on in (("sync", sync_mode), ("async", async_mode)) if on] or \
        ["sync", "async"]
    doc = run_producers_bench(producers, records or 100_000, sizes[0], modes, rate, window,
                              script, workdir,
                              on_progress=lambda line: click.echo(line, err=True), logs=logs,
                              baseline_records=baseline_records or BASELINE_RECORDS_MIN)
    if as_json:
        echo_json(doc)
        return
    for line in producer_lines(doc):
        click.echo(line)


def producer_lines(doc: dict) -> list[str]:
    """``bench log --producers``' figures in words, a line each."""
    lines = [f"one exclusive writer, the baseline: {doc['writer_records_per_s']:,} records/s "
             f"({doc['writer_records']:,} records of {doc['size']} B, write_async)"]
    for r in doc["runs"]:
        lines += [f"{r['mode']}: {doc['producers']} producer processes, {_load_words(doc, r)}: "
                  f"{r['records_per_s']:,} records/s stored ({r['vs_writer']}x the writer), "
                  f"{r['errors']} not stored",
                  f"  latency of a record, {_start_words(doc, r)} to its DLSN: p50 {r['p50_ms']} "
                  f"ms, p99 {r['p99_ms']} ms, p99.9 {r['p999_ms']} ms",
                  f"  {r.get('records_per_entry')} records per ledger entry (the log "
                  f"server's group commit)"]
        if "one_log" in r:
            one = r["one_log"]
            lines.append(f"  {doc['logs']:,} logs on one log server: {r['vs_one_log']}x the "
                         f"rate of one log ({one['records_per_s']:,} records/s; load average "
                         f"{one['load_average'][0]} then, {r['load_average'][0]} now)")
        p = r.get("peer")
        if p and "records_per_s" in p:
            lines.append(f"  redis stream (fsync always), {p['clients']} clients, "
                         f"{p['pipeline']} command(s) in flight each: {p['records_per_s']:,} "
                         f"records/s, p99 {p.get('p99_ms')} ms; the producers: "
                         f"{r['vs_peer']}x as many")
        elif p:
            lines.append(f"  redis stream peer did not run: {p['error']}")
    return lines + [f"load average (1, 5, 15 min) {doc['load_average']}"]


def _load_words(doc: dict, run: dict) -> str:
    """How the producers wrote in this mode."""
    how = ("each write waiting for its DLSN" if run["mode"] == "sync" else
           f"write_async, up to {doc['window']:,} records in flight each")
    if doc["rate"]:
        how += f", {doc['rate']:,} records/s offered together (open loop)"
    return how


def _start_words(doc: dict, run: dict) -> str:
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.bench.log_producers import LATENCY_SAMPLE_EVERY

    if doc["rate"]:
        return "from its scheduled send time"
    if run["mode"] == "async":
        return f"one in {LATENCY_SAMPLE_EVERY} timed, from the write call"
    return "from the write call"
