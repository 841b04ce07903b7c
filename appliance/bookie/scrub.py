"""A bookie's scrub of closed ledgers: entries a writer left short on this
bookie are healed without an operator, also when that writer is gone.

Every ``server.scrub_interval_ms`` (0 = off) a pass lists the ledger ids in
the metadata store and looks at up to ``server.scrub_ledgers_per_pass`` of
them (``appliance.protocol.scrub``: recent ledgers first, the rest by a
FIFO cursor, so a large set is covered over time).  A look is one metadata
read; for a CLOSED ledger naming this bookie, one index lookup per run of
its share (``storage.present_count``: no entry-log read).  A ledger missing
part of its share (a writer acknowledged entries at the ack quorum while
this bookie was stalled, then crashed, was fenced or gave up healing) is
put in BP-46 limbo, durably, and the repair loop (``appliance.bookie.repair``)
is woken: it copies the missing entries from their other replicas,
verified, and clears limbo once the share is whole.  Until then this bookie
answers "unknown" for what it lacks, never an explicit "no such entry"
(BP-46); between the close and the look it answers as it did before.

Guarantees:

* with the defaults a ledger closed while this bookie is up (or before it
  came back) is looked at within one interval (30 s), unless more ledgers
  are waiting than a pass takes; the copy follows at once (peers up);
* a ledger found whole is not looked at again while the process lives
  (kept in memory; a restart looks again at the closed ledgers naming this
  bookie, which the boot's read of every ledger tells, behind open and
  newer ledgers);
* a failed look (metadata store unreachable, damaged record) changes
  nothing and is retried at a later pass; a read-only bookie (full disk)
  skips its passes (repair would write);
* nothing is deleted or overwritten here: the only change is a limbo mark,
  which the repair loop clears.

Cost: a healthy ledger is one metadata read and a few index slices once
per process; a short one adds the repair's read of this bookie's whole
share of it (``Repairer._held`` verifies every entry it holds).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from functools import partial

from appliance.errors import BKError, NoSuchLedgerError
from appliance.protocol import scrub

log = logging.getLogger("appliance.bookie.scrub")


class Scrubber:
    """One bookie's scrub (see the module docstring).  ``wake_repair()``
    wakes the repair loop; ``writable()`` is False while read-only."""

    def __init__(self, bookie_id: str, storage, ledger_manager, *, interval_ms: int,
                 ledgers_per_pass: int, wake_repair: Callable[[], None],
                 writable: Callable[[], bool] = lambda: True,
                 clock: Callable[[], float] = time.monotonic):
        if interval_ms < 0 or ledgers_per_pass < 1:
            raise ValueError("interval_ms must be >= 0 and ledgers_per_pass >= 1")
        self.bookie_id = bookie_id
        self.storage = storage
        self.ledgers = ledger_manager
        self.interval_ms = interval_ms
        self.ledgers_per_pass = ledgers_per_pass
        self._wake_repair = wake_repair
        self._writable = writable
        self._clock = clock
        self.queue = scrub.ScrubQueue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.stats = {"passes": 0, "failed_passes": 0, "ledgers_looked_at": 0,
                      "ledgers_whole": 0, "ledgers_short": 0, "entries_missing": 0,
                      "pending": 0, "last_pass_ms": None}

    # -- one pass ------------------------------------------------------------------
    def run_once(self) -> list[int]:
        """One pass; returns the ledgers found short (put in limbo)."""
        if not self._writable():
            return []
        started = self._clock()
        self.queue.listing(self.ledgers.list_ledgers())
        short = []
        for ledger_id in self.queue.take(self.ledgers_per_pass):
            found = self._look(ledger_id)
            self.queue.outcome(ledger_id, found)
            if found == scrub.SHORT:
                short.append(ledger_id)
        if short:
            self._wake_repair()
        self.stats["passes"] += 1
        self.stats["pending"] = self.queue.pending()
        self.stats["last_pass_ms"] = round((self._clock() - started) * 1000, 1)
        return short

    def _look(self, ledger_id: int) -> str | None:
        """One ledger's verdict (None: the look failed); a short one is put
        in limbo here, durably, before the repair loop is woken."""
        try:
            md = self.ledgers.read_ledger(ledger_id)[0]
        except NoSuchLedgerError:
            md = None
        except BKError as exc:  # unreachable store, damaged record: try again later
            log.warning("scrub of ledger %d on %s: metadata not read (%s); looking again "
                        "at a later pass", ledger_id, self.bookie_id, exc)
            return None
        storage = self.storage
        present = partial(storage.present_count, ledger_id)
        found = scrub.verdict(md, self.bookie_id, storage.is_limbo(ledger_id), present)
        self.stats["ledgers_looked_at"] += 1
        if found == scrub.WHOLE:
            self.stats["ledgers_whole"] += 1
        elif found == scrub.SHORT:
            share, missing = scrub.missing_count(md, self.bookie_id, present)
            storage.wait_durable(storage.mark_limbo(ledger_id))
            self.stats["ledgers_short"] += 1
            self.stats["entries_missing"] += missing
            log.warning("scrub: closed ledger %d lacks %d of the %d entries %s should hold "
                        "(left short by a writer that is gone); in limbo, repairing from "
                        "peers", ledger_id, missing, share, self.bookie_id)
        return found

    # -- the thread ------------------------------------------------------------------
    def start(self) -> None:
        if self.interval_ms == 0:
            return
        self._thread = threading.Thread(target=self._loop, name="scrub", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def status(self) -> dict:
        return {"interval_ms": self.interval_ms, **self.stats}

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception as exc:  # noqa: BLE001 - a failed pass must not end the thread
                self.stats["failed_passes"] += 1
                if isinstance(exc, BKError):
                    log.warning("scrub pass on %s failed (retrying in %d ms): %s",
                                self.bookie_id, self.interval_ms, exc)
                else:
                    log.exception("scrub pass on %s failed", self.bookie_id)
            self._stop.wait(self.interval_ms / 1000.0)
