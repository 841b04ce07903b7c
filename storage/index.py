"""The in-memory index: (ledger, entry) -> (entry log, offset, length), and
per-ledger state (master key, fenced, limbo, explicit LAC).

Memory, stated and bounded: each ledger's entry ids map to slots in pages of
``PAGE_SLOTS`` (4096) slots; a slot is three uint32 (log id, offset, length),
**12 bytes per entry-id slot**.  A page is allocated only when one of its ids
is stored and grows by doubling from 16 slots, so a page holding ids up to
slot s costs at most ``max(16, 2 * (s + 1)) * 12`` bytes.  For a ledger whose
entries are all on this bookie that is 12 bytes/entry (full pages) and never
more than 24 bytes/entry (+192 bytes for a tiny ledger).  Striping leaves
holes: with ensemble E and write quorum W a bookie holds W/E of the ids, so
its cost per stored entry is 12 * E / W bytes.  Each ledger also costs about
500 bytes of Python objects (state object, page dict).

Updates are per batch with numpy (one scatter per (ledger, page) group), so
the index costs well under a microsecond per added entry; batches of a few
entries, or of many ledgers with a few entries each, go entry by entry with
scalars (numpy's per-call cost dominates them).

The index is not durable by itself: ``snapshot`` persists it at checkpoints
and the journal (and, without journaled data, the entry-log tail) rebuilds
what came after.  ``freeze()`` gives a checkpoint a consistent copy in
O(ledgers + pages) without copying the pages: they are shared, and a put
copies a shared page before writing it (copy on write) until ``thaw()``.
Not thread-safe: the facade serialises access (the frozen copy is read-only
and may be read from another thread).
"""

from __future__ import annotations

import numpy as np

from appliance.protocol.errors import NoSuchEntryError, NoSuchLedgerError

PAGE_BITS = 12
PAGE_SLOTS = 1 << PAGE_BITS
PAGE_MASK = PAGE_SLOTS - 1
MIN_PAGE_SLOTS = 16
SLOT_BYTES = 12
ABSENT = 0xFFFF_FFFF  # in the length column: no entry in this slot
LEDGER_OBJECT_BYTES = 500  # rough Python overhead per ledger, for stats
SMALL_PUT_ENTRIES = 24  # up to this many entries a put goes entry by entry with scalars
SCALAR_LEDGER_ENTRIES = 16  # a put of fewer entries per ledger than this, on average, too
RUN_PUT_ENTRIES_MIN = 4  # ... where a run of this many consecutive ids goes as slices


class Ledger:
    """One ledger's state and entry pages on this bookie."""

    __slots__ = ("ledger_id", "master_key", "fenced", "limbo", "explicit_lac",
                 "last_entry", "entries", "data_bytes", "pages", "state_seq", "add_seq")

    def __init__(self, ledger_id: int):
        self.ledger_id = ledger_id
        self.master_key: bytes | None = None
        self.fenced = False
        self.limbo = False
        self.explicit_lac = -1
        self.last_entry = -1
        self.entries = 0
        self.data_bytes = 0
        self.pages: dict[int, np.ndarray] = {}
        self.state_seq = 0  # seq of the last journaled state change
        # seq of the last add since this process opened the storage (0: none);
        # in memory only: ``delete_ledger_if_idle`` compares it with a mark
        self.add_seq = 0

    def frozen_copy(self) -> Ledger:
        """The state and a shallow copy of the page dict (pages are shared)."""
        led = Ledger(self.ledger_id)
        for name in self.__slots__:
            setattr(led, name, getattr(self, name))
        led.pages = dict(self.pages)
        return led

    def state_tuple(self) -> list:
        key = None if self.master_key is None else self.master_key.hex()
        return [self.ledger_id, key, self.fenced, self.limbo, self.explicit_lac,
                self.last_entry, self.entries, self.data_bytes]

    @classmethod
    def from_state(cls, row: list) -> Ledger:
        led = cls(int(row[0]))
        led.master_key = None if row[1] is None else bytes.fromhex(row[1])
        led.fenced, led.limbo = bool(row[2]), bool(row[3])
        led.explicit_lac, led.last_entry = int(row[4]), int(row[5])
        led.entries, led.data_bytes = int(row[6]), int(row[7])
        return led


def _new_page(slots: int) -> np.ndarray:
    page = np.zeros((slots, 3), np.uint32)
    page[:, 2] = ABSENT
    return page


def _grown(page: np.ndarray | None, need_slots: int) -> np.ndarray:
    cap = MIN_PAGE_SLOTS if page is None else page.shape[0]
    while cap < need_slots:
        cap *= 2
    cap = min(cap, PAGE_SLOTS)
    if page is not None and cap == page.shape[0]:
        return page
    bigger = _new_page(cap)
    if page is not None:
        bigger[:page.shape[0]] = page
    return bigger


class Index:
    def __init__(self):
        self.ledgers: dict[int, Ledger] = {}
        self._frozen: Index | None = None  # the copy handed out by freeze(), until thaw()
        self._shared_pages: set[int] = set()  # ids of its pages: copied before a write

    def freeze(self) -> Index:
        """A read-only copy of the whole index as of now (see the module docstring)."""
        copy = Index()
        shared = set()
        for ledger_id, led in self.ledgers.items():
            frozen = copy.ledgers[ledger_id] = led.frozen_copy()
            shared.update(map(id, frozen.pages.values()))
        self._frozen, self._shared_pages = copy, shared  # the copy keeps the ids unique
        return copy

    def thaw(self) -> None:
        """The frozen copy is no longer read: pages are written in place again."""
        self._frozen, self._shared_pages = None, set()

    def _writable_page(self, led: Ledger, page_no: int, need_slots: int) -> np.ndarray:
        old = led.pages.get(page_no)
        page = _grown(old, need_slots)
        if page is old and self._shared_pages and id(old) in self._shared_pages:
            page = old.copy()
        led.pages[page_no] = page
        return page

    def ledger(self, ledger_id: int) -> Ledger:
        led = self.ledgers.get(ledger_id)
        if led is None:
            raise NoSuchLedgerError(f"ledger {ledger_id} is not on this bookie")
        return led

    def ensure(self, ledger_id: int) -> Ledger:
        led = self.ledgers.get(ledger_id)
        if led is None:
            led = self.ledgers[ledger_id] = Ledger(ledger_id)
        return led

    def drop(self, ledger_id: int) -> Ledger | None:
        return self.ledgers.pop(ledger_id, None)

    # -- writes ----------------------------------------------------------------
    def put_batch(self, ledgers: np.ndarray, entries: np.ndarray, log_id: int,
                  offsets: np.ndarray, lengths: np.ndarray) -> None:
        """Point each (ledger, entry) at (log_id, offset, length)."""
        if len(ledgers) <= SMALL_PUT_ENTRIES:
            ids = entries.tolist()
            first, n = ids[0], len(ids)
            if n > 1 and (first & PAGE_MASK) + n <= PAGE_SLOTS and ids[-1] == first + n - 1 \
                    and ids == list(range(first, first + n)):
                lids = ledgers.tolist()
                if lids.count(lids[0]) == n:
                    self._put_run(lids[0], first, log_id, offsets, lengths)
                    return
            for args in zip(ledgers.tolist(), ids, offsets.tolist(), lengths.tolist(),
                            strict=True):
                self._put_one(log_id, *args)
            return
        if ledgers[0] == ledgers[-1] and (len(ledgers) < 3 or ledgers.min() == ledgers.max()):
            self._put_ledger(int(ledgers[0]), entries, log_id, offsets, lengths)
            return
        lids = ledgers.tolist()
        if len(set(lids)) * SCALAR_LEDGER_ENTRIES > len(lids):
            # many ledgers with a few entries each (many ledgers written at
            # once): a numpy scatter per ledger would cost ~20 us each
            self._put_runs(lids, ledgers, entries, log_id, offsets, lengths)
            return
        order = np.argsort(ledgers, kind="stable")
        sl = ledgers[order]
        cuts = np.flatnonzero(sl[1:] != sl[:-1]) + 1
        for idx in np.split(order, cuts):
            self._put_ledger(int(ledgers[idx[0]]), entries[idx], log_id,
                             offsets[idx], lengths[idx])

    def _put_runs(self, lids: list, ledgers: np.ndarray, entries: np.ndarray, log_id: int,
                  offsets: np.ndarray, lengths: np.ndarray) -> None:
        """The many-ledgers put: each run of consecutive ids of one ledger
        within one page (what one writer's batch is) as slices, a shorter
        run entry by entry with scalars; runs in the batch's order, so a
        repeated id ends at its last location, as in every put."""
        ids, offs, lens = entries.tolist(), offsets.tolist(), lengths.tolist()
        cuts = np.flatnonzero((ledgers[1:] != ledgers[:-1]) | (entries[1:] != entries[:-1] + 1)
                              | ((entries[1:] & PAGE_MASK) == 0)) + 1
        lo = 0
        for hi in (*cuts.tolist(), len(ids)):
            if hi - lo >= RUN_PUT_ENTRIES_MIN:
                self._put_run(lids[lo], ids[lo], log_id, offs[lo:hi], lens[lo:hi])
            else:
                for k in range(lo, hi):
                    self._put_one(log_id, lids[k], ids[k], offs[k], lens[k])
            lo = hi

    def put_ledger_small(self, ledger_id: int, entry_ids: list, log_id: int,
                         offsets: list, lengths: list) -> None:
        """``put_batch`` of a few entries of one ledger given as plain lists
        (the small-add path): the same effect, without numpy conversions."""
        first, n = entry_ids[0], len(entry_ids)
        if n > 1 and (first & PAGE_MASK) + n <= PAGE_SLOTS and entry_ids[-1] == first + n - 1 \
                and entry_ids == list(range(first, first + n)):
            self._put_run(ledger_id, first, log_id, offsets, lengths)
            return
        for entry_id, offset, length in zip(entry_ids, offsets, lengths, strict=True):
            self._put_one(log_id, ledger_id, entry_id, offset, length)

    def _put_one(self, log_id: int, ledger_id: int, entry_id: int, offset: int,
                 length: int) -> None:
        """``put_batch`` of one entry with scalars: the same effect (a batch
        that repeats an id ends with its last location, counted once)."""
        led = self.ensure(ledger_id)
        page_no, slot = entry_id >> PAGE_BITS, entry_id & PAGE_MASK
        page = led.pages.get(page_no)
        if page is None or slot >= len(page) or (self._shared_pages
                                                 and id(page) in self._shared_pages):
            page = self._writable_page(led, page_no, slot + 1)
        row = page[slot]
        old_length = int(row[2])
        if old_length == ABSENT:
            led.entries += 1
        else:
            led.data_bytes -= old_length
        row[0], row[1], row[2] = log_id, offset, length
        led.data_bytes += length
        if entry_id > led.last_entry:
            led.last_entry = entry_id

    def _put_run(self, ledger_id: int, first: int, log_id: int, offsets, lengths) -> None:
        """A few consecutive ids of one ledger within one page (the usual small
        batch): slice assignments instead of one scalar put per entry."""
        led = self.ensure(ledger_id)
        lo = first & PAGE_MASK
        hi = lo + len(offsets)
        page = self._writable_page(led, first >> PAGE_BITS, hi)
        old = page[lo:hi, 2].tolist()
        new_count = old.count(ABSENT)
        led.entries += new_count
        if new_count != len(old):
            led.data_bytes -= sum(x for x in old if x != ABSENT)
        page[lo:hi, 0] = log_id
        page[lo:hi, 1] = offsets
        page[lo:hi, 2] = lengths
        led.data_bytes += sum(lengths) if isinstance(lengths, list) else \
            int(np.add.reduce(lengths))
        if first + len(old) - 1 > led.last_entry:
            led.last_entry = first + len(old) - 1

    def _put_ledger(self, ledger_id, entries, log_id, offsets, lengths) -> None:
        led = self.ensure(ledger_id)
        page_nos = entries >> PAGE_BITS
        first, last = int(page_nos[0]), int(page_nos[-1])
        if first == last and (len(entries) < 3 or page_nos.min() == page_nos.max()):
            self._put_page(led, first, entries & PAGE_MASK, log_id, offsets, lengths)
        else:
            for page_no in np.unique(page_nos):
                sel = page_nos == page_no
                self._put_page(led, int(page_no), entries[sel] & PAGE_MASK, log_id,
                               offsets[sel], lengths[sel])
        led.last_entry = max(led.last_entry, int(entries.max()))

    def _put_page(self, led: Ledger, page_no: int, slots, log_id, offsets, lengths) -> None:
        slots = slots.astype(np.intp)
        page = self._writable_page(led, page_no, int(slots.max()) + 1)
        if len(slots) > 1 and not bool(np.all(slots[1:] > slots[:-1])):
            uniq = np.unique(slots)
        else:
            uniq = slots
        old_lengths = page[uniq, 2]
        present = old_lengths != ABSENT
        led.entries += len(uniq) - int(present.sum())
        led.data_bytes -= int(old_lengths[present].sum(dtype=np.int64))
        page[slots, 0] = log_id
        page[slots, 1] = offsets
        page[slots, 2] = lengths
        led.data_bytes += int(page[uniq, 2].sum(dtype=np.int64))

    # -- reads -----------------------------------------------------------------
    def locate(self, ledger_id: int, entry_id: int) -> tuple[int, int, int]:
        """(log id, offset, length), or NoSuchLedgerError / NoSuchEntryError."""
        led = self.ledger(ledger_id)
        page = led.pages.get(entry_id >> PAGE_BITS) if entry_id >= 0 else None
        slot = entry_id & PAGE_MASK
        if page is None or slot >= page.shape[0]:
            raise NoSuchEntryError(f"ledger {ledger_id} has no entry {entry_id} here")
        log_id, offset, length = page[slot].tolist()
        if length == ABSENT:
            raise NoSuchEntryError(f"ledger {ledger_id} has no entry {entry_id} here")
        return log_id, offset, length

    def locate_range(self, ledger_id: int, first: int, last: int) -> np.ndarray:
        """Rows (log, offset, length) for entries first..last; NoSuchEntry on a gap."""
        led = self.ledger(ledger_id)
        rows = np.zeros((last - first + 1, 3), np.uint32)
        rows[:, 2] = ABSENT
        pos = 0
        for page_no in range(first >> PAGE_BITS, (last >> PAGE_BITS) + 1):
            lo = max(first, page_no << PAGE_BITS) & PAGE_MASK
            hi = min(last, (page_no << PAGE_BITS) | PAGE_MASK) & PAGE_MASK
            page = led.pages.get(page_no)
            if page is not None:
                top = min(hi, page.shape[0] - 1)
                if top >= lo:
                    rows[pos:pos + top - lo + 1] = page[lo:top + 1]
            pos += hi - lo + 1
        gaps = np.flatnonzero(rows[:, 2] == ABSENT)
        if len(gaps):
            raise NoSuchEntryError(f"ledger {ledger_id} has no entry {first + int(gaps[0])} here")
        return rows

    def present_count(self, ledger_id: int, runs) -> int:
        """How many entries of ``runs`` (``(first, last)`` inclusive) the
        index holds for the ledger (0 when it is unknown): slices of the
        pages, no entry log read."""
        led = self.ledgers.get(ledger_id)
        if led is None:
            return 0
        count = 0
        for first, last in runs:
            for page_no in range(first >> PAGE_BITS, (last >> PAGE_BITS) + 1):
                page = led.pages.get(page_no)
                if page is None:
                    continue
                lo = max(first, page_no << PAGE_BITS) & PAGE_MASK
                hi = min(min(last, (page_no << PAGE_BITS) | PAGE_MASK) & PAGE_MASK,
                         page.shape[0] - 1)
                if hi >= lo:
                    count += int(np.count_nonzero(page[lo:hi + 1, 2] != ABSENT))
        return count

    # -- whole-index scans (compaction, disk accounting) --------------------------
    def slot_chunks(self, slots_max: int = 1 << 18, rows_only: bool = False):
        """Every stored entry as arrays ``(ledgers, entries, rows)`` (rows: log,
        offset, length), a chunk of pages at a time (about ``slots_max``
        slots), so a scan costs a few numpy calls per chunk and bounded
        temporary memory (about 100 bytes per slot of a chunk: ~25 MB).
        ``rows_only``: ledgers and entries are None.  The caller holds the
        storage lock."""
        ledgers, page_nos, pages, held = [], [], [], 0
        for ledger_id, led in self.ledgers.items():
            for page_no, page in led.pages.items():
                ledgers.append(ledger_id)
                page_nos.append(page_no)
                pages.append(page)
                held += page.shape[0]
                if held >= slots_max:
                    yield _chunk_arrays(ledgers, page_nos, pages, rows_only)
                    ledgers, page_nos, pages, held = [], [], [], 0
        if pages:
            yield _chunk_arrays(ledgers, page_nos, pages, rows_only)

    def live_bytes_by_log(self, record_overhead: int) -> dict[int, int]:
        """Bytes of every entry the index points at, per entry log (each
        entry's data plus ``record_overhead``): what compaction would keep."""
        out: dict[int, int] = {}
        for _ledgers, _entries, rows in self.slot_chunks(rows_only=True):
            logs = rows[:, 0].astype(np.int64)
            sizes = rows[:, 2].astype(np.int64) + record_overhead
            uniq, inverse = np.unique(logs, return_inverse=True)
            sums = np.bincount(inverse, weights=sizes)
            for log_id, nbytes in zip(uniq.tolist(), sums.tolist(), strict=True):
                out[log_id] = out.get(log_id, 0) + int(nbytes)
        return out

    def still_at(self, ledger_id: int, entries: np.ndarray, log_id: int,
                 offsets: np.ndarray) -> np.ndarray:
        """Which of a ledger's ``entries`` the index still points at
        (``log_id``, each one's offset): False where the entry was re-added
        elsewhere or its ledger deleted since."""
        led = self.ledgers.get(ledger_id)
        ok = np.zeros(len(entries), bool)
        if led is None:
            return ok
        page_nos = entries >> PAGE_BITS
        for page_no in np.unique(page_nos).tolist():
            page = led.pages.get(page_no)
            if page is None:
                continue
            sel = np.flatnonzero(page_nos == page_no)
            slots = entries[sel] & PAGE_MASK
            inside = slots < page.shape[0]
            sel, slots = sel[inside], slots[inside]
            rows = page[slots]
            ok[sel] = ((rows[:, 0] == log_id) & (rows[:, 1] == offsets[sel])
                       & (rows[:, 2] != ABSENT))
        return ok

    # -- accounting ------------------------------------------------------------
    def entry_count(self) -> int:
        return sum(led.entries for led in self.ledgers.values())

    def data_bytes(self) -> int:
        return sum(led.data_bytes for led in self.ledgers.values())

    def index_bytes(self) -> int:
        """Bytes held by entry pages plus the per-ledger object estimate."""
        pages = sum(p.nbytes for led in self.ledgers.values() for p in led.pages.values())
        return pages + LEDGER_OBJECT_BYTES * len(self.ledgers)


def _chunk_arrays(ledgers: list, page_nos: list, pages: list, rows_only: bool = False):
    """``slot_chunks``' arrays for a list of pages: only occupied slots."""
    rows = np.concatenate(pages) if len(pages) > 1 else pages[0]
    if rows_only:
        return None, None, rows[rows[:, 2] != ABSENT]
    sizes = np.fromiter((p.shape[0] for p in pages), np.int64, len(pages))
    starts = np.repeat(np.cumsum(sizes) - sizes, sizes)
    entries = np.repeat(np.asarray(page_nos, np.int64) << PAGE_BITS, sizes) \
        + (np.arange(int(sizes.sum()), dtype=np.int64) - starts)
    led_col = np.repeat(np.asarray(ledgers, np.int64), sizes)
    present = rows[:, 2] != ABSENT
    return led_col[present], entries[present], rows[present]
