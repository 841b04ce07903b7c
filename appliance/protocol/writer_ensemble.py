"""The writer's ensemble change: a bookie that errs, disconnects or stays
silent past its retries is replaced by a new fragment.

Guarantees: the new fragment starts at ``LAC + 1`` (never before the last
fragment: ``fragments``, checked in place) and is written to metadata by CAS
(``writer_metadata``) before any entry is sent to the replacement, chosen
host-aware (``placement``).  Acks the failed bookie gave to unacknowledged
entries are forgotten at once (it is not in their new write set).  With the
change written, every pending entry goes to the replacements, entries held
during the change go to everyone, and the LAC moves over what the surviving
bookies acknowledged meanwhile.  ``ensemble_changes_max`` changes in a row
without the LAC moving stop the writer with ``NotEnoughBookiesError``; so
does no spare bookie, unless the failed ones may lag (``writer_heal``:
the delayed ensemble change, retried when a spare appears).

State owned here: ``_failed`` (positions awaiting replacement),
``_changes_in_a_row`` (reset when the LAC moves), ``ensemble_changes``; on
success it also moves the write sets ``_ws`` and resets the replaced
positions' send and retry state.
"""

from __future__ import annotations

from appliance.protocol.core import CoreBase
from appliance.protocol.errors import NotEnoughBookiesError
from appliance.protocol.invariant import invariant
from appliance.protocol.quorum import WriteSets
from appliance.protocol.writer_metadata import MetadataOp
from appliance.protocol.writer_states import FAILED, OPEN_STATE


class WriterEnsemble(CoreBase):
    """The ensemble-change part of ``LedgerWriter`` (see the module docstring)."""

    def _bookie_failed(self, pos: int, now_ms: int) -> None:
        if self._state != OPEN_STATE or pos in self._failed or pos in self._lagging:
            return
        self._trail_to_short(pos)  # what it has not acknowledged is short on it
        self._failed.add(pos)
        bit = 1 << pos
        acks_map = self._acks
        for entry_id, acks in acks_map.items():  # rare: only on a failure
            if acks & bit:
                acks_map[entry_id] = acks & ~bit
        if self._op is None:
            self._start_ensemble_change()

    def _start_ensemble_change(self, tries: int = 0) -> None:
        if self._changes_in_a_row >= self.config.ensemble_changes_max:
            self._stop(FAILED, NotEnoughBookiesError.code)
            return
        taken = set(self._ws.ensemble)
        spares = [b for b in self.available_bookies if b not in taken]
        replaced = sorted(self._failed | self._lagging)
        ensemble = self.replace_bookies(self._ws.ensemble, self._qw, replaced, spares)
        if ensemble is None:
            if not self._lag():  # no spare: go on at the ack quorum (writer_heal)
                self._stop(FAILED, NotEnoughBookiesError.code)
            return
        self._failed |= self._lagging  # lagging positions are replaced now
        self._lagging, self._lag_mask = set(), 0
        start = self.last_add_confirmed + 1
        invariant(start >= self._md.last_fragment[0], "ledger %d: writer would start a "
                  "fragment at %d, before the last one at %d", self.ledger_id, start,
                  self._md.last_fragment[0], rule="fragments")
        new_md = self._md.with_fragment(start, ensemble)
        self._changes_in_a_row += 1
        self.ensemble_changes += 1
        self._write_metadata("ensemble", new_md, frozenset(replaced), tries)

    def _apply_ensemble_change(self, op: MetadataOp, version: int, now_ms: int) -> None:
        start = op.metadata.last_fragment[0]
        invariant(not self._change_holds_acks or start == self.last_add_confirmed + 1,
                  "ledger %d: the LAC moved to %d while the change to a fragment at %d was "
                  "in flight", self.ledger_id, self.last_add_confirmed, start)
        self._md, self._version = op.metadata, version
        self._ws = WriteSets(op.metadata.last_fragment[1], self._qw)
        self._failed -= op.replaced
        for pos in op.replaced:
            self._outstanding[pos] = []
            self._cursor[pos] = 0
            self._retries[pos], self._resent_ms[pos] = 0, -1
        held_set = self._held
        sent = [e for e in self._data if e not in held_set]
        held = [e for e in self._data if e in held_set]
        self._send(sent, self._records(sent), op.replaced, now_ms)
        self._held = set()
        self._send(held, self._records(held), None, now_ms)
        if self._state == OPEN_STATE:  # acks the surviving bookies gave meanwhile
            self._advance(now_ms)
        self._arm_tick()
        if self._close_requested:
            self._close_after_heal(now_ms)
        elif self._failed:
            self._start_ensemble_change()
