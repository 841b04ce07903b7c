"""Reads of LedgerStorage: one entry, a run of entries, a packed run.

Guarantees: a read returns exactly the bytes added, or raises
``NoSuchLedgerError``, ``NoSuchEntryError`` or ``CorruptRecordError`` (a
record header or checksum check failed): never other bytes.  Every record
is verified after the read (``codec.verify_record`` for one entry,
``storage.read_path`` for runs).  An entry is readable as soon as it was
added, before its ticket is durable: readers only ask up to the LAC.

Reads take the storage lock for the index lookup and the ``pread``s, and
count into ``counters["reads"]``; a closed storage raises
``ClientClosedError``.
"""

from __future__ import annotations

import numpy as np

from appliance.protocol import limits

from .codec import RECORD_HEADER_BYTES, verify_record
from .read_path import fit_bytes, read_parts, read_rows


class ReadOps:
    """Mixin of LedgerStorage over ``self._index``, ``self._logs``, ``self._lock``."""

    def read_entry(self, ledger_id: int, entry_id: int) -> bytes:
        """The exact bytes added.  An entry is readable as soon as it was added,
        before its ticket is durable (readers only ask up to the LAC)."""
        with self._lock:
            self._check_open()
            log_id, offset, length = self._index.locate(ledger_id, entry_id)
            raw = self._logs.read_record(log_id, offset, RECORD_HEADER_BYTES + length)
            self.counters["reads"] += 1
            return bytes(verify_record(raw, ledger_id, entry_id, length,
                                       f"entry log {log_id} offset {offset}"))

    def read_entries(self, ledger_id: int, first: int, last: int) -> list[bytes]:
        """Entries first..last (at most ``limits.STORAGE_READ_RUN_ENTRIES_MAX``);
        raises on the first missing one."""
        if first < 0 or last < first or last - first >= limits.STORAGE_READ_RUN_ENTRIES_MAX:
            raise ValueError(f"read_entries range {first}..{last} is empty, negative or "
                             f"longer than {limits.STORAGE_READ_RUN_ENTRIES_MAX}")
        with self._lock:
            self._check_open()
            rows = self._index.locate_range(ledger_id, first, last)
            self.counters["reads"] += len(rows)
            return read_rows(self._logs, ledger_id, first, rows)

    def read_entries_packed(self, ledger_id: int, first: int, last: int,
                            bytes_max: int) -> tuple[list, np.ndarray]:
        """The leading entries of first..last whose data adds up to at most
        ``bytes_max`` (maybe none), each verified, not copied: buffers whose
        concatenation is their data in order, and each entry's length."""
        if first < 0 or last < first or last - first >= limits.STORAGE_READ_RUN_ENTRIES_MAX:
            raise ValueError(f"read_entries_packed range {first}..{last} is empty, negative "
                             f"or longer than {limits.STORAGE_READ_RUN_ENTRIES_MAX}")
        with self._lock:
            self._check_open()
            rows = self._index.locate_range(ledger_id, first, last)
            rows = rows[:fit_bytes(rows, bytes_max)]
            self.counters["reads"] += len(rows)
            parts = read_parts(self._logs, ledger_id, first, rows) if len(rows) else []
            return parts, rows[:, 2].astype(np.int64)

