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
    direct = result["disk_direct_mb_per_s"]
    click.echo(f"storage  {result['adds_per_s']:>12,.0f} adds/s {result['mb_per_s']:>9,.1f} MB/s"
               f"  p50 {result['p50_ms']:.2f} ms  p99 {result['p99_ms']:.2f} ms"
               f"  ({result['entries']:,} x {size} B, {result['filesystem']})")
    click.echo(f"disk     {result['disk_fdatasync_per_s']:>12,.0f} fdatasync/s "
               f"{direct if direct is None else round(direct, 1)} MB/s O_DIRECT")
