"""A bookie's garbage collector: forget deleted ledgers, reclaim their space.

Deleting a ledger (``bkctl ledger delete``, ``Client.delete_ledger``) only
removes its metadata.  Every ``server.gc_interval_ms`` each bookie compares
the ledgers it stores with the metadata store and deletes, locally, the ones
whose metadata is gone; then it gives their space back
(``LedgerStorage.give_back_space``): the active entry log is rotated once
``storage.entry_log_rotate_garbage_bytes`` of it are deleted ledgers' (or
under ``storage.compaction_minor_threshold`` of it is live), a checkpoint
makes the snapshot forget them (and frees the journal segments before it),
the entry logs that hold nothing but deleted ledgers are removed
(``storage.gc``: only logs no snapshot references any more) and, if a
sealed log's live share is under ``storage.compaction_minor_threshold``, a
minor compaction starts at once.  So a deleted ledger's space is back at
most two intervals after its metadata went (plus the checkpoint, and the
compaction's copying at ``storage.compaction_rate_bytes_per_s``); data
sharing a log with more live data than the minor threshold waits for the
timed compactions.

Why this never deletes a live ledger:

* the local ledger list is taken *before* the metadata listing; a ledger
  reaches a bookie only after its metadata was created, so a ledger stored
  before the listing started and missing from it was deleted;
* a ledger must be missing from two consecutive passes, and its metadata is
  then read once more by id, so a listing served by a lagging ZooKeeper
  follower, or any other transient miss, deletes nothing;
* a pass that cannot reach the metadata store changes nothing.

``collect_now`` (before a requested compaction: ``bkctl bookie compact``)
deletes in one pass what the periodic passes take two intervals for: the
local list first, then the listing, then ``store.sync()`` and the re-read by
id of each missing ledger.  After the sync the re-read sees every write
acknowledged before it, so it sees the metadata of every ledger stored
before the local list was taken: a ledger it does not find was deleted.

Over-replicated ledgers (``server.overreplicated_grace_ms``; 0 = off).  A
ledger whose metadata exists but no longer needs this bookie's copy
(``appliance.protocol.overreplication``: no fragment holding entries names
it; not IN_RECOVERY) is left behind by re-replication (``bkctl bookie
recover``, autorecovery, decommission) or by an ensemble change that
replaced this bookie while it was away.  Such a ledger is deleted locally
once it was seen so in ``PASSES_MIN`` consecutive passes spanning the grace
period, then checked once more, in this order:

  t0  first sighting: ``m = storage.activity_mark()`` (every later add or
      state change of any ledger carries a seq above ``m``);
  t1  ``store.sync()``, then no copy marker (``appliance.rereplication.markers``)
      names this bookie for the ledger;
  t2  its metadata re-read by id still does not need this bookie;
  t3  ``storage.delete_ledger_if_idle(ledger, m)``: refused, under the
      storage lock, if the ledger got any add (recovery adds included) or
      state change after ``m``, or is in BP-46 limbo.  A fenced ledger stays
      fenced (an empty fenced ledger), so a writer fenced here stays fenced.

Why no copy that metadata will name is ever deleted.  Only four things put
copies on a bookie: (i) a writer, after the ensemble change that names the
bookie is CASed; (ii) a ledger recovery's write-back, which names the
bookie only at its closing CAS, the ledger being IN_RECOVERY from before
its first write until then; (iii) a re-replicator, which holds a marker
from before its first copy until after the CAS that names the bookie; (iv)
BP-46 repair, only into ledgers in limbo here.  Take any of (i)-(iii) whose
CAS naming this bookie happens at tc.  If tc < t2, the re-read at t2 sees it
(the sync at t1 makes the reads current) and nothing is deleted; a later
version can stop needing this copy only by moving it elsewhere first.  If
tc > t2: (i) every add follows tc, so follows t2 > m; (ii) the recovery's
IN_RECOVERY CAS follows t2 (t2 saw OPEN or CLOSED, and a ledger never leaves
those for IN_RECOVERY after being recovered), so its writes follow m; (iii)
the marker, held over [first copy, tc], was absent at t1 < tc, so it was
created after t1 and every copy follows m.  So every such copy is written
after m: one written before t3 makes t3 refuse; one written after t3 lands
after the delete and is kept.  (iv) limbo ledgers are never deleted.  A
re-replicator killed mid-copy leaves its marker (persistent on purpose: an
ephemeral one could expire under a live re-replicator); its copies are then
kept, the safe side.

Runs on its own thread (metadata calls may take seconds); the storage is
thread-safe.  A failed pass is logged and retried at the next interval.

A pass on request (``request``: ``bkctl bookie gc``, also while the bookie
is read-only because its disk is full, BookKeeper #3205) does, at once:
two passes (a ledger missing from both, and gone when re-read by id, is
deleted; the metadata store is synced between them, standing in for the
interval between two timed passes), a checkpoint (the snapshot on disk no
longer names the deleted ledgers, so their entry logs may go), the
removal of those logs (and of the journal segments before the new
checkpoint), and a minor compaction (sparse logs rewritten; a
checkpoint then lets the rewritten logs go too).
What it gave back is in ``last_forced``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from appliance.errors import BKError, CorruptMetadataError, NoSuchLedgerError
from appliance.protocol import overreplication as orep

log = logging.getLogger(__name__)


def journal_bytes(directory: str) -> int:
    """Bytes the journal's segments hold on disk (allocated, not apparent)."""
    total = 0
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.name.startswith("journal-"):
                try:
                    total += entry.stat().st_blocks * 512
                except FileNotFoundError:
                    continue  # freed meanwhile
    return total


class LedgerGC:
    """One bookie's collector (see the module docstring)."""

    def __init__(self, storage, ledger_manager, interval_ms: int, *, bookie_id: str = "",
                 markers=None, overreplicated_grace_ms: int = 0,
                 clock_ms: Callable[[], int] | None = None):
        """``markers``: ``appliance.rereplication.markers.CopyMarkers`` (needed
        when ``overreplicated_grace_ms`` > 0, which turns on the collection of
        over-replicated ledgers for ``bookie_id``)."""
        if overreplicated_grace_ms > 0 and (markers is None or not bookie_id):
            raise ValueError("collecting over-replicated ledgers needs bookie_id and markers")
        self.storage = storage
        self.ledgers = ledger_manager
        self.interval_ms = interval_ms
        self.bookie_id = bookie_id
        self.markers = markers
        self.overreplicated_grace_ms = overreplicated_grace_ms
        self._clock_ms = clock_ms or (lambda: int(time.monotonic() * 1000))
        self._suspects: set[int] = set()  # missing from the previous pass
        self._sightings: dict[int, orep.Sighting] = {}  # seen over-replicated
        self.last_overreplicated: list[int] = []  # deleted as over-replicated by the last pass
        self._stop = threading.Event()
        self._wake = threading.Event()  # a pass was requested
        self._thread: threading.Thread | None = None
        self.last_forced: dict | None = None  # what the last requested pass gave back
        self._pass_lock = threading.Lock()  # the thread's passes and collect_now
        self.stats = {"passes": 0, "ledgers_deleted": 0, "logs_removed": 0, "bytes_freed": 0,
                      "failed_passes": 0, "overreplicated_deleted": 0,
                      "overreplicated_entries_deleted": 0, "overreplicated_kept": 0,
                      "overreplicated_waiting": 0, "requests": 0, "requests_done": 0,
                      "active_log_rotations": 0, "compactions_started": 0}

    def run_once(self) -> list[int]:
        """One pass; returns the ledgers deleted locally."""
        with self._pass_lock:
            local = set(self.storage.ledgers())  # first: see the module docstring
            listed = set(self.ledgers.list_ledgers())
            missing = local - listed
            deleted = self._delete_gone(missing & self._suspects)
            self._suspects = missing - set(deleted)
            self.last_overreplicated = self.collect_overreplicated(local & listed)
            space = self.storage.give_back_space(len(deleted) + len(self.last_overreplicated))
            self.stats["passes"] += 1
            self.stats["logs_removed"] += len(space["logs_removed"])
            self.stats["bytes_freed"] += space["bytes_freed"]
            self.stats["active_log_rotations"] += bool(space["rotated_garbage_bytes"])
            self.stats["compactions_started"] += space["compaction"]
        return deleted

    def collect_now(self) -> list[int]:
        """Delete now every local ledger whose metadata is gone, in one pass
        (see the module docstring: the sync replaces the second pass);
        returns them.  Entry logs are left to the compaction that asked."""
        with self._pass_lock:
            local = set(self.storage.ledgers())  # first: see the module docstring
            missing = local - set(self.ledgers.list_ledgers())
            if missing:
                self.ledgers.store.sync()  # the re-reads see every delete and create
            deleted = self._delete_gone(missing)
            self._suspects -= set(deleted)
        return deleted

    def _delete_gone(self, candidates) -> list[int]:
        """Delete the candidates whose metadata a read by id does not find."""
        deleted = []
        for ledger_id in sorted(candidates):
            try:
                self.ledgers.read_ledger(ledger_id)
                continue  # it exists after all
            except NoSuchLedgerError:
                pass
            self.storage.delete_ledger(ledger_id)
            deleted.append(ledger_id)
        self.stats["ledgers_deleted"] += len(deleted)
        if deleted:
            log.info("deleted %d ledgers whose metadata is gone: %s", len(deleted), deleted)
        return deleted

    # -- over-replicated ledgers (see the module docstring) --------------------------
    def collect_overreplicated(self, candidates: set[int]) -> list[int]:
        """One over-replication pass over local ledgers that have metadata;
        returns the ledgers deleted."""
        if self.overreplicated_grace_ms <= 0:
            return []
        mark = self.storage.activity_mark()  # before the reads: see t0 above
        views = {}
        for ledger_id in sorted(candidates):
            if self.storage.ledger_entry_count(ledger_id) == 0:
                continue  # nothing to reclaim (state only, or a fenced empty ledger)
            views[ledger_id] = self._metadata(ledger_id)[0]
        limbo = {lid for lid in views if self.storage.is_limbo(lid)}
        marked = self.markers.ledgers_marked_for(self.bookie_id) if views else set()
        self._sightings, due = orep.observe(
            self._sightings, self.bookie_id, views, marked, limbo, self._clock_ms(), mark,
            self.overreplicated_grace_ms)
        deleted = [lid for lid in due if self._delete_overreplicated(lid)]
        self.stats["overreplicated_waiting"] = len(self._sightings)
        return deleted

    def _delete_overreplicated(self, ledger_id: int) -> bool:
        seen = self._sightings.pop(ledger_id)
        self.markers.store.sync()  # t1: the marker lookup and re-read are current
        marked = self.markers.held_for(ledger_id, self.bookie_id)
        md, version = (None, None) if marked else self._metadata(ledger_id)  # t2
        reason = orep.final_verdict(md, self.bookie_id, marked)
        entries = self.storage.ledger_entry_count(ledger_id)
        if reason is None and self.storage.delete_ledger_if_idle(ledger_id, seen.mark) is None:
            reason = "it was written to, fenced or put in limbo while waiting"  # t3 refused
        if reason is not None:
            self.stats["overreplicated_kept"] += 1
            log.info("kept over-replicated-looking ledger %d on %s: %s", ledger_id,
                     self.bookie_id, reason)
            return False
        waited_ms = self._clock_ms() - seen.first_ms
        self.stats["overreplicated_deleted"] += 1
        self.stats["overreplicated_entries_deleted"] += entries
        log.info("deleted over-replicated ledger %d (%d entries) on %s: its metadata "
                 "(%s, version %s) names this bookie in no fragment holding entries, no "
                 "re-replication is copying it here, and it had no add for %d ms",
                 ledger_id, entries, self.bookie_id, md.state, version, waited_ms)
        return True

    def _metadata(self, ledger_id: int):
        """(metadata, version), or (None, None) when it is gone or damaged
        (then the copy is kept: a damaged record must not stop the GC)."""
        try:
            return self.ledgers.read_ledger(ledger_id)
        except NoSuchLedgerError:
            return None, None
        except CorruptMetadataError as exc:
            log.warning("ledger %d: unreadable metadata, its copy on %s is kept: %s",
                        ledger_id, self.bookie_id, exc)
            return None, None

    # -- a pass on request (see the module docstring) ------------------------------
    def request(self) -> int:
        """Ask the thread for a pass now; returns a ticket: the pass is done
        (``last_forced`` holds what it gave back) once
        ``stats["requests_done"] >= ticket``."""
        self.stats["requests"] += 1
        self._wake.set()
        return self.stats["requests"]

    def forced_pass(self) -> dict:
        """The requested pass; returns what it gave back."""
        started, before = time.monotonic(), dict(self.stats)
        journal_before = journal_bytes(self.storage.journal_dir)
        deleted = self.run_once()
        store = getattr(self.ledgers, "store", None)
        if store is not None and hasattr(store, "sync"):
            store.sync()  # the second listing is as current as the store can make it
        deleted += self.run_once()
        self.storage.checkpoint()  # the snapshot forgets them: their logs may go now
        removed, freed = self.storage.reclaim_entry_logs()
        self.stats["logs_removed"] += len(removed)
        self.stats["bytes_freed"] += freed
        out = {"ledgers_deleted": len(deleted),
               "logs_removed": self.stats["logs_removed"] - before["logs_removed"],
               "bytes_freed": self.stats["bytes_freed"] - before["bytes_freed"],
               "compaction": None, "compaction_error": None}
        try:
            done = self.storage.compact(major=False)
            out["compaction"] = done
            out["logs_removed"] += done.get("logs_removed", 0)
            out["bytes_freed"] += done.get("bytes_reclaimed", 0)
            self.storage.checkpoint()  # the snapshot calls the compacted logs garbage:
            removed, freed = self.storage.reclaim_entry_logs()  # they may go now
            out["logs_removed"] += len(removed)
            out["bytes_freed"] += freed
        except Exception as exc:  # noqa: BLE001 - e.g. no room to copy into: what the
            out["compaction_error"] = f"{type(exc).__name__}: {exc}"  # deletions gave counts
        out["journal_bytes_freed"] = max(0, journal_before -
                                         journal_bytes(self.storage.journal_dir))
        out["bytes_freed"] += out["journal_bytes_freed"]
        out["seconds"] = round(time.monotonic() - started, 3)
        log.info("requested garbage collection: %d ledgers deleted, %d entry logs removed, "
                 "%d bytes given back", out["ledgers_deleted"], out["logs_removed"],
                 out["bytes_freed"])
        return out

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="ledger-gc", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval_ms / 1000.0)
            self._wake.clear()
            if self._stop.is_set():
                return
            wanted = self.stats["requests"]
            try:
                if wanted > self.stats["requests_done"]:
                    self.last_forced = {"ok": True, **self.forced_pass()}
                else:
                    self.run_once()
            except Exception as exc:  # noqa: BLE001 - a failed pass must not kill the thread
                self.stats["failed_passes"] += 1
                if wanted > self.stats["requests_done"]:
                    self.last_forced = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
                if isinstance(exc, BKError):  # metadata unreachable, storage closing or failed
                    log.warning("garbage collection pass failed (retrying in %d ms): %s",
                                self.interval_ms, exc)
                else:
                    log.exception("garbage collection pass failed")
            finally:
                self.stats["requests_done"] = max(self.stats["requests_done"], wanted)
