"""One bookie process: storage + the pure bookie core behind a ROUTER socket.

    python -m appliance.bookie --config configs/local.toml --id bookie-1

Boot, in order (any failure exits non-zero with one line naming the cause):

1. open the storage (cookies on both directories verified, journal replayed);
2. check the local cookie against the copy in the metadata store: a bookie
   whose directories were wiped and re-formatted, swapped or copied from
   another bookie refuses to start (BP-46: it may have lost data it
   acknowledged).  The first boot after a format publishes the copy;
3. the BP-46 boot rule: after an unclean shutdown in a mode where acks did
   not wait for the journal, fence (and mark limbo) every ledger whose
   ensemble names this bookie, before answering anyone;
4. measure the disks (``appliance.bookie.disk_monitor``: read-only beyond
   ``server.disk_usage_max``, re-checked every ``disk_check_interval_ms``);
5. bind the endpoint, register in the metadata store (an ephemeral node:
   it disappears when this process dies, flagged read-only if it is), start
   the garbage collector (``appliance.bookie.ledger_gc``), serve.

SIGTERM / SIGINT: stop serving, unregister, checkpoint and close the
storage (which leaves the clean-shutdown marker), exit 0.  The bookie does
not depend on the supervisor: it keeps serving if the supervisor dies.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys

from appliance.errors import BKError, CookieMismatchError

log = logging.getLogger("appliance.bookie")


def check_metadata_cookie(registry, bookie_id: str, storage) -> None:
    """Compare the storage's identity with the metadata copy; publish it on
    first boot.  Raises ``CookieMismatchError`` naming both instance ids."""
    local = {"bookie_id": bookie_id, "instance_id": storage.instance_id}
    found = registry.read_cookie(bookie_id)
    if found is None:
        registry.write_cookie(bookie_id, json.dumps(local, sort_keys=True).encode())
        return
    data, _version = found
    try:
        remote = json.loads(data)
    except ValueError as exc:
        raise CookieMismatchError(f"bookie {bookie_id}: the cookie in the metadata store is "
                                  f"unreadable ({exc})") from exc
    if remote.get("instance_id") != storage.instance_id:
        raise CookieMismatchError(
            f"bookie {bookie_id}: its directories hold instance {storage.instance_id} but the "
            f"metadata store knows instance {remote.get('instance_id')}: the disks were wiped, "
            "re-formatted or swapped, so data this bookie acknowledged may be lost. Restore the "
            "original directories, or retire this bookie id and start it under a new one")


def ledgers_on_bookie(ledger_manager, bookie_id: str):
    """(ledger id, closed) for every ledger whose ensembles name this bookie."""
    from appliance.errors import NoSuchLedgerError

    for ledger_id in ledger_manager.list_ledgers():
        try:
            md, _ = ledger_manager.read_ledger(ledger_id)
        except NoSuchLedgerError:
            continue  # deleted meanwhile
        if bookie_id in md.bookies():
            yield ledger_id, md.is_closed


def run_bookie(config, bookie_id: str, *, ready_file: str | None = None) -> int:
    """Boot and serve until SIGTERM/SIGINT (see the module docstring)."""
    from appliance.bookie.disk_monitor import DiskMonitor, ReadOnlyGate, start_disk_checks
    from appliance.bookie.handler import BookieHandler
    from appliance.bookie.ledger_gc import LedgerGC
    from appliance.meta.bookies import BookieRegistry
    from appliance.meta.ledgers import LedgerManager
    from appliance.protocol.bookie import BookieCore
    from ipc.server import FrameServer
    from storage import LedgerStorage
    from storage.metadata import open_store

    spec = config.bookie(bookie_id)
    options = config.storage.to_options()
    storage = LedgerStorage.open(bookie_id, spec.journal_dir, spec.ledger_dir, options)
    store = server = registry = gc = None
    try:
        store = open_store(config.metadata.uri, base_dir=config.base_dir,
                           session_timeout_ms=config.metadata.session_timeout_ms,
                           connect_timeout_ms=config.metadata.connect_timeout_ms)
        registry = BookieRegistry(store)
        check_metadata_cookie(registry, bookie_id, storage)
        core = BookieCore(storage)
        possible_loss = not storage.clean_shutdown_before and not options.journal_write_data
        if possible_loss:
            log.warning("unclean shutdown without a data journal: fencing and marking limbo "
                        "every ledger on this bookie before serving (BP-46)")
        ledger_manager = LedgerManager(store)
        ticket = core.boot(ledgers_on_bookie(ledger_manager, bookie_id), possible_loss)
        storage.wait_durable(ticket)
        handler = BookieHandler(bookie_id, storage, core,
                                long_polls_max=config.server.long_polls_max,
                                wait_lac_timeout_ms_max=config.server.wait_lac_timeout_ms_max)
        monitor = DiskMonitor((spec.journal_dir, spec.ledger_dir), config.server.disk_usage_max,
                              config.server.disk_usage_resume)
        monitor.check()
        server = FrameServer(spec.endpoint, ReadOnlyGate(handler, monitor),
                             limits=config.wire_limits(),
                             drain_messages_max=config.server.drain_messages_max,
                             queue_messages_max=config.server.queue_messages_max)
        handler.attach(server)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: server.stop())
        registry.register(bookie_id, server.endpoint,
                          {"pid": os.getpid(), "instance_id": storage.instance_id,
                           "journal_dir": str(spec.journal_dir),
                           "ledger_dir": str(spec.ledger_dir)}, read_only=monitor.read_only)
        start_disk_checks(server, monitor, config.server.disk_check_interval_ms,
                          lambda ro: registry.set_read_only(bookie_id, ro), monitor.read_only)
        gc = LedgerGC(storage, ledger_manager, config.server.gc_interval_ms)
        gc.start()
        log.info("bookie %s serving on %s (pid %d)", bookie_id, server.endpoint, os.getpid())
        if ready_file:
            _write_ready(ready_file, server.endpoint)
        server.serve()
        log.info("bookie %s stopping", bookie_id)
        return 0
    finally:
        _shutdown(bookie_id, storage, store, server, registry, gc)


def _shutdown(bookie_id, storage, store, server, registry, gc) -> None:
    if gc is not None:
        gc.stop()
    if registry is not None:
        try:
            registry.unregister(bookie_id)
        except BKError as exc:
            log.warning("could not unregister %s: %s", bookie_id, exc)
    if server is not None:
        server.close()
    storage.close()
    if store is not None:
        store.close()


def _write_ready(path: str, endpoint: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(endpoint + "\n")
    os.replace(tmp, path)


def keep_pandas_out() -> None:
    """sqlite-utils imports pandas whenever it is installed (the spark extra
    brings it), only to convert DataFrames, which a bookie never does: that
    import alone is ~70 MB of resident memory and 0.3 s of start-up per
    bookie.  A bookie never imports pandas, so mark it unavailable."""
    sys.modules.setdefault("pandas", None)


def main(argv: list[str] | None = None) -> int:
    keep_pandas_out()
    parser = argparse.ArgumentParser(description="Run one bookie of an appliance.")
    parser.add_argument("--config", required=True, help="appliance config (TOML)")
    parser.add_argument("--id", required=True, dest="bookie_id", help="bookie id in the config")
    parser.add_argument("--ready-file", help="write the bound endpoint here once serving")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from appliance.config import load_config

    try:
        config = load_config(args.config)
        return run_bookie(config, args.bookie_id, ready_file=args.ready_file)
    except BKError as exc:
        print(f"bookie {args.bookie_id}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2

