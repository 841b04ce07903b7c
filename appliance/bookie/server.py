"""One bookie process: storage + the pure bookie core behind a ROUTER socket.

    python -m appliance.bookie --config configs/local.toml --id bookie-1

Boot, in order (any failure exits non-zero with one line naming the cause):

1. open the storage (cookies on both directories verified, journal replayed);
2. check the local cookie against the copy in the metadata store
   (``appliance.bookie.cookies``): a bookie whose directories were wiped,
   replaced or swapped is refused with one line naming ``bkctl bookie
   fix-cookie``, or with ``server.cookie_auto_fix`` fixes it and goes on
   with possible data loss recorded.  The first boot publishes the copy;
3. BP-46 phase one (``possible_loss``): when data this bookie acknowledged
   may be gone (unclean shutdown after journal-less adds, in the mode the
   data was written in; index rebuilt from a scan; a replaced disk; empty
   directories that ledgers name), fence *and* limbo every ledger whose
   ensembles name it, closed ones too, durably, before answering anyone;
4. open the cluster key (``appliance.meta.custody``) and measure the disks
   (``appliance.bookie.disk_monitor``: read-only beyond
   ``server.disk_usage_max``, re-checked every ``disk_check_interval_ms``);
5. bind the endpoint (a tcp one with ``[security] curve``: a CURVE server
   accepting only the keys in ``authorized_keys_dir``, its public key
   published in the registration as ``curve_public_key``), register in the
   metadata store (an ephemeral node:
   it disappears when this process dies, flagged read-only if it is), start
   the garbage collector (``appliance.bookie.ledger_gc``: deleted ledgers,
   and over-replicated ones after ``server.overreplicated_grace_ms``) and BP-46 phase
   two (``appliance.bookie.repair``: every limbo ledger is recovered if
   open, its missing share copied from peers, its limbo cleared), serve.

SIGTERM / SIGINT: stop serving, unregister, checkpoint and close the
storage (which leaves the clean-shutdown marker), exit 0.  The bookie does
not depend on the supervisor: it keeps serving if the supervisor dies.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from appliance.bookie.cookies import check_metadata_cookie
from appliance.errors import BKError
from appliance.heap import retain_freed_memory

__all__ = ["check_metadata_cookie", "ledgers_on_bookie", "main", "possible_loss", "run_bookie"]

log = logging.getLogger("appliance.bookie")


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


def possible_loss(storage, named: list) -> list[str]:
    """BP-46: why this bookie may have lost data it acknowledged (empty: it
    did not).  The storage's reasons (unclean shutdown after journal-less
    adds, in the mode the data was written in; an index rebuilt from a scan;
    a replaced disk, recorded by the cookie check or ``bkctl bookie
    fix-cookie``), plus: a bookie holding nothing since its format while
    the metadata store names it in ledgers (its disks were replaced)."""
    reasons = list(storage.possible_loss_reasons)
    if storage.fresh and named:
        reason = f"empty directories, but {len(named)} ledger(s) name this bookie"
        storage.note_possible_loss(reason)
        reasons.append(reason)
    return reasons


def run_bookie(config, bookie_id: str, *, ready_file: str | None = None) -> int:
    """Boot and serve until SIGTERM/SIGINT (see the module docstring)."""
    from appliance.bookie.disk_monitor import DiskMonitor, ReadOnlyGate, start_disk_checks
    from appliance.bookie.handler import BookieHandler
    from appliance.bookie.ledger_gc import LedgerGC
    from appliance.bookie.repair import Repairer
    from appliance.curve import client_curve, server_curve
    from appliance.meta.bookies import BookieRegistry
    from appliance.meta.custody import open_custody
    from appliance.meta.ledgers import LedgerManager
    from appliance.protocol.bookie import BookieCore
    from appliance.rereplication.markers import CopyMarkers
    from ipc.server import FrameServer
    from storage import LedgerStorage
    from storage.metadata import open_store

    spec = config.bookie(bookie_id)
    curve = server_curve(config, bookie_id)  # tcp + [security] curve: keys, clients; or refuse
    options = config.storage.to_options()
    if config.server.cookie_auto_fix:
        from storage.cookie import adopt_replaced_dir

        adopted = adopt_replaced_dir(bookie_id, str(spec.journal_dir), str(spec.ledger_dir))
        if adopted:
            log.warning("server.cookie_auto_fix: %s; cookie written, booting through BP-46 "
                        "fence/limbo and repair", adopted)
    storage = LedgerStorage.open(bookie_id, spec.journal_dir, spec.ledger_dir, options)
    store = server = registry = gc = repairer = autorecovery = httpd = metrics_url = None
    try:
        store = open_store(config.metadata.uri, base_dir=config.base_dir,
                           **config.metadata.store_options())
        registry = BookieRegistry(store)
        check_metadata_cookie(registry, bookie_id, storage,
                              auto_fix=config.server.cookie_auto_fix)
        core = BookieCore(storage, reads_need_key=config.server.reads_need_key)
        ledger_manager = LedgerManager(store)
        named = list(ledgers_on_bookie(ledger_manager, bookie_id))
        reasons = possible_loss(storage, named)
        if reasons:
            log.warning("BP-46 phase one: possible data loss (%s): fencing and marking limbo "
                        "%d ledger(s) naming %s before serving", "; ".join(reasons),
                        len(named), bookie_id)
            storage.wait_durable(core.boot(named, True))
            storage.possible_loss_handled()
        from appliance.bookie.permissions import open_paths
        too_open = open_paths({
            "journal_dir": spec.journal_dir, "ledger_dir": spec.ledger_dir,
            "run dir": config.run_path, "cluster key": config.cluster_key_path,
            "metadata database": getattr(store, "db_path", None)})
        for line in too_open:
            log.warning("%s: %s", bookie_id, line)
        boot = {"reasons": reasons, "clean_shutdown_before": storage.clean_shutdown_before,
                "open_to_others": too_open,
                "ledgers_fenced": len(named) if reasons else 0,
                "recovery": dict(storage.recovery_stats)}
        custody = open_custody(store, config.cluster_key_path)
        repairer = Repairer(bookie_id, storage, core, ledger_manager, registry,
                            custody=custody, open_client=lambda: _client(config))
        handler = BookieHandler(bookie_id, storage, core,
                                long_polls_max=config.server.long_polls_max,
                                wait_lac_timeout_ms_max=config.server.wait_lac_timeout_ms_max)
        monitor = DiskMonitor((spec.journal_dir, spec.ledger_dir), config.server.disk_usage_max,
                              config.server.disk_usage_resume)
        monitor.check()
        gate = ReadOnlyGate(handler, monitor)
        metrics = None
        if spec.metrics_address:
            from appliance.bookie.metrics import BookieMetrics, MetricsGate
            metrics = BookieMetrics()
            gate = MetricsGate(gate, metrics)
        server = FrameServer(spec.endpoint, gate, limits=config.wire_limits(),
                             drain_messages_max=config.server.drain_messages_max,
                             queue_messages_max=config.server.queue_messages_max,
                             socket_group=config.server.socket_group,
                             curve_keys=curve[0] if curve else None,
                             authorized_keys=curve[1] if curve else None)
        if metrics is not None:
            from appliance.bookie.metrics import (
                BookieCollector,
                ReplyObserver,
                start_metrics_server,
            )
            handler.attach(ReplyObserver(server, metrics))
            collector = BookieCollector(
                bookie_id, metrics, storage, handler, server, monitor,
                lambda: dict(gc.stats) if gc is not None else {})
            httpd, metrics_url = start_metrics_server(spec.metrics_address, collector)
        else:
            handler.attach(server)
        handler.extra_info = lambda: {"boot": boot, "repair": repairer.status(),
                                      "gc": dict(gc.stats) if gc is not None else None,
                                      "metrics_url": metrics_url}
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: server.stop())
        registry.register(bookie_id, server.endpoint,
                          {"pid": os.getpid(), "instance_id": storage.instance_id,
                           "journal_dir": str(spec.journal_dir),
                           "ledger_dir": str(spec.ledger_dir), "metrics_url": metrics_url,
                           "host": spec.host, "rack": spec.rack,
                           "curve_public_key": server.curve_public_key},
                          read_only=monitor.read_only)
        start_disk_checks(server, monitor, config.server.disk_check_interval_ms,
                          lambda ro: registry.set_read_only(bookie_id, ro), monitor.read_only)
        gc = LedgerGC(storage, ledger_manager, config.server.gc_interval_ms,
                      bookie_id=bookie_id, markers=CopyMarkers(store),
                      overreplicated_grace_ms=config.server.overreplicated_grace_ms)
        gc.start()
        repairer.start()  # phase two: in the background, while serving
        if config.autorecovery.enabled:
            from appliance.autorecovery.service import AutoRecovery
            from appliance.bookie.repair import ledger_key

            autorecovery = AutoRecovery(
                bookie_id, store, ledger_manager, registry, config.autorecovery,
                key_for=lambda md: ledger_key(storage, custody, md),
                probe_key_for=lambda md: ledger_key(storage, custody, md, checked=False),
                open_client=lambda: _client(config), curve=client_curve(config))
            autorecovery.start()
        log.info("bookie %s serving on %s (pid %d)", bookie_id, server.endpoint, os.getpid())
        if ready_file:
            _write_ready(ready_file, server.endpoint)
        server.serve()
        log.info("bookie %s stopping", bookie_id)
        return 0
    finally:
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
        _shutdown(bookie_id, storage, store, server, registry, gc, repairer, autorecovery)


def _client(config):
    """A ledger client for repair's recoveries (imported only when needed)."""
    from appliance.client.client import Client

    return Client(config.path)


def _shutdown(bookie_id, storage, store, server, registry, gc, repairer,
              autorecovery) -> None:
    for worker in (autorecovery, repairer):
        if worker is not None:
            worker.stop()
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
    retain_freed_memory()  # READ_PACKED replies reuse freed buffers (appliance.heap)
    os.umask(0o077)  # whatever this process creates is its owner's only (docs/SECURITY.md)
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

