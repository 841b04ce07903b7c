"""``bkctl bench storage``: durable adds through one bookie's storage engine,
next to the raw disk measured in the same run."""

from __future__ import annotations

import click

from cli.common import echo_json, json_option, library_errors


@click.command("storage", short_help="Durable adds/s of the storage engine alone.")
@click.option("--size", type=click.IntRange(min=0), default=1024, show_default=True,
              help="Entry size in bytes.")
@click.option("--entries", type=click.IntRange(min=1), default=None,
              help="Number of adds to make (default: run for --duration-s).")
@click.option("--duration-s", type=click.FloatRange(min=0, min_open=True), default=5.0,
              show_default=True, help="How long to add when --entries is not given.")
@click.option("--dir", "directory", type=click.Path(file_okay=False, exists=True),
              default=None, help="Run in a new temp dir under DIR (default: $TMPDIR).")
@click.option("--batch-bytes", type=click.IntRange(min=1), default=256 * 1024,
              show_default=True, help="Bytes per add_entries batch.")
@click.option("--window", type=click.IntRange(min=1), default=8, show_default=True,
              help="Batches in flight before waiting for durability.")
@click.option("--no-journal", is_flag=True,
              help="journal_write_data = false (BP-46): adds skip the journal, not durable.")
@click.option("--baseline-s", type=click.FloatRange(min=0, min_open=True), default=1.0,
              show_default=True, help="Seconds for each raw disk baseline.")
@json_option
@library_errors
def storage(size, entries, duration_s, directory, batch_bytes, window, no_journal,
            baseline_s, as_json):
    """Durable adds/s, MB/s and latency of the storage engine (journal fsync on),
    with the disk's plain fdatasync rate and O_DIRECT bandwidth from the same run.

    \b
    Example:
      bkctl bench storage --size 1024 --json
      bkctl bench storage --size 65536 --duration-s 10 --dir /mnt/nvme
    """
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from storage.bench import run_storage_bench

    result = run_storage_bench(size, entries, duration_s, directory, batch_bytes, window,
                               not no_journal, baseline_s)
    if as_json:
        echo_json(result)
        return
    for line in storage_lines(result):
        click.echo(line)


def storage_lines(result: dict) -> list[str]:
    """The figures in words, a line each (--json has them all)."""
    direct = result["disk_direct_mb_per_s"]
    durable = ("durable (journal fdatasync'ed)" if result["journal_write_data"] else
               "in the entry log, not durable on a crash (--no-journal)")
    return [
        f"storage  {result['adds_per_s']:>12,.0f} adds/s {durable}, {result['mb_per_s']:,.1f} "
        f"MB/s of payload ({result['entries']:,} x {result['size']} B, one bookie's storage "
        f"engine, no network; {result['filesystem']})",
        f"         latency of one batch of {result['batch_entries']:,} entries, from "
        f"add_entries to durable, up to {result['window']} batches in flight: p50 "
        f"{result['p50_ms']:.2f} ms  p99 {result['p99_ms']:.2f} ms",
        f"disk     the raw disk under the bench's folder, measured just before the run, to "
        f"compare with: {result['disk_fdatasync_per_s']:,.0f} fdatasync/s, "
        f"{'-' if direct is None else f'{direct:,.1f}'} MB/s of direct (O_DIRECT) writes"]
