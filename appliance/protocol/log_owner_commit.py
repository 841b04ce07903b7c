"""The log owner's group commit (a part of ``LogOwner``, which owns it and
is its only caller): records of every producer are packed many to an entry,
entries in flight are counted from the owner's own events (sent, acknowledged,
failed), and what leaves when is decided here.

Rules:

* Cutting: records join the open batch until the next one would not fit
  an entry (``entry_room_bytes``) or the batch reaches ``flush_bytes``: the
  writer's own packing rule, so one batch is one ledger entry.  A cut
  (sealed) batch leaves as soon as the ledger's window has room.
* The open batch leaves at once when no entry is in flight, unless the
  gather rule holds it (``appliance.protocol.gather``: producers just
  answered are awaited, at most ``gather_ms``); while entries are in
  flight it waits for an ack, or for ``linger_ms`` since its first record,
  then leaves while fewer than ``entries_inflight_max`` are in flight.
* The ledger's window (``window_entries``, ``window_bytes``: the ledger
  handle's ``[client] inflight_adds_max`` / ``inflight_bytes_max``) is
  never overrun, so the writer's add never waits for room: the server's
  one thread serves every log.  ``has_room`` tells a request that would
  need more entries than the window has room for to retry (bytes beyond
  the window go once nothing is in flight, as the handle takes them).

Pure: time is passed in (``now_ms``); no threads.  Owned by the thread that
drives its ``LogOwner``.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from dataclasses import dataclass

from appliance.protocol import limits
from appliance.protocol.gather import GatherGate
from appliance.protocol.log_entry import HEADER_BYTES, RECORD_OVERHEAD, TAG_BYTES


@dataclass(frozen=True)
class OwnerConfig:
    """The owner's limits (the log server takes them from its config)."""
    linger_ms: float = limits.LOG_SERVICE_LINGER_US / 1000
    gather_ms: float = limits.LOG_SERVICE_GATHER_US / 1000
    entries_inflight_max: int = limits.LOG_SERVICE_ENTRIES_INFLIGHT
    window_entries: int = limits.CLIENT_INFLIGHT_ADDS_MAX
    window_bytes: int = limits.CLIENT_INFLIGHT_BYTES_MAX
    flush_bytes: int = 128 * 1024
    entry_room_bytes: int = 1024 * 1024 - HEADER_BYTES  # an entry's bytes after its header
    record_overhead: int = RECORD_OVERHEAD + TAG_BYTES
    control_interval_ms: float = limits.LOG_SERVICE_CONTROL_INTERVAL_MS
    producers_max: int = limits.LOG_SERVICE_PRODUCERS_MAX
    recent_max: int = limits.LOG_SERVICE_RECENT_MAX
    producer_idle_ms: int = limits.LOG_SERVICE_PRODUCER_IDLE_MS

    @property
    def record_bytes_max(self) -> int:
        return self.entry_room_bytes - self.record_overhead


class Batch:
    """Records bound for one entry: their tags and payloads, the requests
    waiting for them, and (once sent) its number."""

    __slots__ = ("entry_no", "tags", "payloads", "size", "waiters", "control", "since_ms",
                 "runs")

    def __init__(self, since_ms: float, control: bool = False):
        self.since_ms = since_ms  # its first record came then (the linger counts from it)
        self.entry_no = 0  # 0: not sent yet
        self.tags: list = []
        self.payloads: list = []
        self.size = 0  # records' bytes with their overhead
        self.waiters: list = []  # requests answered once it is acknowledged
        self.control = control
        self.runs: list | None = None  # once acknowledged: [seg, entry, first slot, n], in order

    def bytes(self) -> int:
        """Its size as the ledger handle counts it (the packed entry)."""
        return self.size + HEADER_BYTES


class Pending:
    """A record's place in a batch: the duplicate filter keeps it as the
    record's position (``position()``: None while the batch is held or in
    flight, its position once acknowledged), so an ack updates no entry of
    the filter."""

    __slots__ = ("batch", "index")

    def __init__(self, batch: Batch, index: int):
        self.batch, self.index = batch, index

    def position(self) -> tuple | None:
        runs = self.batch.runs
        if runs is None:
            return None
        k = self.index
        for seg, entry, slot, n in runs:
            if k < n:
                return seg, entry, slot + k
            k -= n
        raise IndexError(f"record {self.index} is not in its entry's runs")


def slice_runs(runs: list, start: int, count: int) -> list[list]:
    """The runs of records ``start .. start + count - 1`` of an entry whose
    records are at ``runs``."""
    out = []
    for seg, entry, slot, n in runs:
        if start >= n:
            start -= n
            continue
        take = min(n - start, count)
        out.append([seg, entry, slot + start, take])
        count -= take
        start = 0
        if not count:
            break
    return out


class GroupCommit:
    """See the module docstring."""

    def __init__(self, config: OwnerConfig):
        self.config = config
        self.limit = max(1, min(config.flush_bytes, config.entry_room_bytes))
        self.gate = GatherGate(config.gather_ms / 1000)
        self.waiting: deque[Batch] = deque()  # not sent, in order; the last may be open
        self.inflight: deque[Batch] = deque()  # sent, not acknowledged, in order
        self.inflight_bytes = 0
        self._numbers = itertools.count(1)

    def idle(self) -> bool:
        return not self.waiting and not self.inflight

    def has_room(self, sizes: list[int]) -> bool:
        """May a request of records of ``sizes`` be taken now: the entries it
        would cut fit the ledger's window (or nothing is in flight)?"""
        if not self.inflight:
            return True
        overhead = self.config.record_overhead
        total = self._open_size() + sum(sizes) + len(sizes) * overhead
        if total < self.limit:
            return True
        entries = len(self.waiting) + total // self.limit + 1
        if max(sizes, default=0) + overhead + self.limit > self.config.entry_room_bytes:
            entries += len(sizes)  # a record that may not fit after a batch: one each
        return len(self.inflight) + entries <= self.config.window_entries and \
            self.inflight_bytes + total + entries * HEADER_BYTES <= self.config.window_bytes

    def _open_size(self) -> int:
        last = self.waiting[-1] if self.waiting else None
        return last.size if last is not None and not self._sealed(last) else 0

    def _sealed(self, batch: Batch) -> bool:
        return batch is not self.waiting[-1] or batch.size >= self.limit

    def add_run(self, producer_id: bytes, seq: int, payloads, now_ms: float) -> list:
        """Buffer a producer's records ``seq, seq + 1, ...``; their places
        (``Pending``: batch and index), in order.  (The hot path: one pass,
        the batch's fields in locals.)"""
        overhead, room, limit = self.config.record_overhead, self.config.entry_room_bytes, \
            self.limit
        waiting = self.waiting
        last = waiting[-1] if waiting else None
        fits = last is not None and not last.control
        size = last.size if fits else 0
        index = len(last.payloads) if fits else 0
        places = []
        for payload in payloads:
            record = len(payload) + overhead
            if not fits or size >= limit or (index and size + record > room):
                if fits:
                    last.size = size
                last = Batch(now_ms)
                waiting.append(last)
                fits, size, index = True, 0, 0
            last.tags.append((producer_id, seq))
            last.payloads.append(payload)
            places.append(Pending(last, index))
            seq += 1
            index += 1
            size += record
        if fits:
            last.size = size
        return places

    def add_control(self, now_ms: float) -> Batch:
        batch = Batch(now_ms, control=True)
        self.waiting.append(batch)
        return batch

    def due_to_send(self, now_ms: float, flushing: bool) -> tuple[Batch | None, float]:
        """The next batch to send now (or None), and else when to look again
        (``math.inf``: at an ack or a request).  ``flushing``: send what is
        held as soon as the window allows (closing: no linger, no gather)."""
        if not self.waiting:
            return None, math.inf
        batch = self.waiting[0]
        if not self._window_room(batch):
            return None, math.inf  # an ack makes room
        if flushing or batch.control or self._sealed(batch):
            return batch, 0.0
        since = batch.since_ms
        if not self.inflight:
            until_s = self.gate.hold_until(since / 1000, now_ms / 1000)
            if until_s is None or until_s * 1000 <= now_ms:  # (seconds to ms: rounding)
                return batch, 0.0
            return None, until_s * 1000
        linger_end = since + self.config.linger_ms
        if now_ms < linger_end:
            return None, linger_end
        if len(self.inflight) < self.config.entries_inflight_max:
            return batch, 0.0
        return None, math.inf

    def _window_room(self, batch: Batch) -> bool:
        if not self.inflight:
            return True
        return len(self.inflight) < self.config.window_entries and \
            self.inflight_bytes + batch.bytes() <= self.config.window_bytes

    def send(self, batch: Batch) -> int:
        """``batch`` (the first waiting) leaves: its entry number."""
        self.waiting.popleft()
        batch.entry_no = next(self._numbers)
        self.inflight.append(batch)
        self.inflight_bytes += batch.bytes()
        return batch.entry_no

    def acked(self) -> Batch:
        """The oldest entry in flight was acknowledged: that batch."""
        batch = self.inflight.popleft()
        self.inflight_bytes -= batch.bytes()
        return batch

    def drain(self) -> list[Batch]:
        """Every batch held or in flight, forgotten (the log is dropped)."""
        batches = [*self.inflight, *self.waiting]
        self.inflight.clear()
        self.waiting.clear()
        self.inflight_bytes = 0
        return batches
