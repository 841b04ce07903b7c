"""bkctl bookie: re-replicate a lost bookie's data, list under-replicated ledgers,
show a bookie's identity and BP-46 repair, accept replaced disks.

Thin commands over ``appliance.rereplication``: progress lines go to stderr,
the summary (or one JSON document with ``--json``) to stdout; the exit code
is non-zero when any ledger was skipped or failed.
"""

from __future__ import annotations

import time

import click

from appliance.errors import BKError
from cli.common import config_option, echo_json, json_option, library_errors, password_options


@click.group(short_help="Bookie maintenance and inspection.")
def bookie():
    """Bookie maintenance: re-replicate a lost bookie's ledgers, show a
    bookie's identity and repair progress, accept replaced disks; start,
    stop or restart one bookie of a running appliance."""


@bookie.command(short_help="Copy a lost bookie's entries elsewhere.")
@click.argument("bookie_id")
@password_options("Ledger password (repeat for several; default: none). Ledgers whose "
                  "password matches none are skipped and reported.", multiple=True)
@click.option("--recover-open", is_flag=True,
              help="Fence and close OPEN / IN_RECOVERY ledgers first (stops their writer).")
@click.option("--dry-run", is_flag=True, help="Only show what would be copied, and where.")
@json_option
@config_option
@library_errors
def recover(bookie_id, passwords, recover_open, dry_run, as_json, config_path):
    """Copy every entry BOOKIE_ID held to other bookies and update the ledger
    metadata, so each fragment has its full write quorum again.

    CLOSED ledgers only, unless --recover-open. Exit code 1 when a ledger was
    skipped (open, wrong password, no writable replacement) or failed.

    \b
    Example:
      bkctl bookie recover bookie-3 --password secret --dry-run
      bkctl bookie recover bookie-3 --password secret --json
    """
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    import appliance
    from appliance.rereplication.rereplicator import Rereplicator

    keys = [p.encode() for p in passwords] or [b""]
    with appliance.connect(config_path) as bk, Rereplicator(
            bk.ledgers, bk.registry, passwords=keys, open_ledger=_opener(bk),
            on_progress=lambda line: click.echo(line, err=True), curve=bk.driver.curve) as rr:
        report = rr.recover(bookie_id, recover_open=recover_open, dry_run=dry_run)
    if as_json:
        echo_json(report.to_json())
    else:
        _print_summary(report)
    if not report.ok:
        click.get_current_context().exit(1)


def _opener(bk):
    def open_ledger(ledger_id: int, key: bytes) -> None:
        bk.open_ledger_with_key(ledger_id, key, recovery=True)
    return open_ledger


def _print_summary(report) -> None:
    verb = "would copy" if report.dry_run else "copied"
    for f in report.fragments:
        if "replacement" in f:
            click.echo(f"ledger {f['ledger_id']} entries {f['first_entry_id']}.."
                       f"{f['last_entry_id']}: {report.bookie_id} -> {f['replacement']} "
                       f"({verb} {f['entries']}"
                       f"{'; the recovery had replaced it' if f.get('by_recovery') else ''})")
        else:
            click.echo(f"ledger {f['ledger_id']}: {f['action']}")
    for s in report.skipped:
        click.echo(f"skipped ledger {s['ledger_id']}: {s['reason']}")
    for s in report.failed:
        click.echo(f"FAILED ledger {s['ledger_id']}: {s['reason']}")
    if report.dry_run:
        click.echo(f"dry run: {len(report.fragments)} fragment(s) planned, "
                   f"{len(report.skipped)} ledger(s) would be skipped")
        return
    click.echo(f"{len(report.ledgers_recovered)} ledger(s) re-replicated, "
               f"{report.entries_copied} entries copied, {len(report.skipped)} skipped, "
               f"{len(report.failed)} failed")


@bookie.command(short_help="List ledgers that name a missing bookie.", name="underreplicated")
@json_option
@config_option
@library_errors
def underreplicated_(as_json, config_path):
    """List ledgers whose fragments name a bookie that is not registered now
    (down or gone): what `bkctl bookie recover` would act on; and the ledgers
    autorecovery has marked under-replicated (durable marks, `marked`).

    \b
    Example:
      bkctl bookie underreplicated --json
    """
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    import appliance
    from appliance.autorecovery.marks import Marks
    from appliance.rereplication.rereplicator import underreplicated

    with appliance.connect(config_path) as bk:
        found = underreplicated(bk.ledgers, bk.registry)
        marks = Marks(bk.ledgers.store).marks()
    for item in found:
        item["marked"] = item["ledger_id"] in marks
    known = {item["ledger_id"] for item in found}
    for ledger_id, mark in sorted(marks.items()):
        if ledger_id not in known:  # marked for a live bookie (share lost, decommission)
            found.append({"ledger_id": ledger_id, "state": None,
                          "missing": mark.get("missing", []), "marked": True})
    if as_json:
        echo_json(found)
        return
    for item in found:
        click.echo(f"ledger {item['ledger_id']} ({item['state'] or 'marked'}): missing "
                   f"{', '.join(item['missing'])}" + (" [marked]" if item["marked"] else ""))


@bookie.command(short_help="Show a bookie's identity and cookie state.", name="info")
@click.argument("bookie_id")
@json_option
@config_option
@library_errors
def info_(bookie_id, as_json, config_path):
    """Show BOOKIE_ID's identity and BP-46 state: the cookie on its disks and
    in the metadata store, whether it is up (with its pid, how often the
    supervisor restarted it since `bkctl up`, how long its process has run,
    and how its last process ended: exit code or signal, and when), why its
    last boot fenced its ledgers (if it did), how many ledgers are in limbo
    and the repair's progress (entries and bytes copied, ledgers waiting to
    retry and why), the scrub of closed ledgers (ledgers found short of
    entries this bookie should hold, then repaired from peers), what it
    has served since it started (adds, reads, fences, explicit LACs,
    refusals, malformed messages) and its compaction (automatic runs on or
    SUSPENDED, runs, space given back, rate limit).

    \b
    Example:
      bkctl bookie info bookie-2 --json
    """
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.config import load_config

    config = load_config(config_path)
    info = _gather_info(config, bookie_id)
    if as_json:
        echo_json(info)
        return
    _echo_identity(info)
    if info["state"] == "up":
        _echo_boot_and_repair(info)
        _echo_gc_and_counters(info)
        _echo_compaction_state(info)


def _gather_info(config, bookie_id: str) -> dict:
    """What ``bkctl bookie info`` shows: the cookies on the disks and in the
    metadata store, and what the bookie says about itself if it is up."""
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.supervisor.probe import bookie_info, probe_curve
    from appliance.supervisor.runs import supervision
    from appliance.supervisor.supervisor import read_state
    from storage import cookie as ck

    spec = config.bookie(bookie_id)
    disks = _disk_cookies(spec)
    meta_instance = _metadata_instance_id(config, bookie_id)
    live = bookie_info(spec.endpoint, 1000, curve=probe_curve(config))
    pending = ck.read_marker(str(spec.ledger_dir), ck.POSSIBLE_LOSS_NAME)
    out = {"id": bookie_id, "state": "up" if live else "down", "endpoint": spec.endpoint,
           "cookie": {"disks": disks, "metadata_instance_id": meta_instance,
                      "matches": all(d.get("instance_id") == meta_instance
                                     for d in disks.values())},
           "pending_possible_loss": (pending or {}).get("reasons"),
           "pid": (live or {}).get("pid"),
           **supervision(read_state(config), bookie_id, (live or {}).get("pid"), time.time()),
           "limbo_ledgers": None, "boot": None, "repair": None, "gc": None, "counters": None,
           "read_only": None, "read_only_reason": None, "full_disk": None,
           "compaction": None, "scrub": None}
    if live:
        out["state"] = "read-only" if live.get("read_only") else "up"
        out["read_only"], out["read_only_reason"] = live.get("read_only"), \
            live.get("read_only_reason")
        out["full_disk"] = live.get("full_disk")
        out["limbo_ledgers"] = (live.get("storage") or {}).get("limbo_ledgers")
        out["boot"], out["repair"] = live.get("boot"), live.get("repair")
        out["gc"] = live.get("gc")
        out["scrub"] = live.get("scrub")
        out["counters"] = live.get("counters")
        out["compaction"] = (live.get("storage") or {}).get("compaction")
    return out


def _disk_cookies(spec) -> dict:
    """The instance id in the cookie of each of the bookie's directories."""
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from storage import cookie as ck

    disks = {}
    for name, directory in (("journal_dir", spec.journal_dir), ("ledger_dir", spec.ledger_dir)):
        try:
            doc = ck.read_cookie(str(directory))
            disks[name] = {"path": str(directory),
                           "instance_id": doc.get("instance_id") if doc else None}
        except BKError as exc:
            disks[name] = {"path": str(directory), "error": str(exc)}
    return disks


def _metadata_instance_id(config, bookie_id: str):
    """The instance id in the metadata store's copy of the cookie (None: no copy)."""
    import json as _json

    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.meta.bookies import BookieRegistry
    from storage.metadata import open_store

    with open_store(config.metadata.uri, base_dir=config.base_dir,
                    **config.metadata.store_options()) as store:
        found = BookieRegistry(store).read_cookie(bookie_id)
    if found is None:
        return None
    try:
        return _json.loads(found[0]).get("instance_id")
    except ValueError:
        return "(unreadable)"


def _echo_identity(info: dict) -> None:
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.supervisor.runs import describe_exit

    cookie = info["cookie"]
    click.echo(f"{info['id']}: {info['state']} ({info['endpoint']})")
    uptime = "-" if info["uptime_s"] is None else f"{info['uptime_s']:.0f}s"
    click.echo(f"  pid={info['pid'] or '-'} uptime={uptime} restarts="
               f"{'-' if info['restarts'] is None else info['restarts']}"
               f"  last exit: {describe_exit(info['last_exit'])}")
    for name, d in cookie["disks"].items():
        click.echo(f"  {name:<12} {d['path']}  instance={d.get('instance_id') or d.get('error')}")
    click.echo(f"  metadata cookie instance={cookie['metadata_instance_id']}"
               f"{'' if cookie['matches'] else '  MISMATCH: see bkctl bookie fix-cookie'}")
    if info["pending_possible_loss"]:
        click.echo(f"  next start fences and repairs: {'; '.join(info['pending_possible_loss'])}")


def _echo_boot_and_repair(info: dict) -> None:
    boot = info["boot"] or {}
    reasons = boot.get("reasons") or []
    click.echo(f"  last boot: {'; '.join(reasons) if reasons else 'no possible data loss'}"
               + (f" ({boot.get('ledgers_fenced')} ledger(s) fenced and put in limbo)"
                  if reasons else ""))
    repair = info["repair"] or {}
    click.echo(f"  limbo ledgers: {info['limbo_ledgers']}  repair: {repair.get('state')}, "
               f"{repair.get('ledgers_repaired', 0)} repaired, "
               f"{repair.get('entries_copied', 0)} entries / "
               f"{repair.get('bytes_copied', 0) / 1e6:.1f} MB copied")
    for ledger_id, reason in (repair.get("failures") or {}).items():
        click.echo(f"  ledger {ledger_id} waiting to retry: {reason}")


def _echo_gc_and_counters(info: dict) -> None:
    gc = info["gc"] or {}
    click.echo(f"  gc: {gc.get('passes', 0)} passes, {gc.get('ledgers_deleted', 0)} deleted "
               f"ledgers forgotten, {gc.get('overreplicated_deleted', 0)} over-replicated "
               f"deleted ({gc.get('overreplicated_waiting', 0)} waiting out the grace), "
               f"{gc.get('logs_removed', 0)} entry logs removed")
    scrub = info.get("scrub") or {}
    if scrub.get("interval_ms"):
        click.echo(f"  scrub: {scrub.get('passes', 0)} passes, "
                   f"{scrub.get('ledgers_whole', 0)} closed ledgers whole, "
                   f"{scrub.get('ledgers_short', 0)} found short "
                   f"({scrub.get('entries_missing', 0):,} entries missing, repaired from peers), "
                   f"{scrub.get('pending', 0)} to look at")
    counters = info["counters"] or {}
    count = counters.get
    click.echo(f"  since start: {count('adds', 0):,} adds, {count('reads', 0):,} reads, "
               f"{count('fences', 0):,} fences, {count('write_lacs', 0):,} explicit LACs "
               f"({count('write_lac_multis', 0):,} WRITE_LAC_MULTI), {count('errors', 0):,} "
               f"error replies, {count('reads_refused', 0):,} reads refused, "
               f"{count('read_only_refused_adds', 0):,} adds refused read-only; "
               f"{count('requests', 0):,} requests, {count('bad_messages', 0):,} malformed, "
               f"{count('replies_dropped', 0):,} replies dropped")


def _echo_compaction_state(info: dict) -> None:
    c = info.get("compaction") or {}
    rate = c.get("rate_bytes_per_s")
    last = c.get("last") or {}
    click.echo(f"  compaction: automatic {'SUSPENDED' if c.get('suspended') else 'on'}, "
               f"{'running' if c.get('running') else 'idle'}, {c.get('runs', 0)} runs "
               f"({c.get('failures', 0)} failed), "
               f"{c.get('bytes_reclaimed_total', 0) / 1e6:.1f} MB given back, rate limit "
               + (f"{rate / 1e6:.1f} MB/s ({c.get('throttled_s_total', 0):.1f} s waited "
                  f"for it)" if rate else "none")
               + (f"; last: {last.get('kind')}, {last.get('logs_compacted')} logs rewritten"
                  if last else ""))


@bookie.command(short_help="Compact a bookie's entry logs now, or suspend/resume it.",
                name="compact")
@click.argument("bookie_id")
@click.option("--major", is_flag=True,
              help="Use storage.compaction_major_threshold (default 0.8) instead of the "
                   "minor one (0.2): more space back for more copying.")
@click.option("--suspend", "action", flag_value="suspend",
              help="Do not compact: suspend the bookie's automatic compaction (a run going "
                   "on stops after its current log) until --resume or it restarts.")
@click.option("--resume", "action", flag_value="resume",
              help="Do not compact: resume the bookie's automatic compaction.")
@click.option("--timeout", "timeout_s", type=float, default=3600.0, show_default=True,
              help="Seconds to wait for the run to finish.")
@json_option
@config_option
@library_errors
def compact_(bookie_id, major, action, timeout_s, as_json, config_path):
    """Compact BOOKIE_ID's entry logs now: the bookie first deletes the
    ledgers whose metadata is gone (its GC would take two gc_interval_ms)
    and seals its active log, so data deleted a moment ago counts; then
    logs whose live share is under the threshold are rewritten (live
    entries copied, at most storage.compaction_rate_bytes_per_s, the old
    log removed once the switch is durable; reads go on). Prints progress,
    then what was reclaimed and the disk accounting. Exit 1 if the run
    failed. It runs also while automatic compaction is suspended.

    \b
    Examples:
      bkctl bookie compact bookie-1 --major
      bkctl bookie compact bookie-1 --suspend   # no automatic runs for now
    """
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.config import load_config
    from appliance.supervisor.probe import bookie_compact, probe_curve

    if action and major:
        raise click.UsageError(f"--major starts a run; --{action} does not: give one of them")
    config = load_config(config_path)
    spec, curve = config.bookie(bookie_id), probe_curve(config)
    started = bookie_compact(spec.endpoint, major, 5000, curve=curve,
                             suspend=action == "suspend", resume=action == "resume")
    if started is None:
        raise click.ClickException(f"{bookie_id} did not answer at {spec.endpoint}: is it up? "
                                   f"(bkctl status)")
    if action:
        _echo_suspension(bookie_id, started["compaction"], as_json)
        return
    status, info = _wait_compaction(bookie_id, spec.endpoint, curve, started["ticket"],
                                    timeout_s)
    failed = status.get("failures", 0) > started["compaction"]["failures"]
    _echo_compaction_result(bookie_id, status, info, failed, as_json)
    if failed:
        click.get_current_context().exit(1)


def _echo_suspension(bookie_id: str, status: dict, as_json: bool) -> None:
    if as_json:
        echo_json({"id": bookie_id, "suspended": status.get("suspended")})
    elif status.get("suspended"):
        click.echo(f"{bookie_id}: automatic compaction suspended (a run going on stops after "
                   f"its current log) until bkctl bookie compact {bookie_id} --resume or "
                   f"the bookie restarts; bkctl bookie compact still runs")
    else:
        click.echo(f"{bookie_id}: automatic compaction resumed")


def _wait_compaction(bookie_id: str, endpoint: str, curve, ticket: int,
                     timeout_s: float) -> tuple[dict, dict]:
    """Poll INFO until the run of ``ticket`` is done, showing its progress;
    (the compaction status, the INFO document)."""
    import time

    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.supervisor.probe import bookie_info

    deadline = time.monotonic() + timeout_s
    shown = None
    while True:
        info = bookie_info(endpoint, 5000, curve=curve)
        status = ((info or {}).get("storage") or {}).get("compaction") or {}
        if status.get("requests_done", 0) >= ticket:
            return status, info
        progress = status.get("progress")
        if progress and progress != shown:
            click.echo(f"  {progress['logs_done']}/{progress['logs_total']} logs, "
                       f"{progress['bytes_copied'] / 1e6:.1f} of "
                       f"{progress['bytes_to_copy'] / 1e6:.1f} MB copied", err=True)
            shown = progress
        if time.monotonic() > deadline:
            raise click.ClickException(f"compaction of {bookie_id} still running after "
                                       f"{timeout_s:.0f} s (it goes on; see bkctl status --json)")
        time.sleep(0.2)  # a poll interval, not a wait for an event we could watch


def _echo_compaction_result(bookie_id: str, status: dict, info: dict, failed: bool,
                            as_json: bool) -> None:
    last = status.get("last") or {}
    disk = info["storage"].get("disk") or {}
    out = {"id": bookie_id, "ok": not failed, "error": status.get("last_error") if failed
           else None, "result": None if failed else last, "disk": disk}
    if as_json:
        echo_json(out)
        return
    if failed:
        click.echo(f"{bookie_id}: compaction failed: {out['error']}")
        return
    forgotten = last.get("ledgers_forgotten")
    if last.get("gc_error"):
        click.echo(f"{bookie_id}: deleted ledgers not collected first ({last['gc_error']}): "
                   f"their entries still count as live")
    click.echo(f"{bookie_id}: {last['kind']} compaction (live share under "
               f"{last['threshold']:.0%}): "
               + (f"{forgotten} deleted ledgers forgotten first, " if forgotten else "")
               + f"{last['logs_compacted']} entry logs rewritten, "
               f"{last['entries_copied']} entries / {last['bytes_copied'] / 1e6:.1f} MB "
               f"copied, {last['logs_removed']} logs removed, "
               f"{last['bytes_reclaimed'] / 1e6:.1f} MB given back in {last['seconds']} s"
               + (f" ({last['throttled_s']} s waiting for the rate limit)"
                  if last.get("throttled_s") else ""))
    click.echo(f"  entry logs now: {disk.get('entry_logs')} files, "
               f"{disk.get('entry_log_bytes', 0) / 1e6:.1f} MB: "
               f"{disk.get('live_bytes', 0) / 1e6:.1f} MB live, "
               f"{disk.get('garbage_bytes', 0) / 1e6:.1f} MB garbage")


@bookie.command(short_help="Collect a bookie's garbage now, also when its disk is full.",
                name="gc")
@click.argument("bookie_id")
@click.option("--timeout", "timeout_s", type=float, default=3600.0, show_default=True,
              help="Seconds to wait for the pass to finish.")
@json_option
@config_option
@library_errors
def gc_(bookie_id, timeout_s, as_json, config_path):
    """Run a garbage-collection pass on BOOKIE_ID now: ledgers whose metadata
    is gone are deleted from it, the entry logs holding only deleted ledgers
    are removed, and sparse logs are compacted. Works while the bookie is
    read-only because its disk is full; once its disk use is back at
    server.disk_usage_resume it takes writes again. Prints what was given
    back. Exit 1 if the pass failed.

    \b
    Example:
      bkctl bookie gc bookie-1
    """
    import time

    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.config import load_config
    from appliance.supervisor.probe import bookie_gc, bookie_info, probe_curve

    config = load_config(config_path)
    spec, curve = config.bookie(bookie_id), probe_curve(config)
    started = bookie_gc(spec.endpoint, 5000, curve=curve)
    if started is None:
        raise click.ClickException(f"{bookie_id} did not answer at {spec.endpoint}: is it up? "
                                   f"(bkctl status)")
    deadline = time.monotonic() + timeout_s
    while True:
        info = bookie_info(spec.endpoint, 5000, curve=curve) or {}
        gc = info.get("gc") or {}
        if gc.get("requests_done", 0) >= started["ticket"]:
            break
        if time.monotonic() > deadline:
            raise click.ClickException(f"garbage collection on {bookie_id} still running after "
                                       f"{timeout_s:.0f} s (it goes on; see bkctl bookie info)")
        time.sleep(0.2)  # a poll interval, not a wait for an event we could watch
    _echo_gc_result(bookie_id, info, gc.get("last_forced") or {}, as_json)


def _echo_gc_result(bookie_id: str, info: dict, result: dict, as_json: bool) -> None:
    disk = (info.get("storage") or {}).get("disk") or {}
    out = {"id": bookie_id, "ok": bool(result.get("ok")), "error": result.get("error"),
           "result": result if result.get("ok") else None, "disk": disk,
           "read_only": info.get("read_only"), "read_only_reason": info.get("read_only_reason")}
    if as_json:
        echo_json(out)
    elif not out["ok"]:
        click.echo(f"{bookie_id}: garbage collection failed: {out['error']}")
    else:
        click.echo(f"{bookie_id}: garbage collection: {result['ledgers_deleted']} deleted "
                   f"ledgers removed, {result['logs_removed']} entry logs removed, "
                   f"{result['bytes_freed'] / 1e6:.1f} MB given back in {result['seconds']} s")
        if result.get("compaction_error"):
            click.echo(f"  compaction did not run: {result['compaction_error']}")
        click.echo(f"  entry logs now: {disk.get('entry_logs')} files, "
                   f"{disk.get('entry_log_bytes', 0) / 1e6:.1f} MB: "
                   f"{disk.get('live_bytes', 0) / 1e6:.1f} MB live, "
                   f"{disk.get('garbage_bytes', 0) / 1e6:.1f} MB garbage")
        state = (f"read-only ({out['read_only_reason']}): writable again once its disk use "
                 "is at or below server.disk_usage_resume") if out["read_only"] else "writable"
        click.echo(f"  {bookie_id} is {state}")
    if not out["ok"]:
        click.get_current_context().exit(1)


@bookie.command(short_help="Accept a bookie's replaced or wiped disks.", name="fix-cookie")
@click.argument("bookie_id")
@click.option("--reformat", is_flag=True,
              help="Also when only one of its two directories is new: wipe and format both.")
@config_option
@library_errors
def fix_cookie_(bookie_id, reformat, config_path):
    """Accept BOOKIE_ID's current disks after a disk swap or wipe (the bookie
    must be stopped): new empty directories are formatted, the cookie in the
    metadata store is rewritten to name them, and the next start fences
    every ledger naming the bookie, puts it in limbo (it answers "unknown",
    never "no such entry") and repairs it from its peers (BP-46). On a
    running appliance its supervisor then starts BOOKIE_ID again at once
    (the other bookies keep serving) and this waits until it answers;
    follow the repair with `bkctl bookie info BOOKIE_ID`.

    \b
    Example:
      bkctl bookie stop bookie-2      # then swap its disks
      bkctl bookie fix-cookie bookie-2
    """
    # on use: keeps bkctl's start-up short (cli/__init__.py)
    from appliance.bookie.cookies import fix_cookie
    from appliance.config import load_config
    from appliance.meta.bookies import BookieRegistry
    from appliance.supervisor.supervisor import read_state, supervisor_alive
    from cli.processes import BOOKIE, start_again
    from storage.metadata import open_store

    config = load_config(config_path)
    supervised = supervisor_alive(state := read_state(config))
    if supervised:
        _refuse_unless_left_down(state, bookie_id)
    with open_store(config.metadata.uri, base_dir=config.base_dir,
                    **config.metadata.store_options()) as store:
        for line in fix_cookie(config, bookie_id, BookieRegistry(store), reformat=reformat):
            click.echo(line)
    if supervised:
        click.echo(start_again(config, BOOKIE, bookie_id) +
                   f"; its repair: `bkctl bookie info {bookie_id}`")
    else:
        click.echo(f"no supervisor runs {config.path}: `bkctl up` starts {bookie_id}")


def _refuse_unless_left_down(state: dict, bookie_id: str) -> None:
    """A running supervisor may start the bookie while its disks are being
    accepted: only one it leaves down (refused, stopped by the operator, or
    past restarts_max) is safe to fix."""
    run = (state.get("runs") or {}).get(bookie_id) or {}
    if run.get("pid") is not None:
        raise click.ClickException(f"{bookie_id} runs (pid {run['pid']}): stop it first "
                                   f"with `bkctl bookie stop {bookie_id}`")
    if not (run.get("given_up") or run.get("stopped_by_operator")):
        raise click.ClickException(f"the supervisor is about to restart {bookie_id}: stop it "
                                   f"first with `bkctl bookie stop {bookie_id}`")
