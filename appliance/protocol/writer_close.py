"""The end of a writer: ``close()`` and its outcome, and the stops (fenced,
failed).

Guarantees: ``close()`` freezes the LAC and, once no ensemble change is in
flight and entries short on a lagging bookie healed (``writer_heal``, at
most ``heal_close_wait_ms``), CASes the ledger to CLOSED at it (``writer_metadata``); one
``CloseDone`` reports the outcome (a CAS conflict: IN_RECOVERY ->
``LedgerFencedError``; CLOSED at the same entry -> success; CLOSED
elsewhere -> ``MetadataVersionError``).  A close reported done is the
metadata's end at the LAC (``one-close``, checked in place).  Adds still
pending fail with ``LedgerClosedError`` ("may or may not be stored").  A
close that succeeded then emits one ``SendWriteClose`` per bookie of the
current ensemble (BP-32, advisory: after ``CloseDone``, and no reply is
awaited).  A stop fails every pending add with its code, and later adds
fail at once with it.

State owned here: ``_state``, ``error_code``, ``_close_requested``,
``stopped_with`` (the code of the first stop, OK if none).
"""

from __future__ import annotations

from appliance.protocol import events as ev
from appliance.protocol.core import CoreBase
from appliance.protocol.errors import OK, LedgerClosedError
from appliance.protocol.invariant import invariant
from appliance.protocol.metadata import CLOSED
from appliance.protocol.writer_states import CLOSED_STATE, CLOSING, FAILED, FENCED


class WriterClose(CoreBase):
    """The close and stop part of ``LedgerWriter`` (see the module docstring)."""

    def close(self, now_ms: int) -> list:
        """Close at the LAC; one ``CloseDone`` reports the outcome.  Calling it
        again while that close is in flight adds nothing; after it, it
        reports the same outcome again."""
        if self._state == CLOSED_STATE:
            self._out.append(ev.CloseDone(self.ledger_id, OK, self.last_add_confirmed))
        elif self._state == FENCED:
            self._out.append(ev.CloseDone(self.ledger_id, self.error_code,
                                          self.last_add_confirmed))
        elif not self._close_requested:
            self._close_requested = True
            self._state = CLOSING  # the LAC is frozen from here on
            if self._op is None:
                self._close_after_heal(now_ms)  # at once, or once short entries healed
        return self._take()

    def _start_close(self, tries: int = 0) -> None:
        new_md = self._md.to_closed(self.last_add_confirmed, self.length)
        self._write_metadata("close", new_md, frozenset(), tries)

    def _closed_by_us(self, code: int) -> None:
        if code == OK:
            md = self._md
            invariant(md.state == CLOSED and md.last_entry_id == self.last_add_confirmed,
                      "ledger %d: writer reports a close at its LAC %d; the metadata is %s "
                      "at %d", self.ledger_id, self.last_add_confirmed, md.state,
                      md.last_entry_id, rule="one-close")
        self._fail_pending(LedgerClosedError.code)
        self._state = CLOSED_STATE if code == OK else FENCED
        self.error_code = LedgerClosedError.code if code == OK else code
        self._out.append(ev.CloseDone(self.ledger_id, code, self.last_add_confirmed))
        if code == OK:  # BP-32: advisory, after the close is done; nothing waits for it
            for bookie in self._ws.ensemble:
                self._out.append(ev.SendWriteClose(self._next_id(), bookie, self.ledger_id,
                                                   self._key))

    def _fail_pending(self, code: int) -> None:
        first = self.last_add_confirmed + 1
        if self.last_add_pushed >= first:
            self._out.append(ev.FailAdds(self.ledger_id, first, self.last_add_pushed, code))
        self._data.clear()
        self._acks.clear()
        self._held.clear()
        self._forget_short()
        for outstanding in self._outstanding:
            outstanding.clear()
        self._cursor = [0] * self._size

    def _stop(self, state: str, code: int) -> None:
        """Fail every pending add; later adds fail at once with ``code``."""
        if self._state in (CLOSED_STATE, FENCED) or (self._state == FAILED and state == FAILED):
            return
        self._fail_pending(code)
        self._state, self.error_code = state, code
        if self.stopped_with == OK:
            self.stopped_with = code  # kept through a later close (stats, the simulation)
        if self._close_requested and self._op is None:
            self._out.append(ev.CloseDone(self.ledger_id, code, self.last_add_confirmed))
