"""The batch-read admission rule: which entries one READ_BATCH / READ_PACKED
reply carries.

One rule for every bookie the project runs: the real bookie
(``appliance.bookie.handler``, which reads runs from storage and cuts them
by bytes with ``storage.read_path.fit_bytes``, the same rule vectorised),
the in-memory bookie (``ipc.memserver``) and the simulated bookie
(``tests/sim/nodes.py``), whose readers' invariants therefore check it.

The rule:

* the window: at most ``min(entries asked, entries_max)`` entries (at least
  one) from the first asked, never past the last asked, and
  ``min(bytes asked, bytes_max)`` bytes of data;
* the first entry is always answered, with its data or with the status that
  refused it, so a reply is never empty and an entry larger than the byte
  limit can still be read;
* after it, entries follow in order while the data of the OK rows so far
  plus the next stays within the byte limit; an entry that does not fit ends
  the reply without a row (the client asks again from there);
* the first refused entry (not OK) ends the reply with its own row: the
  client sees exactly why, and never a gap.

Pure: the storage reads are the caller's (``read_one``).

``PackedRecords`` is how a reader holds such a reply when it came packed
(READ_PACKED: one buffer and the lengths), for ``LedgerReader``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from appliance.protocol.errors import OK


@dataclass(frozen=True, slots=True)
class BatchWindow:
    """The entries one reply may carry: ``first_entry_id..last_entry_id``,
    with the OK rows' data within ``bytes_max`` (the first row excepted)."""

    first_entry_id: int
    last_entry_id: int
    bytes_max: int

    def admits(self, entry_id: int, size: int, length: int) -> bool:
        """May an OK entry of ``length`` bytes join a reply whose OK rows
        already hold ``size`` bytes?"""
        if entry_id == self.first_entry_id:
            return True
        return entry_id <= self.last_entry_id and size + length <= self.bytes_max


def batch_window(first_entry_id: int, last_entry_id: int, entries_asked: int,
                 bytes_asked: int, entries_max: int, bytes_max: int) -> BatchWindow:
    """The window of a request, clamped by the bookie's limits."""
    entries = max(1, min(entries_asked, entries_max))
    return BatchWindow(first_entry_id, min(last_entry_id, first_entry_id + entries - 1),
                       min(bytes_asked, bytes_max))


def batch_rows(window: BatchWindow, read_one: Callable[[int], tuple[int, object]], *,
               start: int | None = None, size: int = 0,
               last: int | None = None) -> list[tuple[int, int, object]]:
    """The rule applied entry by entry: rows ``(entry id, code, data or None)``
    from ``start`` (default: the window's first) to ``last`` (default: the
    window's last), ``size`` bytes of OK data being already in the reply.
    ``read_one(entry_id) -> (code, data)``."""
    entry_id = window.first_entry_id if start is None else start
    last = window.last_entry_id if last is None else min(last, window.last_entry_id)
    rows: list[tuple[int, int, object]] = []
    while entry_id <= last or entry_id == window.first_entry_id:
        code, data = read_one(entry_id)
        if code != OK:
            rows.append((entry_id, code, None))
            break
        if not window.admits(entry_id, size, len(data)):
            break
        rows.append((entry_id, OK, data))
        size += len(data)
        entry_id += 1
    return rows


class PackedRecords:
    """Stored records back to back in one buffer (a READ_PACKED reply's data
    frame), ``lengths[i]`` bytes each: a sequence of records (``len``,
    iteration and indexing give memoryviews, a slice gives PackedRecords)
    that a batch verifier may also check as a whole."""

    __slots__ = ("data", "lengths")

    def __init__(self, data, lengths):
        self.data, self.lengths = data, lengths

    def __len__(self) -> int:
        return len(self.lengths)

    def _bounds(self):
        pos = 0
        for length in self.lengths:
            yield pos, pos + length
            pos += length

    def __iter__(self):
        view = memoryview(self.data)
        return (view[lo:hi] for lo, hi in self._bounds())

    def __getitem__(self, index):
        if isinstance(index, slice):
            lo, hi, step = index.indices(len(self.lengths))
            if step != 1 or lo != 0:
                return list(self)[index]
            lengths = self.lengths[:hi]
            return PackedRecords(memoryview(self.data)[:sum(lengths)], lengths)
        return list(self)[index]
