"""Per-ledger state operations of LedgerStorage: master key, fence, limbo,
explicit LAC, delete, and the queries over them.

Each change is journaled (one record, its own seq) before it is visible in
memory, whatever ``journal_write_data`` says; the returned ticket is durable
once that record is.  A request that changes nothing (fencing a fenced
ledger) journals nothing and returns the ticket of the ledger's last state
change, which may still be in flight: waiting on it is always correct.
Recovery re-applies the same records through ``_apply_state_record``.
"""

from __future__ import annotations

import struct

from appliance.protocol import limits
from appliance.protocol.errors import UnauthorizedError

from . import journal_scan as js

LEDGER = struct.Struct("<Q")
LEDGER_LAC = struct.Struct("<Qq")


class StateOps:
    """Mixin over ``self._index``, ``self._journal``, ``self._lock``, ``self._seq``."""

    def _journal_state(self, rtype: int, body: bytes) -> int:
        self._check_usable()
        self._seq += 1
        self._journal.submit(self._seq, rtype, body)
        self._journal_seq = self._seq
        return self._seq

    # -- master key -----------------------------------------------------------
    def set_master_key(self, ledger_id: int, key: bytes) -> int:
        """Set the ledger's master key (creating its state); keys never change:
        another key than the stored one raises ``UnauthorizedError``."""
        key = bytes(key)
        if len(key) > limits.STORAGE_MASTER_KEY_BYTES_MAX:
            raise ValueError(f"master key of {len(key)} bytes exceeds "
                             f"{limits.STORAGE_MASTER_KEY_BYTES_MAX}")
        with self._lock:
            led = self._index.ensure(ledger_id)
            if led.master_key is not None:
                if led.master_key != key:
                    raise UnauthorizedError(f"ledger {ledger_id}: master key mismatch")
                return led.state_seq
            led.state_seq = self._journal_state(js.MASTER_KEY, LEDGER.pack(ledger_id) + key)
            led.master_key = key
            return led.state_seq

    def get_master_key(self, ledger_id: int) -> bytes | None:
        with self._lock:
            led = self._index.ledgers.get(ledger_id)
            return None if led is None else led.master_key

    def check_master_key(self, ledger_id: int, key: bytes) -> None:
        """``UnauthorizedError`` unless the ledger's key is unset or equal."""
        stored = self.get_master_key(ledger_id)
        if stored is not None and stored != bytes(key):
            raise UnauthorizedError(f"ledger {ledger_id}: master key mismatch")

    # -- fence / limbo ----------------------------------------------------------
    def fence(self, ledger_id: int) -> int:
        with self._lock:
            led = self._index.ensure(ledger_id)
            if not led.fenced:
                led.state_seq = self._journal_state(js.FENCE, LEDGER.pack(ledger_id))
                led.fenced = True
            return led.state_seq

    def is_fenced(self, ledger_id: int) -> bool:
        with self._lock:
            led = self._index.ledgers.get(ledger_id)
            return bool(led and led.fenced)

    def admission(self, ledger_id: int) -> tuple[bool, bytes | None, bool]:
        """(known, master key, fenced) of the ledger, read under one lock: what
        an add is admitted by (one lookup per ledger group of a message
        instead of three: many ledgers written at once send groups of one
        or two entries each)."""
        with self._lock:
            led = self._index.ledgers.get(ledger_id)
            return (False, None, False) if led is None else (True, led.master_key,
                                                             bool(led.fenced))

    def mark_limbo(self, ledger_id: int) -> int:
        with self._lock:
            led = self._index.ensure(ledger_id)
            if not led.limbo:
                led.state_seq = self._journal_state(js.LIMBO_SET, LEDGER.pack(ledger_id))
                led.limbo = True
            return led.state_seq

    def clear_limbo(self, ledger_id: int) -> int:
        with self._lock:
            led = self._index.ensure(ledger_id)
            if led.limbo:
                led.state_seq = self._journal_state(js.LIMBO_CLEAR, LEDGER.pack(ledger_id))
                led.limbo = False
            return led.state_seq

    def is_limbo(self, ledger_id: int) -> bool:
        with self._lock:
            led = self._index.ledgers.get(ledger_id)
            return bool(led and led.limbo)

    # -- explicit LAC -------------------------------------------------------------
    def set_explicit_lac(self, ledger_id: int, lac: int) -> None:
        """Record an explicit LAC (it only moves forward); journaled, not awaited."""
        if lac < -1:
            raise ValueError(f"lac must be >= -1, got {lac}")
        with self._lock:
            led = self._index.ensure(ledger_id)
            if lac > led.explicit_lac:
                led.state_seq = self._journal_state(js.EXPLICIT_LAC,
                                                    LEDGER_LAC.pack(ledger_id, lac))
                led.explicit_lac = lac

    def get_explicit_lac(self, ledger_id: int) -> int:
        with self._lock:
            return self._index.ledger(ledger_id).explicit_lac

    # -- existence / delete -------------------------------------------------------
    def delete_ledger(self, ledger_id: int) -> int:
        """Forget a ledger (journaled); idempotent.  Its bytes stay in the entry
        logs until garbage collection (``ledger_bytes`` says where).  Returns
        the ticket after which the delete survives a crash (0: nothing to do)."""
        with self._lock:
            if ledger_id not in self._index.ledgers:
                return 0
            ticket = self._journal_state(js.DELETE, LEDGER.pack(ledger_id))
            self._index.drop(ledger_id)
            return ticket

    def activity_mark(self) -> int:
        """A mark to pass to ``delete_ledger_if_idle`` later: every add or
        state change made after this call carries a higher seq."""
        with self._lock:
            return self._seq

    def delete_ledger_if_idle(self, ledger_id: int, since: int) -> int | None:
        """Delete a ledger only if nothing happened to it after ``since`` (an
        ``activity_mark``): no add (recovery adds included), no fence, key or
        limbo change, and it is not in limbo.  Checked and done under the
        storage lock, so no add can slip between the check and the delete.
        Returns the delete's ticket (durable once it is), or None if refused.

        A fenced ledger keeps its fence (an empty, fenced ledger: journaled
        after the delete): a writer that recovery fenced must stay fenced
        here, whatever the metadata says about this bookie now."""
        with self._lock:
            led = self._index.ledgers.get(ledger_id)
            if led is None or led.limbo or max(led.add_seq, led.state_seq) > since:
                return None
            ticket = self._journal_state(js.DELETE, LEDGER.pack(ledger_id))
            self._index.drop(ledger_id)
            if led.fenced:
                husk = self._index.ensure(ledger_id)
                husk.state_seq = ticket = self._journal_state(js.FENCE, LEDGER.pack(ledger_id))
                husk.fenced = True
            return ticket

    def ledger_entry_count(self, ledger_id: int) -> int:
        """Entries stored for the ledger (0 when it is unknown or holds only state)."""
        with self._lock:
            led = self._index.ledgers.get(ledger_id)
            return 0 if led is None else led.entries

    def present_count(self, ledger_id: int, runs) -> int:
        """Entries of ``runs`` (``(first, last)`` inclusive) the index holds
        for the ledger: an index lookup, nothing read from the entry logs."""
        with self._lock:
            return self._index.present_count(ledger_id, runs)

    def last_entry_id(self, ledger_id: int) -> int:
        with self._lock:
            return self._index.ledger(ledger_id).last_entry

    def ledger_exists(self, ledger_id: int) -> bool:
        with self._lock:
            return ledger_id in self._index.ledgers

    def ledgers(self) -> list[int]:
        with self._lock:
            return sorted(self._index.ledgers)

    def ledger_bytes(self) -> dict[int, dict[int, int]]:
        """Per entry log, bytes held per ledger (deleted ledgers included): GC input."""
        with self._lock:
            return {log: dict(per) for log, per in self._logs.ledger_bytes.items()}

    # -- BP-32: write close and per-ledger log rotation ----------------------------
    def write_close(self, ledger_id: int) -> bool:
        """The ledger's writer is done (advisory WRITE_CLOSE, a fencing read, a
        failed write): with ``entry_log_per_ledger`` its log is rotated now
        (buffer handed to the writer, synced by the next checkpoint; every
        checkpoint rotates all logs anyway, so by then it is rotated in any
        case).  Interleaved mode: counted, nothing to rotate.  Not journaled
        (advisory: losing it in a crash changes nothing).  True if rotated."""
        with self._lock:
            self._check_usable()
            self.counters["write_closes"] += 1
            if not self.options.entry_log_per_ledger:
                return False
            try:
                return self._logs.write_close(ledger_id)
            except BaseException as exc:  # a failed write: storage stops taking writes
                self._failure = exc
                raise

    def active_entry_log(self, ledger_id: int) -> int | None:
        """The log the ledger's next add would go to if it is open now
        (per-ledger mode: None once rotated; interleaved: the shared log)."""
        with self._lock:
            if self.options.entry_log_per_ledger:
                return self._logs.active_log(ledger_id)
            return self._logs.log_id

    def expire_idle_logs(self) -> int:
        """Per-ledger mode: rotate logs idle for ``entry_log_idle_ms``."""
        with self._lock:
            if not self.options.entry_log_per_ledger or self._closed or self._closing \
                    or self._failure is not None:
                return 0
            try:
                return self._logs.expire_idle()
            except BaseException as exc:
                self._failure = exc
                raise

    # -- replay -------------------------------------------------------------------
    def _apply_state_record(self, rtype: int, seq: int, body: bytes) -> None:
        if rtype == js.DELETE:
            self._index.drop(LEDGER.unpack_from(body)[0])
            return
        if rtype == js.EXPLICIT_LAC:
            ledger_id, lac = LEDGER_LAC.unpack(body)
            led = self._index.ensure(ledger_id)
            led.explicit_lac = max(led.explicit_lac, lac)
        else:
            led = self._index.ensure(LEDGER.unpack_from(body)[0])
            if rtype == js.FENCE:
                led.fenced = True
            elif rtype == js.MASTER_KEY:
                led.master_key = body[LEDGER.size:]
            elif rtype == js.LIMBO_SET:
                led.limbo = True
            elif rtype == js.LIMBO_CLEAR:
                led.limbo = False
        led.state_seq = seq
