"""The Python client binding for ledgers: ``Client`` and the ledger handles
(``appliance.connect`` returns ``appliance.logs.connection.Connection``,
this client with the log layer on top).

    with appliance.connect("configs/local.toml") as bk:
        lh = bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, password=b"pw")
        lh.add(b"payload")
        lh.close()

Guarantees:

* ``add`` returns (``add_async``'s future completes) only once the entry is
  acknowledged by an ack quorum of bookies, each of which made it durable
  before answering, and every lower entry is acknowledged too.
* Arguments are checked before anything is sent: wrong types raise
  ``TypeError``, impossible values ``ValueError``, both naming the argument.
* Back-pressure: at most ``inflight_adds_max`` adds and
  ``inflight_bytes_max`` payload bytes per handle are in flight;
  ``add_async`` blocks beyond that (bounded memory here and in the bookies).
* Thread-safe: any thread may call any method; the protocol cores run on
  one driver thread (``appliance.client.driver``).
* New ledgers are placed host-aware (``[client] placement``,
  ``appliance.protocol.placement``): every write set on distinct hosts when
  the live bookies allow it; otherwise created all the same, with a warning.
* Bookies this client saw fail or stall on reads are quarantined for
  ``[client] bookie_quarantine_ms`` (``appliance.protocol.quarantine``):
  asked last by every reader of this client, and left out of new ledgers'
  ensembles and recovery's replacements while enough others are up.
* Errors are ``appliance.errors`` classes; a wrong password is refused on
  open before anything is fenced (``UnauthorizedError``).
"""

from __future__ import annotations

import logging
import os
import random
import time
from concurrent.futures import Future

from appliance.checks.digest import make_digest
from appliance.client.calls import check_entry_id, wait_result
from appliance.client.driver import Driver
from appliance.client.metrics import ClientMetrics
from appliance.client.read_handle import ReadHandle
from appliance.client.write_handle import WriteHandle
from appliance.config import ClientConfig, ColdStorageConfig, LogConfig, resolve_target
from appliance.curve import client_curve
from appliance.errors import (
    OK,
    ClientClosedError,
    NotEnoughBookiesError,
    UnauthorizedError,
)
from appliance.meta.bookies import BookieRegistry
from appliance.meta.custody import read_public_key, seal
from appliance.meta.ledgers import LedgerManager
from appliance.meta.logs import LogManager
from appliance.protocol import events as ev
from appliance.protocol import limits
from appliance.protocol.entry import ENTRY_OVERHEAD_MAX
from appliance.protocol.keys import SALT_BYTES, check_password, master_key, password_record
from appliance.protocol.metadata import CLOSED, DIGEST_TYPES, LedgerMetadata, check_quorums
from appliance.protocol.placement import choose_ensemble, host_count, location_of, meets_rule
from appliance.protocol.quarantine import BookieHealth
from appliance.protocol.recovery import LedgerRecovery, RecoveryConfig
from ipc.frames import WireLimits
from storage.metadata import open_store

log = logging.getLogger(__name__)


def check_password_type(password) -> bytes:
    """``password`` as bytes; ``TypeError`` naming it when it is not bytes."""
    if not isinstance(password, bytes | bytearray):
        raise TypeError(f"password must be bytes, got {type(password).__name__}")
    return bytes(password)


class Client:
    """A connection to one appliance: its metadata store and its bookies."""

    def __init__(self, target, metrics=False, *, curve_key_file=None, trusted_keys_dir=None):
        uri, base_dir, config = resolve_target(target)
        curve = client_curve(config, curve_key_file, trusted_keys_dir)
        self.curve = curve  # appliance.curve.ClientCurve or None; never changed after
        self.config = config.client if config is not None else ClientConfig()
        self.log_config = config.log if config is not None else LogConfig()
        self.cold_config = config.cold_storage if config is not None else ColdStorageConfig()
        # the one payload limit (storage.entry_bytes_max); records carry a header
        # and a digest on top, so the wire takes the largest legal record
        self.payload_bytes_max = (config.storage.entry_bytes_max if config is not None
                                  else limits.STORAGE_ENTRY_BYTES_MAX)
        wire_limits = (config.wire_limits() if config is not None
                  else WireLimits(entry_bytes_max=limits.STORAGE_ENTRY_BYTES_MAX
                                             + ENTRY_OVERHEAD_MAX))
        md_cfg = config.metadata if config is not None else None
        kwargs = md_cfg.store_options() if md_cfg else {}
        self._store = open_store(uri, base_dir=base_dir, **kwargs)
        try:
            self.ledgers = LedgerManager(self._store)
            self.logs = LogManager(self._store)
            self.registry = BookieRegistry(self._store)
            self.driver = Driver(self.ledgers, self.registry,
                                 request_timeout_ms=self.config.add_timeout_ms,
                                 add_batch_entries_max=self.config.add_batch_entries_max,
                                 add_batch_bytes_max=self.config.add_batch_bytes_max,
                                 add_messages_inflight=self.config.add_messages_inflight,
                                 add_linger_us=self.config.add_linger_us,
                                 read_batch_bytes_max=self.config.read_batch_bytes_max,
                                 curve=curve,
                                 transport_options={"limits": wire_limits,
                                     "heartbeat_timeout_ms": self.config.add_timeout_ms,
                                     "reconnect_ivl_ms": self.config.reconnect_ivl_ms,
                                     "reconnect_ivl_max_ms": self.config.reconnect_ivl_max_ms})
        except BaseException:
            self._store.close()
            raise
        # one for every reader and recovery of this client; used on the driver thread
        self.health = BookieHealth(self.config.bookie_quarantine_ms,
                                   self.config.bookie_quarantine_strikes)
        self.driver.start()
        self._closed = False
        self._rng = random.Random()
        self.placement_degraded = 0  # ledgers created on write sets sharing a host
        self._records: dict[bytes, bytes] = {}  # master key -> its password record
        self._known_keys: dict[bytes, None] = {}  # keys proven in this connection (delete)
        self.metrics = None  # appliance.client.metrics.ClientMetrics when asked for
        if metrics:
            self.metrics = ClientMetrics(self.health)
            self.metrics.register(None if metrics is True else metrics)
        self._cluster_key: bytes | None = None

    # -- ledgers ----------------------------------------------------------------
    def create_ledger(self, ensemble: int | None = None, write_quorum: int | None = None,
                      ack_quorum: int | None = None, password: bytes = b"",
                      digest: str | None = None, custom: dict | None = None):
        """Create an OPEN ledger on ``ensemble`` live bookies; returns its
        write handle."""
        self._check_open()
        e = self.config.ensemble if ensemble is None else ensemble
        w = self.config.write_quorum if write_quorum is None else write_quorum
        a = self.config.ack_quorum if ack_quorum is None else ack_quorum
        check_quorums(e, w, a)
        digest = self.config.digest if digest is None else digest
        if digest not in DIGEST_TYPES:
            raise ValueError(f"digest must be one of {DIGEST_TYPES}, got {digest!r}")
        key = master_key(check_password_type(password))
        live, locations = wait_result(self.driver.call(lambda: (
            self.health.prefer(self.driver.available_bookies, e, self.driver.now_ms()),
            self.driver.locations)), 30.0, "listing bookies")
        chosen = choose_ensemble(live, locations, e, w, self._rng, self.config.placement)
        if chosen is None:
            raise NotEnoughBookiesError(f"ensemble of {e} needs {e} live writable bookies; "
                                        f"{len(live)} are up ({', '.join(live) or 'none'})")
        if self.config.placement != "none" and not meets_rule(chosen, w, locations):
            self._placement_degraded(chosen, w, live, locations)
        md = self.ledgers.create_ledger(e, w, a, chosen, digest, self._password_record(key),
                                        custom=custom, ctime_ms=int(time.time() * 1000),
                                        sealed_key=self._sealed(key))
        _, version = self.ledgers.read_ledger(md.ledger_id)
        self._remember_key(key)
        return WriteHandle(self, md, version, key)

    def _placement_degraded(self, chosen, write_quorum: int, live, locations) -> None:
        """Too few hosts for the rule: the ledger is made all the same
        (durability by count beats placement); counted, and warned once when
        the live bookies span several hosts (on one machine it is the
        deployment, not news: logged at info)."""
        self.placement_degraded += 1
        hosts = sorted({location_of(b, locations).host for b in chosen})
        first, spread = self.placement_degraded == 1, host_count(live, locations) > 1
        (log.warning if first and spread else log.info if first else log.debug)(
            "placement degraded: write sets of %d on the ensemble %s share hosts (live "
            "hosts do not allow distinct ones: %s); see docs/CONFIG.md, Placement",
            write_quorum, list(chosen), ", ".join(hosts))

    def _password_record(self, key: bytes) -> bytes:
        """The salted scrypt record of ``key`` stored in new ledgers' metadata
        (``appliance.protocol.keys``).  One random salt per key per client:
        a client creating many ledgers with one password pays one derivation
        (tens of ms), not one per ledger; an attacker still pays scrypt per
        guess per salt."""
        record = self._records.get(key)
        if record is None:
            record = self._records[key] = password_record(key, os.urandom(SALT_BYTES))
        return record

    def _sealed(self, key: bytes) -> bytes | None:
        """``key`` sealed to the appliance's cluster key, for repair without an
        operator (``appliance.meta.custody``); None while no bookie has
        published one yet."""
        if self._cluster_key is None:
            self._cluster_key = read_public_key(self._store)
        return seal(self._cluster_key, key) if self._cluster_key is not None else None

    def open_ledger(self, ledger_id: int, password: bytes = b"", recovery: bool = True):
        """Open for reading.  ``recovery=True`` fences the ledger and recovers
        its end (the old writer can add no more); ``False`` reads up to the
        LAC without disturbing the writer."""
        return self.open_ledger_with_key(ledger_id, master_key(check_password_type(password)),
                                         recovery)

    def open_ledger_with_key(self, ledger_id: int, key: bytes, recovery: bool = True):
        """``open_ledger`` with the 32-byte master key instead of the password
        (for the appliance's own repair and re-replication, which get keys
        from ``appliance.meta.custody``)."""
        self._check_open()
        check_entry_id("ledger_id", ledger_id)
        md, version = self.ledgers.read_ledger(ledger_id)
        if not check_password(md.password_hash, key):
            raise UnauthorizedError(f"wrong password for ledger {ledger_id}")
        self._remember_key(key)
        if recovery and md.state != CLOSED:
            md = self._recover(md, version, key)
        return ReadHandle(self, md, key)

    def _recover(self, md: LedgerMetadata, version: int, key: bytes) -> LedgerMetadata:
        done: Future = Future()
        if self.metrics is not None:
            self.metrics.recoveries += 1

        class _Sink:
            def on_result(self, action):
                if isinstance(action, ev.OpenDone) and not done.done():
                    done.set_result(action)

        def start():
            spares = self.health.prefer(self.driver.available_bookies, md.ensemble_size,
                                        self.driver.now_ms())
            core = LedgerRecovery(md, version, key, make_digest(md.digest_type, key),
                                  config=RecoveryConfig(placement=self.config.placement),
                                  available_bookies=spares,
                                  ids=self.driver.ids, locations=self.driver.locations)
            self.driver.register(core, _Sink())
            self.driver.run(core, core.start(self.driver.now_ms()))
            return core

        core = wait_result(self.driver.call(start), limits.CLIENT_CALL_TIMEOUT_S_MAX,
                           "starting recovery")
        try:
            result = wait_result(done, limits.CLIENT_CALL_TIMEOUT_S_MAX,
                                 f"recovery of ledger {md.ledger_id}")
        finally:
            self.driver.post(self.driver.unregister, core)
        if result.code != OK:
            why = f" ({result.detail})" if result.detail else ""
            raise self.driver.error(result.code, f"recovery of ledger {md.ledger_id} failed{why}")
        return result.metadata

    def list_ledgers(self) -> list[int]:
        self._check_open()
        return self.ledgers.list_ledgers()

    def ledger_metadata(self, ledger_id: int) -> LedgerMetadata:
        self._check_open()
        check_entry_id("ledger_id", ledger_id)
        return self.ledgers.read_ledger(ledger_id)[0]

    def delete_ledger(self, ledger_id: int, password: bytes | None = None, *,
                      force: bool = False) -> None:
        """Delete the ledger's metadata; its id is never reused.

        Who may delete (docs/SECURITY.md): a caller giving the ledger's
        ``password`` (a wrong one is refused even with ``force``); without
        one, a client that created or opened a ledger with the same password
        in this connection (CONTRACT's ``bk.delete_ledger(lh.id)``), or
        anybody when the ledger has no password.  Otherwise
        ``UnauthorizedError`` and nothing is deleted, unless ``force=True``:
        the explicit override of the account that owns the metadata (logged).
        """
        self._check_open()
        check_entry_id("ledger_id", ledger_id)
        md, _ = self.ledgers.read_ledger(ledger_id)
        if password is not None:
            if not check_password(md.password_hash, master_key(check_password_type(password))):
                raise UnauthorizedError(f"wrong password for ledger {ledger_id}: not deleted")
        elif not any(check_password(md.password_hash, k) for k in self._delete_keys()):
            if not force:
                raise UnauthorizedError(
                    f"ledger {ledger_id} has a password: give it to delete (or force=True, "
                    f"the metadata owner's override); not deleted")
            log.warning("ledger %d deleted without its password (force)", ledger_id)
        self.ledgers.delete_ledger(ledger_id)

    def _remember_key(self, key: bytes) -> None:
        """A master key this connection proved it holds (created or opened a
        ledger with it); bounded, the oldest forgotten first."""
        self._known_keys.pop(key, None)
        self._known_keys[key] = None
        while len(self._known_keys) > limits.CLIENT_KNOWN_KEYS_MAX:
            self._known_keys.pop(next(iter(self._known_keys)))

    def _delete_keys(self) -> list[bytes]:
        return [*self._known_keys, master_key(b"")]

    # -- lifecycle --------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError("this client is closed")

    def close(self) -> None:
        """Stop the client.  Work still in flight fails at once with
        ``ClientClosedError``: an add's future (its entry may or may not be
        stored: close the write handles first to have every add settled and
        the ledgers closed), an add waiting for room, a read or LAC wait, a
        call not yet run; so does every later call of its handles."""
        if self._closed:
            return
        self._closed = True
        if self.metrics is not None:
            self.metrics.unregister()
        self.driver.close()
        self._store.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def raise_gc_threshold(young: int) -> None:
    """``[client] gc_threshold``: collect Python's youngest generation every
    ``young`` net allocations instead of every 700 (the older generations'
    ratios are kept), never lowering what the application set.  Each add in
    flight and each open handle is a few objects the collector keeps
    re-scanning: with thousands of handles that was most of the client's
    CPU (docs/PERFORMANCE.md)."""
    import gc

    current = gc.get_threshold()
    if young > current[0]:
        gc.set_threshold(young, *current[1:])
        log.info("client.gc_threshold: Python's garbage collector thresholds %s -> %s",
                 current, gc.get_threshold())


def raise_process_settings(gc_threshold: int, switch_interval_us: int) -> None:
    """``[client] gc_threshold`` and ``switch_interval_us`` (0: leave it)."""
    if gc_threshold:
        raise_gc_threshold(gc_threshold)
    if switch_interval_us:
        raise_switch_interval(switch_interval_us)


def raise_switch_interval(us: int) -> None:
    """``[client] switch_interval_us``: let a Python thread that wants the
    interpreter wait up to ``us`` microseconds (Python's default: 5,000)
    before it asks the running one to hand it over, never lowering what the
    application set.  The client's driver thread and the threads that add
    share one interpreter lock: with the default they swap it every 5 ms
    while both are busy, and each swap cuts the adds gathered per ledger
    short (docs/PERFORMANCE.md, step 46)."""
    import sys

    current = sys.getswitchinterval()
    wanted = us / 1e6
    if wanted > current:
        sys.setswitchinterval(wanted)
        log.info("client.switch_interval_us: Python's switch interval %.6f -> %.6f s",
                 current, sys.getswitchinterval())
