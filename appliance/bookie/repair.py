"""BP-46 phase two: a bookie that may have lost data repairs itself from its
peers, in the background, while it serves.

Every ledger in limbo on this bookie is worked through the steps of
``appliance.protocol.repair`` (the decisions live there, so the simulation
runs them too):

* **recover**: a ledger that is not CLOSED is opened with recovery (fence,
  recovery reads, close) through an ``appliance.client.Client`` in this
  process.  This bookie answers "unknown" for what it lacks, so recovery
  never truncates an acknowledged entry because of its loss;
* **copy**: every entry of this bookie's share that it lacks (absent, or
  present but failing its checksum) is read from the entry's other replicas
  (READ_PACKED, failing over between them), verified (digest, ledger id,
  entry id: ``Rereplicator.read_verified``; an explicit negative or any
  error from a peer is never data), written to local storage and made
  durable;
* **clear**: only when the whole share is present is limbo cleared, durably.
  A deleted ledger is cleared at once (the garbage collector takes its data).

Keys: the ledger's master key is the one this bookie holds for it, or else
the one sealed in its metadata, opened with the cluster key
(``appliance.meta.custody``).  A ledger with neither stays in limbo with that
reason, except a ``crc32c`` one, whose entries can be verified without it:
its reads then carry no key, which peers holding the ledger's key refuse
unless their ``server.reads_need_key`` is off (it stays in limbo, retried).
A ledger that cannot be repaired yet (peers down, metadata unreachable)
stays in limbo and is retried with a backoff doubling from
``limits.BOOKIE_REPAIR_RETRY_MS_MIN`` to ``limits.BOOKIE_REPAIR_RETRY_MS_MAX``.
Progress is logged every ``PROGRESS_EVERY_S`` and shown by ``status()``
(INFO, ``bkctl bookie info``).
A crash during repair loses nothing: limbo is durable, so the next boot
resumes with the ledgers still in it.
"""

from __future__ import annotations

import logging
import threading
import time

from appliance.checks.digest import make_digest
from appliance.errors import BKError, NoSuchLedgerError
from appliance.protocol import limits, repair
from appliance.protocol.rereplication_plan import FragmentPlan
from appliance.rereplication.rereplicator import Rereplicator

log = logging.getLogger("appliance.bookie.repair")

COPY_BATCH_ENTRIES = 256  # entries read from a peer in one request
PROGRESS_EVERY_S = 5.0


def ledger_key(storage, custody, md, *, checked: bool = True) -> bytes | None:
    """A ledger's master key for the appliance's own work (repair,
    re-replication): the one this bookie stores for it, else the one sealed
    in its metadata (``appliance.meta.custody``; ``checked=False``: without
    its password check), else None."""
    if storage.ledger_exists(md.ledger_id):
        local = storage.get_master_key(md.ledger_id)
        if local is not None:
            return local
    return custody.unseal(md, checked=checked) if custody is not None else None


class Repairer:
    """The repair loop of one bookie (see the module docstring).

    ``open_client()`` returns an ``appliance.client.Client`` (made only when a
    ledger needs recovery); ``custody`` is a ``KeyCustody`` or None."""

    def __init__(self, bookie_id: str, storage, core, ledger_manager, registry, *,
                 custody=None, open_client=None, clock=time.monotonic):
        self.bookie_id = bookie_id
        self.storage = storage
        self.core = core
        self.ledgers = ledger_manager
        self.registry = registry
        self.custody = custody
        self._open_client = open_client
        self._client = None
        self._clock = clock
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._retry: dict[int, tuple[float, int]] = {}  # ledger -> (next try, backoff ms)
        self._lock = threading.Lock()
        self.stats = {"state": "idle", "ledgers_repaired": 0, "entries_copied": 0,
                      "bytes_copied": 0, "started_at": None, "finished_at": None,
                      "failures": {}, "last_error": None}

    # -- lifecycle ---------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="bp46-repair", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Look for limbo ledgers again now (phase one marked new ones)."""
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self._client is not None:
            self._client.close()
            self._client = None

    def status(self) -> dict:
        with self._lock:
            out = dict(self.stats)
            out["failures"] = {str(k): v for k, v in self.stats["failures"].items()}
        out["limbo_ledgers"] = self.storage.limbo_count()
        return out

    def _limbo(self) -> list[int]:
        storage = self.storage
        return [lid for lid in storage.ledgers() if storage.is_limbo(lid)]

    # -- the loop ----------------------------------------------------------------
    def _run(self) -> None:
        copier = None
        last_line = 0.0
        try:
            while not self._stop.is_set():
                limbo = self._limbo()
                if not limbo:
                    self._finish()
                    self._wake.wait()  # nothing to do until a stop
                    self._wake.clear()
                    continue
                self._begin(len(limbo))
                now = self._clock()
                due = [lid for lid in limbo if self._retry.get(lid, (0.0, 0))[0] <= now]
                for ledger_id in due:
                    if self._stop.is_set():
                        return
                    if copier is None:
                        copier = Rereplicator(self.ledgers, self.registry)
                    self._attempt(ledger_id, copier)
                    if self._clock() - last_line >= PROGRESS_EVERY_S:
                        last_line = self._clock()
                        self._progress_line()
                waits = [t for t, _ in (self._retry.get(lid, (0.0, 0)) for lid in self._limbo())]
                delay = max(0.0, min(waits, default=0.0) - self._clock())
                if delay:
                    self._wake.wait(delay)
                    self._wake.clear()
        finally:
            if copier is not None:
                copier.close()

    def _begin(self, count: int) -> None:
        with self._lock:
            if self.stats["state"] != "repairing":
                self.stats.update(state="repairing", started_at=time.time(), finished_at=None)
                log.warning("BP-46 repair: %d ledger(s) in limbo on %s; repairing from peers",
                            count, self.bookie_id)

    def _finish(self) -> None:
        with self._lock:
            if self.stats["state"] == "repairing":
                self.stats.update(state="done", finished_at=time.time())
                took = self.stats["finished_at"] - self.stats["started_at"]
                log.warning("BP-46 repair done on %s: %d ledger(s) repaired, %d entries "
                            "(%d bytes) copied in %.1f s; no ledger in limbo",
                            self.bookie_id, self.stats["ledgers_repaired"],
                            self.stats["entries_copied"], self.stats["bytes_copied"], took)

    def _progress_line(self) -> None:
        s = self.stats
        log.info("BP-46 repair on %s: %d in limbo, %d repaired, %d entries copied, "
                 "%d waiting to retry", self.bookie_id, len(self._limbo()),
                 s["ledgers_repaired"], s["entries_copied"], len(s["failures"]))

    def _attempt(self, ledger_id: int, copier) -> None:
        try:
            done = self.repair_ledger(ledger_id, copier)
            reason = None if done else "not complete"
        except Exception as exc:  # noqa: BLE001 - any failure: stay in limbo, retry later
            done, reason = False, f"{type(exc).__name__}: {exc}"
        with self._lock:
            if done:
                self._retry.pop(ledger_id, None)
                self.stats["failures"].pop(ledger_id, None)
                self.stats["ledgers_repaired"] += 1
                return
            _, backoff = self._retry.get(ledger_id, (0.0, 0))
            backoff = min(max(backoff * 2, limits.BOOKIE_REPAIR_RETRY_MS_MIN),
                          limits.BOOKIE_REPAIR_RETRY_MS_MAX)
            self._retry[ledger_id] = (self._clock() + backoff / 1000.0, backoff)
            self.stats["failures"][ledger_id] = reason
            self.stats["last_error"] = f"ledger {ledger_id}: {reason}"
        log.warning("BP-46 repair of ledger %d on %s not done (%s); retrying in %d ms",
                    ledger_id, self.bookie_id, reason, backoff)

    # -- one ledger ----------------------------------------------------------------
    def repair_ledger(self, ledger_id: int, copier) -> bool:
        """One pass over one limbo ledger; True once its limbo is cleared."""
        held: set[int] | None = None  # share entries verified present in this pass
        for _ in range(3):  # recover, then copy, then clear
            md = self._metadata(ledger_id)
            if md is not None and md.is_closed and held is None:
                held = self._held(md)
            step = repair.next_step(md, self.bookie_id, (held or set()).__contains__)
            if step == repair.GONE:
                self._clear(ledger_id)
                return True
            key = self._key(md)
            if step == repair.RECOVER:
                self._recover(md, key)
                continue
            if step == repair.COPY:
                self._copy(md, key, copier, held)
                continue
            if repair.may_clear_limbo(md, self.bookie_id, held.__contains__,
                                      protections=self.core.protections):
                self._adopt_key(ledger_id, key)
                self._clear(ledger_id)
                log.info("ledger %d repaired on %s: limbo cleared", ledger_id, self.bookie_id)
                return True
        return False

    def _metadata(self, ledger_id: int):
        try:
            return self.ledgers.read_ledger(ledger_id)[0]
        except NoSuchLedgerError:
            return None

    def _held(self, md) -> set[int]:
        """The entries of this bookie's share it holds intact: each one read
        back and its checksum verified (an entry log cut short or damaged
        under an index that still names the entry counts as missing)."""
        storage, ledger_id = self.storage, md.ledger_id
        held = set()
        if not storage.ledger_exists(ledger_id):
            return held
        for first, last in repair.share_runs(md, self.bookie_id):
            for entry_id in range(first, last + 1):
                try:
                    storage.read_entry(ledger_id, entry_id)  # verifies its checksum
                    held.add(entry_id)
                except (BKError, OSError):
                    continue
        return held

    def _key(self, md) -> bytes | None:
        return ledger_key(self.storage, self.custody, md)

    def _recover(self, md, key: bytes | None) -> None:
        if key is None:
            raise ValueError(self._no_key(md, "recover (fence and close) it"))
        if self._client is None:
            self._client = self._open_client()
        log.info("ledger %d is %s: recovering it before repair", md.ledger_id, md.state)
        self._client.open_ledger_with_key(md.ledger_id, key, recovery=True)

    def _no_key(self, md, purpose: str) -> str:
        why = ("its metadata carries no sealed key (created before key custody)"
               if md.sealed_key is None else "the cluster key cannot open its sealed key")
        return (f"no master key for ledger {md.ledger_id} to {purpose}: this bookie holds none "
                f"and {why}")

    def _copy(self, md, key: bytes | None, copier, held: set[int]) -> None:
        if key is None and md.digest_type != "crc32c":
            raise ValueError(self._no_key(md, "verify its entries"))
        digest = make_digest(md.digest_type, key or b"\0" * 32)
        self._adopt_key(md.ledger_id, key)  # before the copies: readers need it from the start
        copier.refresh_live()
        runs = list(repair.missing_runs(repair.share_runs(md, self.bookie_id),
                                        held.__contains__))
        for first, last in runs:
            plan = FragmentPlan(md.ledger_id, first, last, md.fragment_for(first)[1],
                                md.write_quorum, self.bookie_id)
            next_id = first
            while next_id <= last:
                if self._stop.is_set():
                    return
                end = min(last, next_id + COPY_BATCH_ENTRIES - 1)
                records = copier.read_verified(plan, next_id, end, digest, key)
                ids = list(range(next_id, next_id + len(records)))
                self.storage.wait_durable(
                    self.storage.add_entries([md.ledger_id] * len(ids), ids, records))
                held.update(ids)
                with self._lock:
                    self.stats["entries_copied"] += len(ids)
                    self.stats["bytes_copied"] += sum(len(r) for r in records)
                next_id += len(records)

    def _adopt_key(self, ledger_id: int, key: bytes | None) -> None:
        """Store ``key`` as the ledger's, durably, if this bookie holds none
        (it lost it with its disk): its copies are then only served to
        readers carrying it (``appliance.protocol.read_access``)."""
        if key is not None and self.storage.ledger_exists(ledger_id) \
                and self.storage.get_master_key(ledger_id) is None:
            self.storage.wait_durable(self.storage.set_master_key(ledger_id, key))

    def _clear(self, ledger_id: int) -> None:
        storage = self.storage
        if not storage.ledger_exists(ledger_id):
            return
        if not storage.options.journal_write_data:
            storage.checkpoint()  # copies in entry logs only: durable before limbo goes
        storage.wait_durable(self.core.clear_limbo(ledger_id))
