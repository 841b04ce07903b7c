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
   ``server.disk_usage_max``, re-checked every ``disk_check_interval_ms``;
   a write that finds the disk full turns it read-only at once and it stays
   up: ``appliance.bookie.full_disk``);
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

from appliance.autorecovery.service import AutoRecovery
from appliance.bookie.cookies import adopt_replaced_pair, check_metadata_cookie
from appliance.bookie.disk_monitor import (
    DiskMonitor,
    PublishedFlag,
    ReadOnlyGate,
    start_disk_checks,
)
from appliance.bookie.exit_codes import EXIT_FAILED, EXIT_REFUSED
from appliance.bookie.full_disk import FullDisk
from appliance.bookie.handler import BookieHandler
from appliance.bookie.ledger_gc import LedgerGC
from appliance.bookie.permissions import open_paths
from appliance.bookie.repair import Repairer, ledger_key
from appliance.bookie.scrub import Scrubber
from appliance.config import load_config
from appliance.curve import client_curve, server_curve
from appliance.errors import BKError, ConfigError, CookieMismatchError, NoSuchLedgerError
from appliance.heap import retain_freed_memory
from appliance.meta.bookies import BookieRegistry
from appliance.meta.custody import open_custody
from appliance.meta.ledgers import LedgerManager
from appliance.protocol.bookie import BookieCore
from appliance.rereplication.markers import CopyMarkers
from ipc.server import FrameServer
from storage import LedgerStorage
from storage.cookie import adopt_replaced_dir
from storage.metadata import open_store

__all__ = ["check_metadata_cookie", "ledgers_on_bookie", "main", "possible_loss", "run_bookie"]

log = logging.getLogger("appliance.bookie")


def ledgers_on_bookie(ledger_manager, bookie_id: str, seen: dict | None = None):
    """(ledger id, closed) for every ledger whose ensembles name this bookie;
    ``seen`` (if given) gets ``ledger id -> (named, closed)`` for every ledger
    read (the scrub's start: ``ScrubQueue.boot``)."""
    for ledger_id in ledger_manager.list_ledgers():
        try:
            md, _ = ledger_manager.read_ledger(ledger_id)
        except NoSuchLedgerError:
            continue  # deleted meanwhile
        named = bookie_id in md.bookies()
        if seen is not None:
            seen[ledger_id] = (named, md.is_closed)
        if named:
            yield ledger_id, md.is_closed


def possible_loss(storage, named: list, known: bool = False) -> list[str]:
    """BP-46: why this bookie may have lost data it acknowledged (empty: it
    did not).  The storage's reasons (unclean shutdown after journal-less
    adds, in the mode the data was written in; an index rebuilt from a scan;
    a replaced disk, recorded by the cookie check or ``bkctl bookie
    fix-cookie``), plus: a bookie holding nothing since its format while
    the metadata store names it in ledgers, unless the store ``known`` this
    very instance (its disks and its cookie copy were replaced).  An
    instance the store knew that holds nothing acknowledged nothing (its
    journal would hold it): it was named in ledgers made while it was down,
    and calling that a loss left them unrecoverable (its limbo answers
    "unknown" to their recovery until they are recovered)."""
    reasons = list(storage.possible_loss_reasons)
    if storage.fresh and named and not known:
        reason = f"empty directories, but {len(named)} ledger(s) name this bookie"
        storage.note_possible_loss(reason)
        reasons.append(reason)
    return reasons


def run_bookie(config, bookie_id: str, *, ready_file: str | None = None) -> int:
    """Boot and serve until SIGTERM/SIGINT (see the module docstring)."""
    bookie = BookieProcess(config, bookie_id)
    curve = server_curve(config, bookie_id)  # tcp + [security] curve: keys, clients; or refuse
    bookie.open_storage()
    try:
        bookie.check_cookie()
        reasons, named = bookie.fence_possible_loss()
        too_open = bookie.warn_open_paths()
        bookie.boot = {"reasons": reasons,
                       "clean_shutdown_before": bookie.storage.clean_shutdown_before,
                       "open_to_others": too_open,
                       "ledgers_fenced": len(named) if reasons else 0,
                       "recovery": dict(bookie.storage.recovery_stats)}
        bookie.open_handler()
        bookie.bind(curve)
        bookie.register()
        bookie.start_workers()
        log.info("bookie %s serving on %s (pid %d)", bookie_id, bookie.server.endpoint,
                 os.getpid())
        if ready_file:
            _write_ready(ready_file, bookie.server.endpoint)
        bookie.server.serve()
        log.info("bookie %s stopping", bookie_id)
        return 0
    finally:
        bookie.close()


class BookieProcess:
    """What one bookie process holds, opened by the boot steps of the module
    docstring, one method a step, in the order ``run_bookie`` calls them;
    ``close`` releases whatever was opened.  A resource not opened yet is
    None."""

    def __init__(self, config, bookie_id: str):
        self.config = config
        self.bookie_id = bookie_id
        self.spec = config.bookie(bookie_id)
        self.storage = self.core = self.boot = None
        self.store = self.registry = self.ledger_manager = self.custody = None
        self.handler = self.monitor = self.gate = self.metrics = self.server = None
        self.full_disk = self.read_only_flag = None
        self.gc = self.repairer = self.autorecovery = self.scrubber = None
        self.httpd = self.metrics_url = None
        self.boot_seen: dict | None = None  # ledger -> (names this bookie, closed) at boot
        self.known = False  # the metadata store knew this storage's instance (check_cookie)

    def open_storage(self) -> None:
        """Step 1: cookies on both directories verified, journal replayed.
        With ``server.cookie_auto_fix`` a replaced directory is adopted
        first, and the bookie boots through BP-46."""
        spec = self.spec
        options = self.config.storage.to_options()
        if self.config.server.cookie_auto_fix:
            adopted = adopt_replaced_dir(self.bookie_id, str(spec.journal_dir),
                                         str(spec.ledger_dir)) or \
                adopt_replaced_pair(self.bookie_id, str(spec.journal_dir),
                                    str(spec.ledger_dir), options)
            if adopted:
                log.warning("server.cookie_auto_fix: %s; cookie written, booting through "
                            "BP-46 fence/limbo and repair", adopted)
        self.storage = LedgerStorage.open(self.bookie_id, spec.journal_dir, spec.ledger_dir,
                                          options)

    def check_cookie(self) -> None:
        """Step 2: the local cookie against the metadata store's copy."""
        config = self.config
        self.store = open_store(config.metadata.uri, base_dir=config.base_dir,
                                **config.metadata.store_options())
        self.registry = BookieRegistry(self.store)
        self.known = check_metadata_cookie(self.registry, self.bookie_id, self.storage,
                                           auto_fix=config.server.cookie_auto_fix)

    def fence_possible_loss(self) -> tuple[list[str], list]:
        """Step 3, BP-46 phase one: when acknowledged data may be gone,
        fence and limbo every ledger naming this bookie, durably.  Returns
        (the reasons, the ledgers naming this bookie)."""
        self.core = BookieCore(self.storage, reads_need_key=self.config.server.reads_need_key)
        self.ledger_manager = LedgerManager(self.store)
        self.boot_seen = {}
        named = list(ledgers_on_bookie(self.ledger_manager, self.bookie_id, self.boot_seen))
        reasons = possible_loss(self.storage, named, self.known)
        if reasons:
            log.warning("BP-46 phase one: possible data loss (%s): fencing and marking limbo "
                        "%d ledger(s) naming %s before serving", "; ".join(reasons),
                        len(named), self.bookie_id)
            self.storage.wait_durable(self.core.boot(named, True))
            self.storage.possible_loss_handled()
        return reasons, named

    def warn_open_paths(self) -> list[str]:
        """Log (and return) every path that others than its owner can read."""
        spec, config = self.spec, self.config
        too_open = open_paths({
            "journal_dir": spec.journal_dir, "ledger_dir": spec.ledger_dir,
            "run dir": config.run_path, "cluster key": config.cluster_key_path,
            "metadata database": getattr(self.store, "db_path", None)})
        for line in too_open:
            log.warning("%s: %s", self.bookie_id, line)
        return too_open

    def open_handler(self) -> None:
        """Step 4: the cluster key, the repairer, the request handler, and
        the disks measured (read-only beyond ``server.disk_usage_max``)."""
        config, server_config = self.config, self.config.server
        self.custody = open_custody(self.store, config.cluster_key_path)
        self.repairer = Repairer(self.bookie_id, self.storage, self.core, self.ledger_manager,
                                 self.registry, custody=self.custody,
                                 open_client=lambda: _client(config))
        self.handler = BookieHandler(self.bookie_id, self.storage, self.core,
                                     long_polls_max=server_config.long_polls_max,
                                     wait_lac_timeout_ms_max=server_config.wait_lac_timeout_ms_max)
        self.monitor = DiskMonitor((self.spec.journal_dir, self.spec.ledger_dir),
                                   server_config.disk_usage_max, server_config.disk_usage_resume)
        self.monitor.check()
        self.read_only_flag = PublishedFlag(
            lambda ro: self.registry.set_read_only(self.bookie_id, ro))
        self.full_disk = FullDisk(self.storage, self.handler, self.monitor, self.read_only_flag,
                                  self._after_reopen)
        self.handler.on_storage_failure = self.full_disk.failed
        if self.storage.reserves_released:  # the open needed them: the disk is full
            self.full_disk.booted_full()
        self.gate = ReadOnlyGate(self.handler, self.monitor)
        if self.spec.metrics_address:
            # Only with metrics on (off by default): ~14 ms of start-up otherwise.
            from appliance.bookie.metrics import BookieMetrics, MetricsGate

            self.metrics = BookieMetrics()
            self.gate = MetricsGate(self.gate, self.metrics)

    def bind(self, curve) -> None:
        """Step 5: bind the endpoint (a CURVE server with ``curve``), and the
        metrics endpoint when there is one."""
        server_config = self.config.server
        self.server = FrameServer(self.spec.endpoint, self.gate,
                                  limits=self.config.wire_limits(),
                                  drain_messages_max=server_config.drain_messages_max,
                                  queue_messages_max=server_config.queue_messages_max,
                                  socket_group=server_config.socket_group,
                                  curve_keys=curve[0] if curve else None,
                                  authorized_keys=curve[1] if curve else None)
        if self.metrics is not None:
            self._serve_metrics()
        else:
            self.handler.attach(self.server)
        self.handler.extra_info = self._extra_info
        self.handler.on_gc_request = self._request_gc

    def _request_gc(self) -> dict:
        """``bkctl bookie gc``, on the loop: a storage failed for a full disk
        is reopened first (the pass needs it), then the gc thread runs the
        pass (``LedgerGC.request``)."""
        if self.full_disk.full:
            self.full_disk.reopen("bkctl bookie gc")
        return {"ticket": self.gc.request(), "gc": self._gc_info()}

    def _gc_info(self) -> dict | None:
        if self.gc is None:
            return None
        return {**self.gc.stats, "last_forced": self.gc.last_forced}

    def _serve_metrics(self) -> None:
        from appliance.bookie.metrics import (  # see open_handler
            BookieCollector,
            ReplyObserver,
            start_metrics_server,
        )

        self.handler.attach(ReplyObserver(self.server, self.metrics))
        collector = BookieCollector(self.bookie_id, self.metrics, self.storage, self.handler,
                                    self.server, self.monitor, self._gc_stats,
                                    self._autorecovery_seen)
        self.httpd, self.metrics_url = start_metrics_server(self.spec.metrics_address,
                                                            collector)

    def _gc_stats(self) -> dict:
        return dict(self.gc.stats) if self.gc is not None else {}

    def _autorecovery_seen(self) -> dict | None:
        return self.autorecovery.observed if self.autorecovery is not None else None

    def _extra_info(self) -> dict:
        """What INFO adds: boot reasons, repair progress, gc, metrics url."""
        return {"boot": self.boot, "repair": self.repairer.status(),
                "gc": self._gc_info(),
                "scrub": self.scrubber.status() if self.scrubber is not None else None,
                "full_disk": self.full_disk.info(), "metrics_url": self.metrics_url}

    def register(self) -> None:
        """Stop on SIGTERM/SIGINT, register in the metadata store (an
        ephemeral node), and keep the read-only flag in step with the disks."""
        server, spec, bookie_id = self.server, self.spec, self.bookie_id
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: server.stop())
        self.registry.register(bookie_id, server.endpoint,
                               {"pid": os.getpid(), "instance_id": self.storage.instance_id,
                                "journal_dir": str(spec.journal_dir),
                                "ledger_dir": str(spec.ledger_dir),
                                "metrics_url": self.metrics_url,
                                "host": spec.host, "rack": spec.rack,
                                "curve_public_key": server.curve_public_key},
                               read_only=self.monitor.read_only)
        self.read_only_flag.value = self.monitor.read_only  # as registered
        start_disk_checks(server, self.monitor, self.config.server.disk_check_interval_ms,
                          self.read_only_flag, self.full_disk)

    def _after_reopen(self) -> None:
        """The storage was reopened after a full disk: if the reopen found
        that acknowledged data may be gone (journal-less adds), BP-46 phase
        one again, then the repairer takes the new limbo ledgers."""
        reasons, _ = self.fence_possible_loss()
        if reasons:
            self.repairer.wake()

    def start_workers(self) -> None:
        """The garbage collector, BP-46 phase two (in the background, while
        serving) and, when enabled, automatic re-replication."""
        config, storage, custody = self.config, self.storage, self.custody
        self.gc = LedgerGC(storage, self.ledger_manager, config.server.gc_interval_ms,
                           bookie_id=self.bookie_id, markers=CopyMarkers(self.store),
                           overreplicated_grace_ms=config.server.overreplicated_grace_ms)
        storage.set_deleted_ledger_collector(self.gc.collect_now)  # bkctl bookie compact
        self.gc.start()
        self.repairer.start()
        self.scrubber = Scrubber(self.bookie_id, storage, self.ledger_manager,
                                 interval_ms=config.server.scrub_interval_ms,
                                 ledgers_per_pass=config.server.scrub_ledgers_per_pass,
                                 wake_repair=self.repairer.wake,
                                 writable=lambda: not self.monitor.read_only)
        self.scrubber.queue.boot(self.boot_seen)  # what the boot read: no second read
        self.boot_seen = None
        self.scrubber.start()
        if config.autorecovery.enabled:
            self.autorecovery = AutoRecovery(
                self.bookie_id, self.store, self.ledger_manager, self.registry,
                config.autorecovery,
                key_for=lambda md: ledger_key(storage, custody, md),
                probe_key_for=lambda md: ledger_key(storage, custody, md, checked=False),
                open_client=lambda: _client(config), curve=client_curve(config),
                cold_config=config.cold_storage)
            self.autorecovery.start()

    def close(self) -> None:
        """Stop the workers, unregister, close the endpoint, then the
        storage (which leaves the clean-shutdown marker) and the store."""
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
        for worker in (self.autorecovery, self.scrubber, self.repairer):
            if worker is not None:
                worker.stop()
        if self.gc is not None:
            self.gc.stop()
        if self.registry is not None:
            try:
                self.registry.unregister(self.bookie_id)
            except BKError as exc:
                log.warning("could not unregister %s: %s", self.bookie_id, exc)
        if self.server is not None:
            self.server.close()
        self.storage.close()
        if self.store is not None:
            self.store.close()


def _client(config):
    """A ledger client for repair's recoveries."""
    # Only a bookie that repairs makes a client: importing it costs ~66 ms and
    # 41 modules of every bookie's start-up otherwise (measured 2026-11-27).
    from appliance.client.client import Client

    return Client(config.path)


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
    try:
        config = load_config(args.config)
        return run_bookie(config, args.bookie_id, ready_file=args.ready_file)
    except (CookieMismatchError, ConfigError) as exc:  # a restart cannot change these
        print(f"bookie {args.bookie_id}: refusing to start: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return EXIT_REFUSED
    except BKError as exc:
        print(f"bookie {args.bookie_id}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAILED

