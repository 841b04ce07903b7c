"""The log server's gather rule: when a log has no entry in flight, wait a
little for the producers it just answered before sending what it holds.

Why: a producer that writes synchronously (or pipelined with one request
in flight) sends its next request as soon as its reply arrives.  Without
this rule the first of them to come back leaves alone in an entry, and the
others ride in the next one: N such producers split into two cohorts that
alternate, about N/2 records an entry.  Every entry costs each bookie a
journal write and an fdatasync and the owner a ledger add, so on a machine
short of CPU, fuller entries are more records per second.

Rule (``GatherGate``): a producer answered less than ``gather_s`` ago that
has not written since is *awaited*.  Records held while the log has no
entry in flight leave once no producer is awaited, or once they waited
``gather_s``, whichever comes first.  A lone producer is never held (its
own write ends its wait), and a producer that stops writing delays the
others at most ``gather_s``, once.

Pure: the caller passes the time in (seconds, any monotonic origin).
Owned by the thread that drives its log owner core
(``appliance.protocol.log_owner_commit.GroupCommit`` holds one): every
call comes from that thread.
"""

from __future__ import annotations


class GatherGate:
    def __init__(self, gather_s: float):
        if gather_s < 0:
            raise ValueError("gather_s must be >= 0")
        self.gather_s = gather_s
        self._awaited: dict[bytes, float] = {}  # producer -> when it was answered

    def __len__(self) -> int:
        return len(self._awaited)

    def answered(self, producer: bytes, now: float) -> None:
        """A write request of ``producer`` was answered (its records stored)."""
        if self.gather_s:
            self._awaited[producer] = now

    def arrived(self, producer: bytes) -> None:
        """A write request of ``producer`` arrived."""
        if self._awaited:
            self._awaited.pop(producer, None)

    def hold_until(self, held_since: float, now: float) -> float | None:
        """Records held since ``held_since``, no entry in flight: None to
        send them now, else the time until which to hold them (call again
        then, or when a request arrives)."""
        if not self._awaited:
            return None
        if now >= held_since + self.gather_s:
            return None
        latest = 0.0
        for producer, at in list(self._awaited.items()):
            if now - at >= self.gather_s:  # answered long ago: not coming back soon
                self._awaited.pop(producer, None)
            else:
                latest = max(latest, at)
        if not self._awaited:
            return None
        return min(held_since, latest) + self.gather_s
