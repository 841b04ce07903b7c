"""bkctl up / down / status: run and inspect the appliance of a config."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import click

from cli.common import config_option, echo_json, human_bytes, json_option, library_errors

PROBE_TIMEOUT_MS = 500


def _load(config_path: str):
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.config import load_config

    return load_config(config_path)


@click.command(short_help="Start the appliance (foreground or --detach).")
@click.option("--detach", is_flag=True,
              help="Start in the background; return once every bookie and log server "
                   "answers.")
@config_option
@library_errors
def up(detach, config_path):
    """Start the supervisor, its bookies and its log servers (`[log] servers`;
    foreground; Ctrl-C stops them).

    \b
    Example:
      bkctl up --config configs/local.toml
      bkctl up --detach && bkctl status
    """
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.config.host_checks import check_host

    config = _load(config_path)
    check_host(config)  # refuse a bad host before any process starts
    if not detach:
        # on use: keeps bkctl's start-up short (cli/__init__.py)
        from appliance.supervisor.supervisor import main as supervisor_main

        raise SystemExit(supervisor_main(["--config", str(config.path)]))
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from storage.aligned_io import make_dirs

    make_dirs(config.run_path)
    log_path = config.run_path / "supervisor.log"
    with _open_owner_only(log_path) as out:
        proc = subprocess.Popen([sys.executable, "-m", "appliance.supervisor", "--config",
                                 str(config.path)], stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    _wait_until_up(config, proc, log_path)
    click.echo(f"appliance up: {len(config.bookies)} bookies (supervisor pid {proc.pid}, "
               f"logs in {config.run_path})")


def _open_owner_only(path: Path):
    """``path`` opened for appending, 0600 whatever the umask (also when an
    earlier run left it with a wider mode): every file the appliance writes
    is its owner's only (docs/SECURITY.md)."""
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from storage.aligned_io import FILE_MODE

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
    except OSError:
        os.close(fd)
        raise
    return os.fdopen(fd, "ab")


def _wait_until_up(config, proc, log_path: Path) -> None:
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.logservice.probe import log_server_info
    from appliance.supervisor.probe import bookie_info, probe_curve
    from appliance.supervisor.supervisor import read_state

    curve = probe_curve(config)
    deadline = time.monotonic() + config.supervisor.start_timeout_ms / 1000.0
    waiting = list(config.bookies)
    servers = config.log_server_ids()  # then the log servers (they need the bookies)
    while waiting or servers or (read_state(config) or {}).get("pid") != proc.pid:
        if proc.poll() is not None:
            raise click.ClickException(f"the supervisor exited ({proc.returncode}): "
                                       f"{_last_line(log_path)}")
        waiting = [b for b in waiting
                   if bookie_info(b.endpoint, PROBE_TIMEOUT_MS, curve=curve) is None]
        if not waiting:
            servers = [s for s in servers if log_server_info(
                config.log_server_endpoint(s), PROBE_TIMEOUT_MS, curve=curve) is None]
        if time.monotonic() > deadline:
            names = ", ".join([b.id for b in waiting] + servers) or "the supervisor"
            raise click.ClickException(
                f"{names} did not answer within {config.supervisor.start_timeout_ms} "
                f"ms; see {config.run_path} (the supervisor keeps trying; `bkctl down` stops it)")
        time.sleep(0.1)


def _last_line(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "(no log)"
    return lines[-1] if lines else "(empty log)"


@click.command(short_help="Stop the appliance started from the config.")
@config_option
@library_errors
def down(config_path):
    """Stop the appliance started from the same config, cleanly.

    \b
    Example:
      bkctl down --config configs/local.toml
    """
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.supervisor.supervisor import pid_alive, read_state, supervisor_alive

    config = _load(config_path)
    state = read_state(config)
    if state is None:
        raise click.ClickException(f"no appliance is running from {config.path}")
    timeout_s = 2 * config.supervisor.stop_timeout_ms / 1000.0 + 10  # log servers, bookies
    targets = []
    if supervisor_alive(state):
        targets.append(state["pid"])  # it stops its bookies (`bkctl up` in a terminal too)
    else:  # the supervisor died: stop its bookies and log servers ourselves
        processes = {**state.get("bookies", {}), **state.get("log_servers", {})}
        targets += [pid for process_id, pid in processes.items()
                    if pid_alive(pid, process_id)]
        config.run_path.joinpath("supervisor.json").unlink(missing_ok=True)
    for pid in targets:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while any(pid_alive(p) for p in targets):
        if time.monotonic() > deadline:
            raise click.ClickException(f"processes {targets} did not stop in {timeout_s:.0f}s")
        time.sleep(0.05)
    click.echo("appliance stopped")


@click.command(short_help="Show each bookie and whether it serves.")
@json_option
@config_option
@library_errors
def status(as_json, config_path):
    """Show each bookie: id, state (up/down/read-only), pid, endpoint, how
    often the supervisor restarted it since `bkctl up`, how long its process
    has run, how its last process ended (exit code or signal, and when), its
    placement labels (host, rack), disk use
    (bytes under its directories, and the fullest file system's used share:
    a bookie turns read-only at server.disk_usage_max), its entry logs (live
    bytes the index points at, garbage that compaction or GC can give back,
    files, open logs), and its ledgers in BP-46 limbo (repairing from peers;
    `bkctl bookie info ID` for details).  With zk:// metadata, the bookies
    other hosts registered follow (local = false; disk use, restarts,
    uptime and last exit not shown: no supervisor of this host watches them).
    With [cold_storage] on, a last line (--json: "tiers") gives the bytes hot
    (the bookies' live entry-log bytes) and cold (the moved segments' files).

    The log servers of the config (`[log] servers`) follow: id, state
    (up/down), pid, endpoint, restarts, uptime and the logs each owns.

    Exit code 0 when every bookie of the config is serving (up or
    read-only) and, while a supervisor (`bkctl up`) runs the config, every
    log server answers; 1 otherwise (the listing is printed either way),
    so a script can use it as a health check.  Bookies started without the
    supervisor have no log servers to wait for.

    \b
    Example:
      bkctl status --json
      bkctl status > /dev/null || echo "a bookie is down"
    """
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.supervisor.supervisor import read_state, supervisor_alive

    config = _load(config_path)
    state, now_s = read_state(config), time.time()
    rows = [_bookie_status(config, b, state, now_s) for b in config.bookies]
    serving = all(r["state"] in ("up", "read-only") for r in rows)
    rows += _other_hosts_bookies(config)
    servers = [_log_server_status(config, sid, state, now_s) for sid in config.log_server_ids()]
    if supervisor_alive(state):  # it starts the log servers: they count
        serving = serving and all(r["state"] == "up" for r in servers)
    tiers = _tiers(config, rows)
    if as_json:
        echo_json({"config": str(config.path), "bookies": rows, "log_servers": servers,
                   **({"tiers": tiers} if tiers else {})})
    else:
        _echo_status(rows)
        _echo_log_servers(servers)
        if tiers:
            hot = tiers["hot_bytes"]
            click.echo(f"tiers: hot {'-' if hot is None else human_bytes(hot)} (live "
                       f"entry-log bytes on the bookies), cold {human_bytes(tiers['cold_bytes'])}"
                       f" in {tiers['cold_segments']} segment(s) at {tiers['cold_uri']}")
    if not serving:
        click.get_current_context().exit(1)


def _echo_status(rows: list[dict]) -> None:
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.supervisor.runs import describe_exit

    for r in rows:
        used = r["fs_used"]
        limbo = f"  limbo={r['limbo_ledgers']}" if r["limbo_ledgers"] else ""
        logs = "" if r["live_bytes"] is None else (
            f"  live={human_bytes(r['live_bytes'])} garbage={human_bytes(r['garbage_bytes'])}"
            f" entry_logs={r['entry_logs']}")
        disk = "other host" if r["disk_bytes"] is None else f"disk={human_bytes(r['disk_bytes'])}"
        click.echo(f"{r['id']:<12} {r['state']:<10} pid={r['pid'] or '-':<8} "
                   f"{r['endpoint']}  host={r['host']} rack={r['rack']}  {disk}"
                   f"  fs_used={'-' if used is None else f'{used:.0%}'}{logs}{limbo}")
        if r["restarts"] is not None or r["uptime_s"] is not None:
            uptime = "-" if r["uptime_s"] is None else f"{r['uptime_s']:.0f}s"
            click.echo(f"{'':<12} restarts={_dash(r['restarts'])} uptime={uptime}"
                       f"  last exit: {describe_exit(r['last_exit'])}"
                       f"{_held(r, 'bookie')}")


def _held(row: dict, group: str) -> str:
    """What the status line adds for a process the operator stopped."""
    if not row.get("stopped_by_operator"):
        return ""
    return f"; left down until `bkctl {group} start {row['id']}`"


def _log_server_status(config, server_id: str, state: dict | None, now_s: float) -> dict:
    """A log server of this config: its PING answer and its runs."""
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.logservice.probe import log_server_info
    from appliance.supervisor.probe import probe_curve
    from appliance.supervisor.runs import supervision

    endpoint = config.log_server_endpoint(server_id)
    info = log_server_info(endpoint, PROBE_TIMEOUT_MS, curve=probe_curve(config))
    pid = info.get("pid") if info else None
    return {"id": server_id, "state": "up" if info else "down", "pid": pid,
            "endpoint": endpoint, "logs": info.get("logs") if info else None,
            "metrics_url": info.get("metrics_url") if info else None,
            "read_endpoint": info.get("read_endpoint") if info else None,
            **supervision(state, server_id, pid, now_s)}


def _echo_log_servers(rows: list[dict]) -> None:
    for r in rows:
        uptime = "-" if r["uptime_s"] is None else f"{r['uptime_s']:.0f}s"
        logs = "-" if r["logs"] is None else len(r["logs"])
        click.echo(f"{r['id']:<12} {r['state']:<10} pid={r['pid'] or '-':<8} {r['endpoint']}"
                   f"  restarts={_dash(r['restarts'])} uptime={uptime} logs={logs}")
        if r["state"] == "down" and r["last_exit"]:
            # on use: keeps bkctl's start-up short (cli/__init__.py)
            from appliance.supervisor.runs import describe_exit

            click.echo(f"{'':<12} last exit: {describe_exit(r['last_exit'])}"
                       f"{_held(r, 'log-server')}")
        if r["read_endpoint"] or r["metrics_url"]:
            click.echo(f"{'':<12} reads={_dash(r['read_endpoint'])}"
                       f"  metrics={_dash(r['metrics_url'])}")


def _dash(value) -> str:
    return "-" if value is None else str(value)


def _tiers(config, rows: list[dict]) -> dict | None:
    """With [cold_storage] on: bytes hot (the bookies' live entry-log bytes)
    and cold (the cold segments' files, from the logs' metadata)."""
    if not config.cold_storage.uri:
        return None
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.errors import MetadataError, NoSuchLogError
    from appliance.meta.logs import LogManager
    from storage.metadata import open_store

    live = [r["live_bytes"] for r in rows if r.get("live_bytes") is not None]
    cold_bytes = cold_segments = 0
    try:
        with open_store(config.metadata.uri, **config.metadata.store_options()) as store:
            logs = LogManager(store)
            for name in logs.list_logs():
                try:
                    md = logs.read_log(name)[0]
                except NoSuchLogError:
                    continue  # deleted since it was listed
                for seg in md.live_segments:
                    if seg.cold is not None:
                        cold_bytes += seg.cold.bytes
                        cold_segments += 1
    except MetadataError as exc:
        click.echo(f"cold storage bytes unknown: {exc}", err=True)
        return None
    uri = config.cold_storage.uri.split("?", 1)[0]
    return {"hot_bytes": sum(live) if live else None, "cold_bytes": cold_bytes,
            "cold_segments": cold_segments, "cold_uri": uri}


def _other_hosts_bookies(config) -> list[dict]:
    """With zk:// metadata, the bookies other hosts registered (their disks
    are not visible from here).  Probed over their endpoints; with CURVE on,
    this host's key is not theirs, so their state is the registry's."""
    if not config.metadata.uri.startswith("zk://"):
        return []  # SQLite metadata: every bookie is in this config
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.errors import MetadataError
    from appliance.meta.bookies import BookieRegistry
    from storage.metadata import open_store

    try:
        with open_store(config.metadata.uri, **config.metadata.store_options()) as store:
            live = BookieRegistry(store).available()
    except MetadataError as exc:
        click.echo(f"other hosts' bookies unknown: {exc}", err=True)
        return []
    mine = {b.id for b in config.bookies}
    rows = []
    for bookie_id, doc in sorted(live.items()):
        if bookie_id in mine:
            continue
        info = doc.get("info") or {}
        row = {**_probe_row(bookie_id, doc["endpoint"], False if config.security.curve else
                            None), "host": info.get("host"), "rack": info.get("rack"),
               "local": False}
        if config.security.curve:  # registered = alive (its session holds the entry)
            row.update(state="read-only" if doc.get("read_only") else "up",
                       pid=info.get("pid"))
        rows.append(row)
    return rows


def _probe_row(bookie_id: str, endpoint: str, curve) -> dict:
    """A status row from the bookie's INFO answer (None fields when down);
    ``curve``: a key pair, None (plain), or False (do not probe)."""
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.supervisor.probe import bookie_info

    info = None if curve is False else bookie_info(endpoint, PROBE_TIMEOUT_MS, curve=curve)
    state = "down"
    if info is not None:
        state = "read-only" if info.get("read_only") else "up"
    usage = (info or {}).get("disk_usage") or {}
    storage = (info or {}).get("storage") or {}
    disk = storage.get("disk") or {}
    return {"id": bookie_id, "state": state, "pid": info.get("pid") if info else None,
            "read_only_reason": (info or {}).get("read_only_reason"),
            "fs_used": max(usage.values()) if usage else None,
            "limbo_ledgers": storage.get("limbo_ledgers") if info else None,
            "live_bytes": disk.get("live_bytes"), "garbage_bytes": disk.get("garbage_bytes"),
            "entry_logs": disk.get("entry_logs"), "open_logs": disk.get("open_logs"),
            "entry_log_bytes": disk.get("entry_log_bytes"),
            "gc": (info or {}).get("gc"), "metrics_url": (info or {}).get("metrics_url"),
            "endpoint": endpoint, "journal_dir": None, "ledger_dir": None, "disk_bytes": None,
            "restarts": None, "uptime_s": None, "last_exit": None, "left_down": None,
            "stopped_by_operator": None, "local": True}


def _bookie_status(config, b, state: dict | None, now_s: float) -> dict:
    """A bookie of this config: its INFO answer, disk use, and what the
    supervisor's ``state`` file records of its runs."""
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.supervisor.probe import probe_curve
    from appliance.supervisor.runs import supervision

    row = _probe_row(b.id, b.endpoint, probe_curve(config))
    return {**row, **supervision(state, b.id, row["pid"], now_s), "host": b.host,
            "rack": b.rack, "journal_dir": str(b.journal_dir),
            "ledger_dir": str(b.ledger_dir),
            "disk_bytes": _du(b.journal_dir) + _du(b.ledger_dir)}


def _du(path) -> int:
    """Bytes allocated on disk under ``path`` (0 if missing)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                continue
    return total
