"""``bkctl bench repair``, ``bench boot`` and ``bench autorecovery``: BP-46
self-repair rate, crash-restart (journal replay) time and automatic
re-replication of a lost bookie, on bookie processes of their own under a
temp dir.  How they are counted: ``appliance.bench.repair``."""

from __future__ import annotations

import click

from cli.common import echo_json, json_option, library_errors


def _common(f):
    """--entry-bytes, --dir and --json, shared by these commands."""
    for option in reversed([
            click.option("--entry-bytes", type=click.IntRange(min=1), default=65536,
                         show_default=True, help="Payload bytes per entry."),
            click.option("--dir", "workdir", type=click.Path(file_okay=False, exists=True),
                         default=None, help="Temp dir for the bookies (default: $TMPDIR)."),
            json_option]):
        f = option(f)
    return f


@click.command("repair", short_help="Time for a wiped bookie to repair itself.")
@click.option("--mb", type=click.IntRange(min=1), default=1024, show_default=True,
              help="Data the repaired bookie lost (one E3/W3/A2 ledger of this size).")
@_common
@library_errors
def repair(mb, entry_bytes, workdir, as_json):
    """A bookie whose disks were replaced repairs itself from its peers
    (BP-46 phase two): boot-to-serving time, repair time, entries/s and MB/s.

    \b
    Example:
      bkctl bench repair --mb 1024 --json
    """
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.bench.repair import run_repair_bench

    doc = run_repair_bench(mb * 1024 * 1024, entry_bytes, workdir)
    if as_json:
        echo_json(doc)
        return
    click.echo(f"repair {doc['entries_copied']:,} entries / {doc['bytes_copied'] / 1e6:,.0f} MB "
               f"in {doc['repair_s']:.1f} s: {doc['entries_per_s']:,.0f} entries/s, "
               f"{doc['mb_per_s']:,.1f} MB/s copied from its peers (the wiped bookie served "
               f"again {doc['boot_to_serving_s']:.2f} s after its start, fenced while it "
               f"repaired; the data was written in {doc['write_s']:.1f} s)")


@click.command("boot", short_help="Boot time after a kill with unflushed data.")
@click.option("--journal-mb", default="256,1024", show_default=True,
              help="Comma-separated unflushed journal sizes to crash with.")
@_common
@library_errors
def boot(journal_mb, entry_bytes, workdir, as_json):
    """Boot-to-serving time of a bookie killed with SIZE of unflushed journal
    (no checkpoint since): the replay a restart waits for.

    \b
    Example:
      bkctl bench boot --journal-mb 128,512,2048
    """
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.bench.repair import run_boot_bench

    try:
        sizes = [int(x) * 1024 * 1024 for x in journal_mb.split(",") if x.strip()]
    except ValueError as exc:
        raise click.BadParameter(f"{journal_mb!r}: give sizes in MB, e.g. 256,1024") from exc
    rows = run_boot_bench(sizes, entry_bytes, workdir)
    if as_json:
        echo_json(rows)
        return
    for r in rows:
        click.echo(f"journal {r['journal_bytes'] / 1e6:>8,.0f} MB  storage open (replay) "
                   f"{r['storage_open_s']:>6.2f} s ({r['replay_mb_per_s']:,.0f} MB/s, "
                   f"{r['replayed_records']} records)  serving "
                   f"{r['boot_to_serving_s']:>6.2f} s after the start")


@click.command("autorecovery", short_help="Time to re-replicate a lost bookie.")
@click.option("--mb", type=click.IntRange(min=1), default=1024, show_default=True,
              help="Data on the lost bookie (one E3/W3/A2 ledger of this size).")
@click.option("--delay-ms", type=click.IntRange(min=0), default=0, show_default=True,
              help="autorecovery.lost_bookie_delay_ms for the run.")
@_common
@library_errors
def autorecovery(mb, delay_ms, entry_bytes, workdir, as_json):
    """A bookie is killed and wiped; nobody acts: time until the appliance
    has re-replicated its share (no fragment names it), and the copy rate.

    \b
    Example:
      bkctl bench autorecovery --mb 1024 --json
    """
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.bench.repair import run_autorecovery_bench

    doc = run_autorecovery_bench(mb * 1024 * 1024, entry_bytes, delay_ms, workdir)
    if as_json:
        echo_json(doc)
        return
    click.echo(f"autorecovery {doc['bytes'] / 1e6:,.0f} MB ({doc['entries']:,} entries): full "
               f"redundancy {doc['loss_to_full_redundancy_s']:.1f} s after the loss "
               f"(delay {delay_ms} ms); copy {doc['entries_per_s']:,.0f} entries/s, "
               f"{doc['mb_per_s']:,.1f} MB/s")


@click.command("reclaim", short_help="Time for a deleted ledger's space to return.")
@click.option("--mb", type=click.IntRange(min=1), default=256, show_default=True,
              help="Bytes written (two interleaved E3/W3/A2 ledgers together).")
@click.option("--keep", "keep_share", type=click.FloatRange(0.01, 0.9), default=0.1,
              show_default=True, help="Share of the bytes in the ledger that is kept.")
@click.option("--gc-interval-ms", type=click.IntRange(min=100), default=None,
              help="server.gc_interval_ms for the run (default: the product default).")
@click.option("--cold", is_flag=True,
              help="Write a log of --mb instead, move its sealed segments to cold storage "
                   "and time until the bookies' disk is back, nobody asking.")
@_common
@library_errors
def reclaim(mb, keep_share, gc_interval_ms, cold, entry_bytes, workdir, as_json):
    """Time for a deleted ledger's space to come back: a ledger written
    interleaved with one that is kept is deleted; time until every bookie's
    GC forgot it, then for a compaction asked of every bookie, and the
    ledger directories' size after it over the live data.  With --cold: a
    log's sealed segments are moved to cold storage (their ledgers deleted)
    and the bookies' ledger directories are watched until the moved data is
    gone from them; the sizes before and after.

    \b
    Example:
      bkctl bench reclaim --mb 256 --keep 0.1 --json
      bkctl bench reclaim --cold --mb 100 --entry-bytes 1024
    """
    if cold:
        _reclaim_cold(mb, gc_interval_ms, entry_bytes, workdir, as_json)
        return
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.bench.reclaim import run_reclaim_bench

    doc = run_reclaim_bench(mb * 1024 * 1024, entry_bytes, keep_share, gc_interval_ms,
                            workdir)
    if as_json:
        echo_json(doc)
        return
    click.echo(f"reclaim {doc['bytes_written'] / 1e6:,.0f} MB written, {keep_share:.0%} kept: "
               f"GC forgot the deleted ledger after {doc['gc_s']:.1f} s (gc_interval_ms "
               f"{doc['gc_interval_ms']}), {doc['compaction']} compaction {doc['compact_s']:.1f} s "
               f"({doc['copy_mb_per_s']} MB/s copied); space back {doc['space_back_s']:.1f} s "
               f"after the delete; the ledger dir then held {doc['after_over_live']}x the live "
               f"data")


def _reclaim_cold(mb, gc_interval_ms, entry_bytes, workdir, as_json) -> None:
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.bench.cold_reclaim import run_cold_reclaim_bench

    doc = run_cold_reclaim_bench(mb * 1024 * 1024, entry_bytes, gc_interval_ms, workdir)
    if as_json:
        echo_json(doc)
        return
    mb_of = {b: f"{n / 1e6:,.1f}" for b, n in doc["ledger_dir_bytes_before"].items()}
    after = {b: f"{n / 1e6:,.1f}" for b, n in doc["ledger_dir_bytes_after"].items()}
    click.echo(f"reclaim --cold: {doc['segments_moved']} segments ({doc['bytes_moved'] / 1e6:,.1f}"
               f" MB) moved in {doc['offload_s']:.1f} s ({doc['offload_mb_per_s']} MB/s); "
               f"bookies' ledger dirs {mb_of} MB before, {after} MB "
               f"{doc['space_back_s']:.1f} s after the move (gc_interval_ms "
               f"{doc['gc_interval_ms']}); load average (1, 5, 15 min) before the run "
               f"{doc['load_average_before']}")
