"""A full disk is a state, not a crash: the bookie turns read-only, stays up,
and takes writes again once there is room.

The disk monitor (``appliance.bookie.disk_monitor``) turns a bookie
read-only at ``server.disk_usage_max``, but a disk can still fill between
two checks (a journal segment or an entry log being preallocated, a burst
of large adds), whichever of the journal's or the ledger's file system
fills first.  Then a write fails with ENOSPC (or EDQUOT) and the storage
stops taking writes (``LedgerStorage.failure``).  ``FullDisk`` sees that
failure, from the handler as soon as a durability wait reports it, or at
the next disk check, and:

* every reply still waiting for durability is answered with an error,
  never acknowledged (``BookieHandler.storage_failed``): the adds it
  covers are not durable here, and the writer re-sends them elsewhere;
* the bookie is read-only at once (``DiskMonitor.force_read_only``) and
  says so in the metadata store: writers replace it, new ledgers leave it
  out.  Reads, LAC reads and long polls go on from what is on disk;
* once the usage is back at ``server.disk_usage_resume`` or below (or
  ``bkctl bookie gc`` asks, to make room), the storage is reopened in this
  process (``LedgerStorage.reopen``: its RESERVE room given back first, the
  journal replayed as after a crash, so exactly what was durable is
  served) and the bookie takes writes again when the monitor says so (and
  takes its reserve back then).  A reopen that fails for lack of room is
  retried at the next check.

The reopen runs on the bookie's loop: it answers nothing meanwhile (a
replay of the journal since the last checkpoint; ``last_reopen_s``).

Any other storage failure (an I/O error, a failed fsync) still stops the
bookie (fail-stop): the supervisor restarts it, and the journal replay
decides what was durable.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from appliance.errors import BookieIOError
from storage.aligned_io import out_of_space

log = logging.getLogger(__name__)


class FullDisk:
    """One bookie's handling of a storage failed for a full disk (see the
    module docstring).  Runs on the bookie's loop thread."""

    def __init__(self, storage, handler, monitor, flag, after_reopen: Callable[[], None]):
        self.storage = storage
        self.handler = handler
        self.monitor = monitor
        self.flag = flag  # disk_monitor.PublishedFlag: the registry's read-only flag
        self.after_reopen = after_reopen  # BP-46 phase one again, if the reopen asks for it
        self.full = False
        self.reserves_out = False
        self.stats = {"out_of_space": 0, "reopens": 0, "failed_reopens": 0, "last_error": None,
                      "last_reopen_s": None}

    def failed(self, exc: BaseException) -> None:
        """The storage failed (the handler has answered what waited on it)."""
        if not out_of_space(exc):
            raise BookieIOError(f"storage failed: {exc}") from exc
        if self.full:
            return
        self.full = True
        self.stats["out_of_space"] += 1
        self.stats["last_error"] = str(exc)
        log.error("disk full (%s): read-only; adds not yet durable were refused; reads go on; "
                  "writes resume once the usage is at or below server.disk_usage_resume "
                  "(bkctl bookie gc gives space back)", exc)
        self.monitor.force_read_only(f"a write failed: {exc}")
        self._publish(True)

    def booted_full(self) -> None:
        """The storage opened only with its RESERVE room given back: boot
        read-only; writable again by the usual rule."""
        self.reserves_out = True
        self.monitor.force_read_only("booted on a full disk")

    def check(self) -> None:
        """At each disk check, before the monitor measures: notice a failure
        no durability wait reported, reopen once there is room."""
        failure = self.storage.failure()
        if failure is None:
            if self.reserves_out and not self.monitor.read_only:
                self.reserves_out = not self.storage.restore_reserves()
            return
        if not self.full:
            self.handler.storage_failed(failure)  # calls failed(): raises unless full
        self.monitor.check()
        if not self.monitor.read_only:
            self.reopen("usage back at or below server.disk_usage_resume")

    def reopen(self, why: str) -> bool:
        """Reopen a storage that failed for a full disk; True when it serves
        writes again (the monitor still decides when adds are taken)."""
        if not self.full:
            return self.storage.failure() is None
        self.handler.detach_storage()  # fails every reply parked on the old journal
        started = time.monotonic()
        try:
            self.storage.reopen()
        except Exception as exc:  # noqa: BLE001 - judged below: full again, or fail-stop
            self.stats["failed_reopens"] += 1
            self.stats["last_error"] = str(exc)
            if not out_of_space(exc):
                raise BookieIOError(f"storage could not be reopened: {exc}") from exc
            log.warning("storage still full (%s): read-only; retrying at the next disk check",
                        exc)
            self.monitor.force_read_only(f"reopen failed: {exc}")
            return False
        self.handler.attach_storage()
        self.full = False
        self.reserves_out = True  # given back by the reopen; taken again once writable
        self.stats["reopens"] += 1
        self.stats["last_reopen_s"] = round(time.monotonic() - started, 3)
        log.warning("storage reopened in %.3f s (%s): journal replayed, writable once the "
                    "usage allows", self.stats["last_reopen_s"], why)
        self.after_reopen()
        self.monitor.check()
        self._publish(self.monitor.read_only)
        return True

    def _publish(self, read_only: bool) -> None:
        self.flag.set(read_only)

    def info(self) -> dict:
        return {"full": self.full, **self.stats}
