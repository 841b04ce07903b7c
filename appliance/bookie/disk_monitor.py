"""Disk-full protection: a bookie turns read-only before its disks fill up.

A bookie whose journal or ledger directory's file system is used beyond
``server.disk_usage_max`` (a fraction, default 0.95) stops taking new adds:
it answers them with ``ReadOnlyError`` (retryable), and marks itself
read-only in the metadata store, so writers replace it in their ensembles
(an ensemble change, as for any failed bookie) and new ledgers leave it out.
Everything else is still served: reads, LAC reads, fencing, long polls, and
recovery adds (a recovering client re-replicates the last entries of a
ledger; refusing them could leave the ledger unrecoverable), since those
need little or no space.  Once the usage falls to ``server.disk_usage_resume``
or below (a lower fraction, so a bookie near the line does not flap) it
takes adds again and clears the flag.

Checked every ``server.disk_check_interval_ms`` on the bookie's loop and
once at boot, before the bookie registers.  A check that cannot read the
usage (the directory vanished, EIO) counts as full: refusing adds is safe,
taking them onto a disk we cannot see is not.

What this does not cover: the space between the last check and the disk
filling up.  A write that still hits ENOSPC fails the storage; the bookie
then turns read-only at once and stays up (``appliance.bookie.full_disk``:
``force_read_only``), and takes writes again by the same rule, once the
usage is at or below ``server.disk_usage_resume``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable

from appliance.errors import ReadOnlyError
from ipc.packed import AddMultiRequest, AddPackedRequest
from ipc.replies import InfoReply
from ipc.requests import AddBatchRequest, AddRequest

log = logging.getLogger(__name__)

ADD_REQUESTS = (AddPackedRequest, AddMultiRequest, AddBatchRequest, AddRequest)


def disk_usage_fraction(path: str) -> float:
    """Used share of the file system holding ``path``, as ``df`` computes Use%:
    used / (used + available to unprivileged users), so it reaches 1.0 exactly
    when an unprivileged write would get ENOSPC, and agrees with what an
    operator sees in ``df`` (blocks reserved for root are not counted)."""
    st = os.statvfs(path)
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    avail = st.f_bavail * st.f_frsize
    return used / (used + avail) if used + avail else 1.0


class DiskMonitor:
    """Decides read-only from the usage of a set of directories (pure except
    for ``usage_fn``, which tests replace)."""

    def __init__(self, dirs: Iterable[str], usage_max: float, usage_resume: float,
                 usage_fn: Callable[[str], float] = disk_usage_fraction):
        if not 0.0 < usage_resume <= usage_max <= 1.0:
            raise ValueError(f"need 0 < usage_resume ({usage_resume}) <= usage_max "
                             f"({usage_max}) <= 1")
        self.dirs = sorted({os.fspath(d) for d in dirs})
        self.usage_max = usage_max
        self.usage_resume = usage_resume
        self.usage_fn = usage_fn
        self.read_only = False
        self.reason: str | None = None  # why read-only, in the operator's words
        self.last_usage: dict[str, float] = {}

    def force_read_only(self, reason: str) -> None:
        """Read-only now, whatever the last measure said (a write found the
        disk full); writable again by the usual rule (``check``)."""
        if not self.read_only:
            log.warning("read-only: %s", reason)
        self.read_only = True
        self.reason = reason

    def check(self) -> bool:
        """Measure every directory; return True if the read-only state changed."""
        worst = 0.0
        for d in self.dirs:
            try:
                used = self.usage_fn(d)
            except OSError as exc:
                log.error("cannot read the disk usage of %s (%s): counting it as full", d, exc)
                used = 1.0
            self.last_usage[d] = used
            worst = max(worst, used)
        if not self.read_only and worst >= self.usage_max:
            self.read_only = True
            self.reason = f"disk usage at or above {self.usage_max:.0%}"
            log.warning("disk usage %.1f%% >= %.1f%% (%s): read-only, new adds refused",
                        worst * 100, self.usage_max * 100, self._describe())
            return True
        if self.read_only and worst <= self.usage_resume:
            self.read_only = False
            self.reason = None
            log.warning("disk usage %.1f%% <= %.1f%%: writable again",
                        worst * 100, self.usage_resume * 100)
            return True
        return False

    def _describe(self) -> str:
        return ", ".join(f"{d} {u * 100:.1f}%" for d, u in self.last_usage.items())


class ReadOnlyGate:
    """Wraps a bookie's request handler: while ``monitor.read_only``, adds
    (except recovery adds) are refused with ``ReadOnlyError``; INFO replies
    carry ``read_only`` and the usage; everything else passes through."""

    def __init__(self, handler, monitor: DiskMonitor):
        self._handler = handler
        self.monitor = monitor
        self.refused_adds = 0

    def handle(self, peer: bytes, req):
        if self.monitor.read_only and isinstance(req, ADD_REQUESTS) and not req.recovery:
            self.refused_adds += 1
            raise ReadOnlyError(f"bookie is read-only ({self.monitor.reason}); adds go to "
                                "other bookies")
        reply = self._handler.handle(peer, req)
        if isinstance(reply, InfoReply):
            reply.info["read_only"] = self.monitor.read_only
            reply.info["read_only_reason"] = self.monitor.reason
            reply.info["disk_usage"] = dict(self.monitor.last_usage)
            reply.info.setdefault("counters", {})["read_only_refused_adds"] = self.refused_adds
        return reply

    def __getattr__(self, name):  # attach, after_drain, counters, ...
        return getattr(self._handler, name)


class PublishedFlag:
    """The read-only flag as the metadata store has it: ``set`` publishes
    only a change; a publish that fails is logged and left to the next
    ``set`` (the next disk check), so the registry catches up with the
    bookie once the store is reachable.  One object for every writer of
    the flag (the disk checks, ``full_disk``), so none of them can leave
    it stale for the other."""

    def __init__(self, publish: Callable[[bool], None], published: bool = False):
        self._publish = publish
        self.value = published

    def set(self, read_only: bool) -> None:
        if read_only == self.value:
            return
        try:
            self._publish(read_only)
        except Exception:  # noqa: BLE001 - retried at the next check
            log.exception("could not publish read-only = %s; retrying at the next check",
                          read_only)
            return
        self.value = read_only


def start_disk_checks(server, monitor: DiskMonitor, interval_ms: int, flag: PublishedFlag,
                      full_disk=None) -> None:
    """Re-check every ``interval_ms`` on the server's loop and bring ``flag``
    (the read-only flag in the metadata store) in line; ``full_disk``
    (``appliance.bookie.full_disk.FullDisk``) is asked first."""

    def tick() -> None:
        if full_disk is not None:  # outside the try: any other storage failure stops the bookie
            full_disk.check()
        try:
            monitor.check()
        except Exception:  # noqa: BLE001 - a failed check must not stop the checks
            log.exception("disk check failed; retrying in %d ms", interval_ms)
        flag.set(monitor.read_only)
        server.call_later_ms(interval_ms, tick)

    server.call_later_ms(interval_ms, tick)
