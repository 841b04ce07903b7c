"""``bkctl bench scale ...``: cost against size, one sweep per command
(``appliance.bench.scale``); each prints a row per size and the growth
exponent, and with ``--plot`` writes the curve to a PNG."""

from __future__ import annotations

import click

from cli.common import client_knob_options, echo_json, json_option, library_errors


def _points(text: str) -> list[int]:
    try:
        points = [int(p.replace("_", "")) for p in text.split(",") if p.strip()]
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a comma-separated list of integers",
                                 param_hint="--points") from None
    if not points or min(points) < 1:
        raise click.BadParameter("give positive sizes, e.g. 1,100,1000", param_hint="--points")
    return points


def _common(default_points: str):
    def decorate(f):
        f = click.option("--points", default=default_points, show_default=True,
                         help="Comma-separated sizes to measure.")(f)
        f = click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
                         help="Write the curve to this PNG.")(f)
        f = click.option("--dir", "workdir", type=click.Path(file_okay=False, exists=True),
                         default=None, help="Temporary files under DIR (default: $TMPDIR).")(f)
        return json_option(library_errors(f))
    return decorate


def _report(rows, x, ys, plot_path, title, as_json, by=None):
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.bench.scale import growth_exponent, plot_curve

    groups = sorted({r[by] for r in rows}) if by else [None]
    growth = {}
    for g in groups:
        part = [r for r in rows if by is None or r[by] == g]
        for y in ys:
            growth[f"{g}:{y}" if g else y] = growth_exponent(part, x, y)
    if plot_path:
        if not str(plot_path).lower().endswith(".png"):
            raise click.BadParameter("needs a .png file name", param_hint="--plot")
        plot_curve(rows, x, ys, plot_path, title, by)
    if as_json:
        echo_json({"rows": rows, "growth_exponent": growth, "plot": plot_path})
        return
    click.echo("growth exponent (log-log slope, first to last size; 0 constant, 1 linear): "
               + ", ".join(f"{k} {v}" for k, v in growth.items()))
    if plot_path:
        click.echo(f"plot: {plot_path}")


def _progress(as_json):
    return (lambda _line: None) if as_json else click.echo


@click.group("scale", short_help="How the costs grow with size.")
def scale():
    """Cost against size: ledgers written at once, ledgers stored, unflushed
    journal, metadata size, open handles (docs/PERFORMANCE.md "Scale")."""


@scale.command("ledgers", short_help="Adds/s and p99 against concurrent ledgers.")
@_common("1,100,1000,10000")
@click.option("--entries", type=click.IntRange(min=1), default=50_000, show_default=True,
              help="Adds per closed-loop point (at least one per ledger).")
@click.option("--rate", type=click.FloatRange(min=1), default=10_000.0, show_default=True,
              help="Open-loop adds/s for the latency points.")
@click.option("--duration-s", type=click.FloatRange(min=0.1), default=10.0, show_default=True,
              help="Seconds of each open-loop point.")
@client_knob_options
def ledgers(points, plot_path, workdir, as_json, entries, rate, duration_s, gc_threshold,
            switch_interval_us, add_messages_inflight):
    """Adds/s (closed loop) and p99 (open loop, from the scheduled send
    time) against the ledgers one client writes at once, 1 KB E3/W3/A2.

    \b
    Example:
      bkctl bench scale ledgers --points 1,100,1000,10000 --plot ledgers.png
    """
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.bench.scale import ledgers_curve

    rows = ledgers_curve(_points(points), entries, rate=rate, duration_s=duration_s,
                         workdir=workdir, progress=_progress(as_json), gc_threshold=gc_threshold,
                         switch_interval_us=switch_interval_us,
                         add_messages_inflight=add_messages_inflight)
    _report(rows, "ledgers", ["adds_per_s", "open_p99_ms"], plot_path,
            "adds/s and p99 against ledgers written at once", as_json)


@scale.command("stored", short_help="Bookie boot time and RSS against ledgers.")
@_common("1000,10000,100000,1000000")
def stored(points, plot_path, workdir, as_json):
    """A bookie's boot-to-serving time and RSS against the ledgers it stores.

    \b
    Example:
      bkctl bench scale stored --points 1000,100000,1000000 --plot stored.png
    """
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.bench.scale import stored_curve

    rows = stored_curve(_points(points), workdir, progress=_progress(as_json))
    _report(rows, "ledgers", ["boot_to_serving_s", "rss_mb"], plot_path,
            "bookie boot and memory against ledgers stored", as_json)


@scale.command("journal", short_help="Boot time against the unflushed journal.")
@_common("512,1024,2048,4096,8192")
@click.option("--entry-bytes", type=click.IntRange(min=1), default=65536, show_default=True,
              help="Payload bytes per entry.")
def journal(points, plot_path, workdir, as_json, entry_bytes):
    """Boot-to-serving time against the unflushed journal (MB) at a kill -9.

    \b
    Example:
      bkctl bench scale journal --points 512,2048,8192 --plot journal.png
    """
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.bench.scale import journal_curve

    rows = journal_curve(_points(points), entry_bytes, workdir, progress=_progress(as_json))
    _report(rows, "journal_mb", ["boot_to_serving_s"], plot_path,
            "boot against unflushed journal at a crash", as_json)


@scale.command("metadata", short_help="Metadata times against ledgers stored.")
@_common("1000,10000,100000")
@click.option("--backend", type=click.Choice(["all", "sqlite", "zk"]), default="all",
              show_default=True, help="Stores to measure (zk: a temporary ZooKeeper).")
def metadata(points, plot_path, workdir, as_json, backend):
    """Create, open and list times against the ledgers in the metadata store.

    \b
    Example:
      bkctl bench scale metadata --points 1000,10000,100000 --plot metadata.png
    """
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.bench.scale import metadata_curve

    backends = ("sqlite", "zk") if backend == "all" else (backend,)
    rows = metadata_curve(_points(points), backends, workdir, progress=_progress(as_json))
    _report(rows, "ledgers", ["create_ms", "open_ms", "list_ms"], plot_path,
            "metadata cost against ledgers stored", as_json, by="backend")


@scale.command("handles", short_help="Client RSS against open write handles.")
@_common("100,1000,10000")
def handles(points, plot_path, workdir, as_json):
    """The client's RSS against its open write handles (KB per handle).

    \b
    Example:
      bkctl bench scale handles --points 100,1000,10000 --plot handles.png
    """
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.bench.scale import handles_curve

    rows = handles_curve(_points(points), workdir, progress=_progress(as_json))
    _report([r for r in rows if r["handles"]], "handles", ["added_mb"], plot_path,
            "client memory against open write handles", as_json)
