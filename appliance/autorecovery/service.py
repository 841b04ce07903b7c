"""Automatic re-replication: the auditor and the replication workers.

Both run in every bookie process (a thread, ``AutoRecovery``), so they live
as long as the bookies do: with or without the supervisor, and on every host
once several hosts run bookies.  All their state is in the metadata store
(``appliance.autorecovery.marks``).

* **Auditor** (one at a time: the bookie whose session holds the ephemeral
  ``/autorecovery/auditor`` node; another takes over when it dies).  It
  watches the registry: a bookie that ledgers name and that is not
  registered for ``autorecovery.lost_bookie_delay_ms`` is *lost* (one that
  comes back in time is forgotten); every ledger with a fragment naming a
  lost bookie gets a durable mark.  Every ``check_interval_ms`` it also asks
  each registered bookie of each CLOSED ledger, whose share is not empty,
  for the ledger (READ_LAC): one that answers "no such ledger" no longer
  holds its share, and the ledger is marked for it.
* **Workers** (one per bookie process): each takes a marked ledger under an
  ephemeral lock (gone with the worker's session: a worker that dies
  mid-copy leaves the mark for another), and re-replicates it off each
  marked bookie with the re-replication engine
  (``appliance.rereplication.rereplicator``): a CLOSED ledger entirely; an
  OPEN one's sealed fragments without disturbing its writer; an OPEN one
  whose *last* fragment still names the bookie ``open_ledger_grace_ms``
  after the mark (its writer is idle or gone) is fenced and closed first.
  A fragment is re-pointed by CAS only after every copy was acknowledged
  durable by the replacement.  The mark is removed once no fragment names
  a marked bookie.
* Keys: the bookie's own stored key for the ledger, else the one sealed in
  its metadata (``appliance.meta.custody``, the same answer as BP-46 repair).
  The auditor's READ_LAC probes carry it too (bookies refuse reads without
  the ledger's key), unchecked against the password record
  (``probe_key_for``: a scrypt per ledger per check would cost seconds): a
  bookie refuses a wrong key itself, and a refusal still says it holds the
  ledger.  A ledger without a sealed key (created before key custody) is
  probed without a key: same answer, one refusal counted (and logged at
  most once a minute) on each bookie holding it.
* ``bkctl autorecovery disable`` (a node in the store) stops the auditor's
  marking and the workers' next copy at once; ``enable`` resumes.
* The auditor also moves sealed log segments to cold storage when
  ``[cold_storage] uri`` is set (``appliance.autorecovery.cold_pass``).
* Each tick a process also notes what the bookie's ``/metrics`` shows
  (``observed``): the marks in the store (how many, since when; also while
  disabled) and whether it is the auditor.
"""

from __future__ import annotations

import logging
import threading
import time

from appliance.autorecovery.cold_pass import ColdPass
from appliance.autorecovery.marks import Marks
from appliance.curve import bookie_server_key
from appliance.errors import BKError, NoSuchLedgerError
from appliance.protocol import limits
from appliance.protocol.repair import share_runs
from appliance.rereplication.rereplicator import Rereplicator
from ipc.calls import call_once
from ipc.requests import ReadLacRequest

log = logging.getLogger("appliance.autorecovery")

TICK_S = 0.5  # how often the auditor looks at the registry and a worker at the marks


class AutoRecovery:
    """The auditor (when elected) and one worker, in one bookie process."""

    def __init__(self, bookie_id: str, store, ledger_manager, registry, config, *,
                 key_for, open_client, probe_key_for=None, clock=time.monotonic, curve=None,
                 cold_config=None):
        self.bookie_id = bookie_id
        self.curve = curve  # appliance.curve.ClientCurve: CURVE to tcp bookies
        self.marks = Marks(store)
        self.ledgers = ledger_manager
        self.registry = registry
        self.config = config
        self._key_for = key_for
        self._probe_key_for = probe_key_for or key_for
        self._open_client = open_client
        self._client = None
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.missing_since: dict[str, float] = {}
        self._seen_live: set[str] = set()
        self._last_check = -1e18
        self.stats = {"healed": 0, "entries_copied": 0, "last_error": None, "copying": None,
                      "auditor": False, "ticks": 0}
        # what the bookie's /metrics shows, replaced whole each tick (read by
        # the HTTP server's thread): appliance.bookie.metrics
        self.observed: dict = _observed({}, False)
        # the auditor's moves to cold storage ([cold_storage]; appliance.cold)
        self.cold = (ColdPass(cold_config, store, ledger_manager, key_for=key_for,
                              client_for=self._client_once)
                     if cold_config is not None and cold_config.uri else None)

    # -- lifecycle ---------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="autorecovery", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self._client is not None:
            self._client.close()

    def _run(self) -> None:
        with Rereplicator(self.ledgers, self.registry, key_for=self._key_for,
                          open_ledger=self._open_ledger, curve=self.curve) as rr:
            while not self._stop.wait(TICK_S):
                try:
                    self.step(rr)
                except Exception as exc:  # noqa: BLE001 - keep going, say why
                    self.stats["last_error"] = f"{type(exc).__name__}: {exc}"
                    log.warning("autorecovery on %s: %s", self.bookie_id, exc)

    def step(self, rr) -> None:
        now = self._clock()
        enabled = self.marks.enabled()
        self.stats["auditor"] = self.marks.try_become_auditor(self.bookie_id)
        if enabled and self.stats["auditor"]:
            self.audit(now)
        if self.cold is not None and self.stats["auditor"]:
            self.cold.tick(now)
        marks = self.marks.marks()
        self.observed = _observed(marks, self.stats["auditor"])
        if enabled:
            self.work(rr, now, marks)
        self.stats["ticks"] += 1
        self.marks.publish_worker(self.bookie_id, {**self.stats, "enabled": enabled})

    def _client_once(self):
        if self._client is None:
            self._client = self._open_client()
        return self._client

    def _open_ledger(self, ledger_id: int, key: bytes) -> None:
        self._client_once().open_ledger_with_key(ledger_id, key, recovery=True)

    # -- the auditor -------------------------------------------------------------
    def audit(self, now: float) -> None:
        live = set(self.registry.available())
        for bookie in self._seen_live - live:
            self.missing_since.setdefault(bookie, now)
        for bookie in live:
            if self.missing_since.pop(bookie, None) is not None:
                log.info("autorecovery: %s is back before it was declared lost", bookie)
        self._seen_live |= live
        delay_s = self.config.lost_bookie_delay_ms / 1000.0
        lost = {b for b, since in self.missing_since.items() if now - since >= delay_s}
        check = now - self._last_check >= self.config.check_interval_ms / 1000.0
        if not lost and not check:
            return
        if check:
            self._last_check = now
        for ledger_id in self.ledgers.list_ledgers():
            try:
                md, _ = self.ledgers.read_ledger(ledger_id)
            except NoSuchLedgerError:
                continue
            named = md.bookies()
            for bookie in named - live - set(self.missing_since):
                self.missing_since[bookie] = now  # named but never seen: the clock starts
            gone = sorted(named & lost)
            if gone and self.marks.mark(ledger_id, gone, "bookie lost", _ms()):
                log.warning("autorecovery: ledger %d under-replicated: %s lost", ledger_id,
                            ", ".join(gone))
            if check and md.is_closed:
                self._check_shares(md, live)

    def _check_shares(self, md, live: set[str]) -> None:
        key = self._probe_key_for(md)
        for bookie in sorted(md.bookies() & live):
            if not share_runs(md, bookie):
                continue
            code = _read_lac_code(self.registry, bookie, md.ledger_id, key, self.curve)
            if code == NoSuchLedgerError.code and self.marks.mark(
                    md.ledger_id, [bookie], "bookie no longer holds its share", _ms()):
                log.warning("autorecovery: %s no longer holds ledger %d: marked", bookie,
                            md.ledger_id)

    # -- a worker ----------------------------------------------------------------
    def work(self, rr, now: float, marks: dict[int, dict] | None = None) -> None:
        """Heal the marked ledgers (``marks``: read now when not given)."""
        marks = self.marks.marks() if marks is None else marks
        for ledger_id, mark in sorted(marks.items()):
            if self._stop.is_set() or not self.marks.enabled():
                return
            if not self.marks.try_lock(ledger_id, self.bookie_id):
                continue
            try:
                self.stats["copying"] = ledger_id
                self._heal(rr, ledger_id, mark)
            except Exception as exc:  # noqa: BLE001 - the mark stays: retried later
                self.stats["last_error"] = f"ledger {ledger_id}: {type(exc).__name__}: {exc}"
                log.warning("autorecovery: ledger %d not healed yet: %s", ledger_id, exc)
            finally:
                self.stats["copying"] = None
                self.marks.unlock(ledger_id)

    def _heal(self, rr, ledger_id: int, mark: dict) -> None:
        try:
            md, _ = self.ledgers.read_ledger(ledger_id)
        except NoSuchLedgerError:
            self.marks.unmark(ledger_id)
            return
        marked = [b for b in mark.get("missing", []) if b in md.bookies()]
        grace_ms = self.config.open_ledger_grace_ms
        overdue = _ms() - int(mark.get("since_ms", _ms())) >= grace_ms
        for lost in marked:
            if md.is_closed:
                report = rr.recover_ledger(ledger_id, lost)
            elif lost in md.last_fragment[1] and overdue:
                log.warning("autorecovery: open ledger %d still writes to lost %s after "
                            "%d ms: fencing and closing it", ledger_id, lost, grace_ms)
                report = rr.recover_ledger(ledger_id, lost, recover_open=True)
            else:
                report = rr.recover_ledger(ledger_id, lost, sealed_only=True)
            self.stats["entries_copied"] += report.entries_copied
            if report.failed:
                raise BKError("; ".join(f["reason"] for f in report.failed))
        md, _ = self.ledgers.read_ledger(ledger_id)
        left = [b for b in marked if b in md.bookies()]
        if not left:
            self.marks.unmark(ledger_id)
            self.stats["healed"] += 1
            log.warning("autorecovery: ledger %d back to full replication (off %s)",
                        ledger_id, ", ".join(marked) or "nothing")


def _ms() -> int:
    return int(time.time() * 1000)


def _observed(marks: dict[int, dict], auditor: bool) -> dict:
    """The marks as metrics see them: how many, the oldest one's wall-clock
    start (ms, None without marks) and whether this process is the auditor."""
    since = [int(m.get("since_ms", 0)) for m in marks.values() if m.get("since_ms")]
    return {"underreplicated": len(marks), "oldest_since_ms": min(since) if since else None,
            "auditor": bool(auditor)}


def _read_lac_code(registry, bookie_id: str, ledger_id: int,
                   master_key: bytes | None, curve=None) -> int | None:
    """The status of a plain READ_LAC of ``ledger_id`` at ``bookie_id``,
    carrying ``master_key`` (None: no answer, or a bookie this process may
    not reach over CURVE)."""
    import zmq

    info = registry.available().get(bookie_id)
    if info is None:
        return None
    try:
        server_key = bookie_server_key(curve, bookie_id, info)
    except BKError as exc:
        log.warning("autorecovery: not asking %s: %s", bookie_id, exc)
        return None
    try:
        event = call_once(info["endpoint"], ReadLacRequest(ledger_id, master_key=master_key),
                          limits.AUTORECOVERY_PROBE_TIMEOUT_MS,
                          curve_keys=curve.keys if server_key else None, server_key=server_key)
    except (zmq.ZMQError, BKError):
        return None
    return event.status if event.reply is not None else None
