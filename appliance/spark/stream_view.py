"""The driver's view of a log for a streaming read: where its data ends, how
many records lie between two positions, and where the N-th record after a
position is, from the log's metadata and its entries' headers.

Every log entry's header carries the segment's running totals (records so
far, last txid, last data record: ``appliance.protocol.log_entry``), so:

* a COMPLETED segment's records and last record come from the log metadata
  alone (kept with the metadata: no entry is read);
* the IN_PROGRESS segment's end is the header of the entry at its LAC (one
  LAC read and, when the LAC moved, one entry read per trigger);
* the position of the N-th record of a segment is a binary search over the
  entries' headers (record counts only grow), a few entry reads, each
  header kept (``limits.SPARK_STREAM_HEADERS_CACHED``): entries at or below
  a LAC never change, so a header once read is right for good;
* a cold segment (``appliance.cold``: its ledger may be deleted) is never
  asked for headers or entries: its counts come from the metadata, and a
  position inside it from its verified file, loaded once (record positions,
  txids and sizes kept, not payloads:
  ``limits.SPARK_STREAM_COLD_SEGMENTS_CACHED`` segments).

A log that does not exist yet reads as a log with no record (a stream
waits for it: CONTRACT.md); one deleted after the view saw it is
``NoSuchLogError``.

Nothing here writes or fences: ledgers are opened without recovery.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pyarrow.compute as pc

from appliance.cold.reading import load_segment
from appliance.errors import NoSuchLogError
from appliance.logs.tail import owner_confirmed
from appliance.protocol import limits
from appliance.protocol.log_entry import read_header, unpack_entry
from appliance.protocol.logs import COLD, COMPLETED, DLSN, LogMetadata, Segment, new_log


class ColdPositions:
    """A cold segment's records in order: entry ids, slots, txids and payload
    sizes (from its verified file)."""

    def __init__(self, table):
        self.entries = table.column("entry_id").to_numpy()
        self.slots = table.column("slot").to_numpy().astype(np.int64)
        self.txids = table.column("txid").to_numpy()
        self.sizes = pc.binary_length(table.column("payload")).to_numpy()

    def before(self, entry_id: int, slot: int) -> int:
        """Records before position ``(entry_id, slot)``."""
        at = int(np.searchsorted(self.entries, entry_id, side="left"))
        within = np.searchsorted(self.slots[at:int(np.searchsorted(self.entries, entry_id,
                                                                   side="right"))], slot)
        return at + int(within)

    def groups(self, first: int, stop: int):
        """``(entry_id, [(slot, size)])`` of entries ``first..stop`` holding records."""
        lo = int(np.searchsorted(self.entries, first, side="left"))
        hi = int(np.searchsorted(self.entries, stop, side="right"))
        entries, slots, sizes = (self.entries[lo:hi].tolist(), self.slots[lo:hi].tolist(),
                                 self.sizes[lo:hi].tolist())
        i = 0
        while i < len(entries):
            j = i
            while j < len(entries) and entries[j] == entries[i]:
                j += 1
            yield entries[i], list(zip(slots[i:j], sizes[i:j], strict=True))
            i = j


class LogView:
    def __init__(self, client, name: str, password: bytes, where: str = "",
                 confirmed_end=owner_confirmed):
        """``confirmed_end(client, name)``: the (seg, entry) the log's owner
        says is acknowledged, or None (``appliance.logs.tail``)."""
        self.client = client
        self._confirmed_end = confirmed_end
        self.name = name
        self.password = password
        self.where = where
        self.md: LogMetadata | None = None
        self._version = None
        self._headers: OrderedDict = OrderedDict()  # (ledger id, entry id) -> EntryHeader
        self._handles: dict = {}  # ledger id -> (ReadHandle, opened while COMPLETED)
        self._lac: dict[int, int] = {}  # in-progress ledger id -> LAC read at refresh
        self._cold: OrderedDict = OrderedDict()  # seq -> ColdPositions

    # -- metadata -----------------------------------------------------------------------
    def refresh(self) -> LogMetadata:
        """Read the log's metadata again, and the in-progress segment's LAC."""
        try:
            self.md, self._version = self.client.logs.read_log(self.name)
        except NoSuchLogError:
            if self._version is not None:  # it existed: deleted under the query
                raise NoSuchLogError(f"bookkeeper source: log {self.name!r} was deleted "
                                     f"({self.where})") from None
            # not created yet: read as a log with no record, until it is
            self.md = new_log(self.name, 0)
        live = {s.ledger_id: s for s in self.md.live_segments}
        for ledger_id in [i for i in self._handles if i not in live or live[i].tier == COLD]:
            self._handles.pop(ledger_id)[0].close()
        self._lac = {}
        seg = self.md.in_progress
        if seg is not None:  # read your writes: the owner's acknowledged end, if ahead
            confirmed = self._confirmed_end(self.client, self.name)
            lac = self._handle(seg).read_lac()
            if confirmed is not None and confirmed[0] == seg.seq:
                lac = self._handle(seg).learn_lac(confirmed[1])
            self._lac[seg.ledger_id] = lac
        return self.md

    def close(self) -> None:
        for handle, _ in self._handles.values():
            handle.close()
        self._handles.clear()

    def _handle(self, seg: Segment):
        """A read handle on the segment's ledger; one opened while the segment
        was in progress is opened again once it is COMPLETED (its LAC then
        knows the ledger's end)."""
        done = seg.state == COMPLETED
        held = self._handles.get(seg.ledger_id)
        if held is not None and held[1] == done:
            return held[0]
        if held is not None:
            held[0].close()
        handle = self.client.open_ledger(seg.ledger_id, password=self.password, recovery=False)
        self._handles[seg.ledger_id] = (handle, done)
        return handle

    def last_entry(self, seg: Segment) -> int:
        """The segment's last readable entry (-1: none)."""
        if seg.state == COMPLETED:
            return seg.last_entry_id
        return self._lac.get(seg.ledger_id, -1)

    def header(self, seg: Segment, entry_id: int):
        key = (seg.ledger_id, entry_id)
        cached = self._headers.get(key)
        if cached is not None:
            self._headers.move_to_end(key)
            return cached
        (entry,) = self._handle(seg).read(entry_id, entry_id)
        header = read_header(entry.payload)
        self._headers[key] = header
        if len(self._headers) > limits.SPARK_STREAM_HEADERS_CACHED:
            self._headers.popitem(last=False)
        return header

    def cold(self, seg: Segment) -> ColdPositions:
        """A cold segment's record positions, its file read once."""
        held = self._cold.get(seg.seq)
        if held is not None:
            self._cold.move_to_end(seg.seq)
            return held
        positions = ColdPositions(load_segment(self.client.cold_config, self.name, seg))
        self._cold[seg.seq] = positions
        if len(self._cold) > limits.SPARK_STREAM_COLD_SEGMENTS_CACHED:
            self._cold.popitem(last=False)
        return positions

    def entries(self, seg: Segment, first: int, last: int):
        """Entries ``first..last`` of the segment, read now."""
        return self._handle(seg).read(first, last)

    # -- positions ----------------------------------------------------------------------
    def segments_from(self, position: DLSN) -> list[Segment]:
        return self.md.segments_from(position)

    def records_in(self, seg: Segment) -> int:
        if seg.state == COMPLETED:
            return seg.records
        last = self.last_entry(seg)
        return self.header(seg, last).records if last >= 0 else 0

    def before(self, seg: Segment, position: DLSN) -> int:
        """Records of ``seg`` before ``position``."""
        if position.seq != seg.seq:
            return 0 if position.seq < seg.seq else self.records_in(seg)
        if position.entry_id == 0 and position.slot == 0:
            return 0
        if position.entry_id > self.last_entry(seg):
            return self.records_in(seg)
        if seg.tier == COLD:
            return self.cold(seg).before(position.entry_id, position.slot)
        h = self.header(seg, position.entry_id)
        return h.records - h.count + min(position.slot, h.count)

    def data_end(self) -> DLSN | None:
        """The position just after the last record readable now (None: the
        log holds no record)."""
        for seg in reversed(self.md.live_segments):
            if seg.state == COMPLETED:
                if seg.last_dlsn is not None:
                    return seg.last_dlsn.next()
                continue
            last = self.last_entry(seg)
            if last >= 0:
                h = self.header(seg, last)
                if h.last_entry >= 0:
                    return DLSN(seg.seq, h.last_entry, h.last_slot).next()
        return None

    def count(self, start: DLSN, end: DLSN) -> int:
        """Records in ``[start, end)``."""
        return sum(self.before(seg, end) - self.before(seg, start)
                   for seg in self.segments_from(start) if seg.seq <= end.seq)

    def after_records(self, start: DLSN, n: int) -> DLSN | None:
        """The position just after the ``n``-th record from ``start`` (None:
        fewer than ``n`` records are readable now)."""
        for seg in self.segments_from(start):
            skip = self.before(seg, start)
            available = self.records_in(seg) - skip
            if n <= available:
                return self._record_at(seg, skip + n - 1).next()
            n -= available
        return None

    def _record_at(self, seg: Segment, index: int) -> DLSN:
        """The DLSN of the segment's record number ``index`` (from 0)."""
        if seg.tier == COLD:
            cold = self.cold(seg)
            return DLSN(seg.seq, int(cold.entries[index]), int(cold.slots[index]))
        lo, hi = 0, self.last_entry(seg)
        while lo < hi:  # the first entry whose running total passes index
            mid = (lo + hi) // 2
            if self.header(seg, mid).records > index:
                hi = mid
            else:
                lo = mid + 1
        h = self.header(seg, lo)
        return DLSN(seg.seq, lo, index - (h.records - h.count))

    def after_bytes(self, start: DLSN, end: DLSN, budget: int) -> DLSN:
        """The position after the whole entries from ``start`` whose records
        in ``[start, end)`` hold at most ``budget`` payload bytes (at least
        one record); ``end`` if they all fit.  Reads those entries."""
        taken, last = 0, None
        for seg in self.segments_from(start):
            if seg.seq > end.seq:
                break
            first = start.entry_id if seg.seq == start.seq else 0
            stop = min(self.last_entry(seg), end.entry_id if seg.seq == end.seq else 2**63)
            for entry_id, records in self._entry_sizes(seg, first, stop):
                kept = [(d, n) for d, n in ((DLSN(seg.seq, entry_id, s), n) for s, n in records)
                        if start <= d < end]
                size = sum(n for _, n in kept)
                if kept and last is not None and taken + size > budget:
                    return last
                if kept:
                    taken, last = taken + size, kept[-1][0].next()
        return end if last is None else last

    def _entry_sizes(self, seg: Segment, first: int, stop: int):
        """``(entry_id, [(slot, payload size)])`` of the segment's entries
        ``first..stop``: read from the bookies, or a cold segment's file."""
        if seg.tier == COLD:
            yield from self.cold(seg).groups(first, stop)
            return
        for entry_id in range(first, stop + 1, limits.LOG_READ_ENTRIES_MAX):
            chunk_last = min(stop, entry_id + limits.LOG_READ_ENTRIES_MAX - 1)
            for entry in self.entries(seg, entry_id, chunk_last):
                _, _, payloads = unpack_entry(entry.payload)
                yield entry.entry_id, [(s, len(p)) for s, p in enumerate(payloads)]

    def txid_position(self, txid: int) -> DLSN | None:
        """The first record whose txid is >= ``txid`` (None: none yet)."""
        for seg in self.md.live_segments:
            last = self.last_entry(seg)
            if last < 0 or self.records_in(seg) == 0:
                continue
            top = seg.last_txid if seg.state == COMPLETED else self.header(seg, last).last_txid
            if top < txid:
                continue
            if seg.tier == COLD:  # txids grow along the log: the first one reaching txid
                cold = self.cold(seg)
                i = int(np.argmax(cold.txids >= txid))
                return DLSN(seg.seq, int(cold.entries[i]), int(cold.slots[i]))
            lo, hi = 0, last  # the first entry whose running last txid reaches txid
            while lo < hi:
                mid = (lo + hi) // 2
                h = self.header(seg, mid)
                if h.records > 0 and h.last_txid >= txid:
                    hi = mid
                else:
                    lo = mid + 1
            (entry,) = self.entries(seg, lo, lo)
            _, txids, _ = unpack_entry(entry.payload)
            slot = next(i for i, t in enumerate(txids) if t >= txid)
            return DLSN(seg.seq, lo, slot)
        return None
