"""bkctl top: a live view of every bookie and log server, built on their
Prometheus metrics.

Each refresh scrapes each bookie's and log server's ``metrics_url`` (parsed
with ``prometheus_client``'s text parser) and shows what changed since the
previous scrape.  Per bookie: adds/s and reads/s (entries), add p99 (from
the latency histogram's buckets that filled in the interval: the upper
bound of the bucket holding the 99th percentile), journal fsync p99,
pending replies, disk used and entry-log live / garbage bytes.  Per log
server: records/s written, write requests/s, write p99, logs owned and
producers.
"""

from __future__ import annotations

import time
import urllib.request

import click

from cli.common import config_option, echo_json, is_terminal, json_option, library_errors

SCRAPE_TIMEOUT_S = 2.0


def scrape(url: str) -> dict[str, float]:
    """{sample name with labels: value} of one /metrics page."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as resp:
        text = resp.read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def _counter_sum(sample: dict, prefix: str) -> float:
    return sum(v for k, v in sample.items() if k.startswith(prefix))


def quantile_bound(before: dict, after: dict, histogram: str, q: float) -> float | None:
    """Upper bound (seconds) of the bucket holding quantile ``q`` of the
    observations made between two scrapes; None if there were none."""
    buckets = []
    for key, value in after.items():
        if key.startswith(f"{histogram}_bucket{{le="):
            bound = key[len(histogram) + len("_bucket{le="):-1]
            buckets.append((float(bound), value - before.get(key, 0.0)))
    buckets.sort()
    if not buckets or buckets[-1][1] <= 0:
        return None
    target = q * buckets[-1][1]
    for bound, cumulative in buckets:
        if cumulative >= target:
            return bound
    return None


def rows(before: dict, after: dict, seconds: float) -> dict:
    """The figures of one bookie between two scrapes."""
    def rate(prefix: str) -> float:
        return max(0.0, _counter_sum(after, prefix) - _counter_sum(before, prefix)) / seconds

    used = [v for k, v in after.items() if k.startswith("bookkeeper_disk_used_ratio{")]
    add_p99 = quantile_bound(before, after, "bookkeeper_bookie_add_latency_seconds", 0.99)
    sync_p99 = quantile_bound(before, after, "bookkeeper_journal_sync_latency_seconds", 0.99)
    return {
        "adds_per_s": round(rate("bookkeeper_bookie_add_entries_total{code=OK"), 1),
        "add_errors_per_s": round(rate("bookkeeper_bookie_add_entries_total") -
                                  rate("bookkeeper_bookie_add_entries_total{code=OK"), 1),
        "reads_per_s": round(rate("bookkeeper_bookie_read_entries_total"), 1),
        "add_p99_ms": None if add_p99 is None else add_p99 * 1000,
        "fsync_p99_ms": None if sync_p99 is None else sync_p99 * 1000,
        "pending_replies": after.get("bookkeeper_bookie_pending_replies"),
        "disk_used": max(used) if used else None,
        "live_mb": round(after.get("bookkeeper_entrylog_live_bytes", 0) / 1e6, 1),
        "garbage_mb": round(after.get("bookkeeper_entrylog_garbage_bytes", 0) / 1e6, 1),
    }


def server_rows(before: dict, after: dict, seconds: float) -> dict:
    """The figures of one log server between two scrapes."""
    def rate(name: str) -> float:
        return max(0.0, after.get(name, 0.0) - before.get(name, 0.0)) / seconds

    p99 = quantile_bound(before, after, "bookkeeper_logserver_write_latency_seconds", 0.99)
    return {
        "records_per_s": round(rate("bookkeeper_logserver_records_total"), 1),
        "requests_per_s": round(rate("bookkeeper_logserver_requests_total"), 1),
        "write_p99_ms": None if p99 is None else p99 * 1000,
        "owned_logs": after.get("bookkeeper_logserver_owned_logs"),
        "producers": after.get("bookkeeper_logserver_producers"),
    }


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


BOOKIE_HEADER = (f"{'bookie':<12} {'adds/s':>10} {'err/s':>7} {'reads/s':>10} {'add p99':>9} "
                 f"{'fsync p99':>9} {'pending':>8} {'disk':>5} {'live MB':>9} {'garbage MB':>10}")
SERVER_HEADER = (f"{'log server':<12} {'records/s':>10} {'requests/s':>10} {'write p99':>9} "
                 f"{'logs':>6} {'producers':>9}")


def _bookie_row(f: dict) -> str:
    return (f"{_fmt(f['adds_per_s'], ',.0f'):>10} "
            f"{_fmt(f['add_errors_per_s'], ',.0f'):>7} {_fmt(f['reads_per_s'], ',.0f'):>10} "
            f"{_fmt(f['add_p99_ms'], '.1f'):>6} ms {_fmt(f['fsync_p99_ms'], '.1f'):>6} ms "
            f"{_fmt(f['pending_replies'], '.0f'):>8} {_fmt(f['disk_used'], '.0%'):>5} "
            f"{f['live_mb']:>9,.1f} {f['garbage_mb']:>10,.1f}")


def _server_row(f: dict) -> str:
    return (f"{_fmt(f['records_per_s'], ',.0f'):>10} "
            f"{_fmt(f['requests_per_s'], ',.0f'):>10} {_fmt(f['write_p99_ms'], '.1f'):>6} ms "
            f"{_fmt(f['owned_logs'], '.0f'):>6} {_fmt(f['producers'], '.0f'):>9}")


def _table(header: str, figures: dict[str, dict | str], row) -> str:
    """A header, then a line per process: its figures, or why there are none."""
    lines = [header]
    for name, f in figures.items():
        lines.append(f"{name:<12} {f if isinstance(f, str) else row(f)}")
    return "\n".join(lines)


@click.command(short_help="A live view of every bookie's and log server's load.")
@click.option("--interval", "interval_s", type=click.FloatRange(min=0.2), default=1.0,
              show_default=True, help="Seconds between refreshes.")
@click.option("--iterations", type=click.IntRange(min=1), default=None,
              help="Stop after this many refreshes (default: until Ctrl-C).")
@json_option
@config_option
@library_errors
def top(interval_s, iterations, as_json, config_path):
    """A live view of every bookie: adds/s, reads/s, add and fsync p99, replies
    waiting for their fsync, disk use and entry-log live / garbage bytes,
    from each bookie's Prometheus metrics ([[bookies]] metrics_address);
    then every log server: records/s, write requests/s, write p99, logs
    owned and producers ([log] metrics_address).  Refreshed every
    --interval seconds until Ctrl-C. With --json, one JSON document per
    refresh (a line each: "bookies" and "log_servers").

    \b
    Example:
      bkctl top
      bkctl top --iterations 5 --json
    """
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.config import load_config

    config = load_config(config_path)
    urls, server_urls = _bookie_urls(config), _log_server_urls(config)
    if not any(urls.values()) and not any(server_urls.values()):
        raise click.ClickException("no bookie serves metrics: set [[bookies]] metrics_address "
                                   "(e.g. \"127.0.0.1:0\") and restart them; bkctl status "
                                   "shows which are up")
    watched = {**urls, **server_urls}
    previous = {k: _safe_scrape(u) for k, u in watched.items()}
    taken = time.monotonic()
    done = 0
    try:
        while iterations is None or done < iterations:
            time.sleep(max(0.0, taken + interval_s - time.monotonic()))  # the refresh period
            now = time.monotonic()
            current = {k: _safe_scrape(u) for k, u in watched.items()}
            args = (previous, current, now - taken)
            bookies = _figures(urls, *args, rows, "down or no metrics_address")
            servers = _figures(server_urls, *args, server_rows,
                               "down or no [log] metrics_address")
            previous, taken = current, now
            done += 1
            _show(bookies, servers, as_json, interval_s, clear=done > 1)
    except KeyboardInterrupt:
        pass


def _bookie_urls(config) -> dict[str, str | None]:
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.supervisor.probe import bookie_info, probe_curve

    urls = {}
    for b in config.bookies:
        info = bookie_info(b.endpoint, 2000, curve=probe_curve(config))
        urls[b.id] = None if info is None else info.get("metrics_url")
    return urls


def _log_server_urls(config) -> dict[str, str | None]:
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.logservice.probe import log_server_info
    from appliance.supervisor.probe import probe_curve

    urls = {}
    curve = probe_curve(config)
    for sid in config.log_server_ids():
        info = log_server_info(config.log_server_endpoint(sid), 2000, curve=curve)
        urls[sid] = None if info is None else info.get("metrics_url")
    return urls


def _figures(urls: dict, previous: dict, current: dict, seconds: float, compute,
             no_url: str) -> dict[str, dict | str]:
    """Per process: its figures between the two scrapes, or why there are none."""
    figures: dict[str, dict | str] = {}
    for key, url in urls.items():
        if url is None:
            figures[key] = no_url
        elif current[key] is None or previous[key] is None:
            figures[key] = f"no answer at {url}"
        else:
            figures[key] = compute(previous[key], current[key], seconds)
    return figures


def _show(bookies: dict, servers: dict, as_json: bool, interval_s: float, clear: bool) -> None:
    if as_json:
        echo_json({"interval_s": interval_s, "bookies": bookies, "log_servers": servers})
        return
    if clear and is_terminal():
        click.echo("\x1b[2J\x1b[H", nl=False)  # clear the screen
    click.echo(_table(BOOKIE_HEADER, bookies, _bookie_row))
    if servers:
        click.echo(_table(SERVER_HEADER, servers, _server_row))


def _safe_scrape(url: str | None) -> dict | None:
    if url is None:
        return None
    try:
        return scrape(url)
    except (OSError, ValueError):
        return None


