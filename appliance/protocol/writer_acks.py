"""The writer's acknowledgements: add replies counted per entry, and the LAC
advanced over the prefix that has its ack quorum (``CompleteAdds``).

Guarantees: an entry is acknowledged only once ``Qa`` bookies of its write
set *in the fragment that holds it* have acknowledged it, only after every
lower entry, and only while the writer is open and (with the
``change-holds-acks`` protection, always on outside the simulation) no
ensemble change is in flight; the checks are in place (``_advance``'s one-line guard, then
``_check_acknowledged``: docs/PROTOCOL_CORE.md, "In-core invariants").  A
refusal from a bookie of the entry's write set stops the writer (fenced,
unauthorised) or has the bookie replaced (``writer_ensemble``).

Faults survived: lost, duplicated, reordered and late replies (acks are a
bit set per entry; replies from bookies outside an entry's current write set
are ignored, as are acks for an entry already acknowledged or not yet sent).

Cost: O(1) per ack, O(1) per acknowledged entry.  This is the per-add path:
it reads the state ``LedgerWriter.__init__`` sets up (``_acks``, ``_data``,
``_held``, ``_failed``, the write sets) through locals.  State owned here
(nothing else moves it): ``last_add_confirmed``, ``length``,
``_lac_moved_ms``.
"""

from __future__ import annotations

from appliance.protocol import events as ev
from appliance.protocol.core import CoreBase
from appliance.protocol.errors import OK, BKTimeoutError, LedgerFencedError, UnauthorizedError
from appliance.protocol.invariant import invariant
from appliance.protocol.quorum import in_write_set
from appliance.protocol.writer_states import CLOSING, FAILED, FENCED, OPEN_STATE


class WriterAcks(CoreBase):
    """The acknowledgement part of ``LedgerWriter`` (see the module docstring)."""

    def _on_add_response(self, event: ev.AddResponse) -> None:
        if self._short:  # rare: a bookie lagged; its answers for short entries heal them
            short = self._short.get(event.bookie_id)
            if short is not None and event.entry_id in short:
                self._heal_reply(event.bookie_id, (event.entry_id,), (event.code,),
                                 event.now_ms)
                return
        acks = self._acks.get(event.entry_id)
        pos = self._ws.index.get(event.bookie_id)
        code = event.code
        if acks is None and code == OK and pos is not None and self._trail \
                and (self._state == OPEN_STATE or self._state == CLOSING):
            # the slow copy of an entry acknowledged already (also before
            # close() began): it ends that entry's trail (one outside the
            # entry's write set is stale there), and a close waits for
            # nothing more
            self._trail_acks(1 << pos, (event.entry_id,), event.now_ms)
            return
        if (self._state != OPEN_STATE or pos is None
                or not in_write_set(pos, event.entry_id, self._size, self._qw)):
            self._stale()
            return
        if acks is None or event.entry_id in self._held:
            if acks is None and code != OK and event.entry_id <= self.last_add_confirmed \
                    and self._late_refusal:
                # The ack quorum confirmed the entry before this bookie
                # refused it (read-only, I/O error, ...): the entry is a copy
                # short and every later one would be too, so the refusal
                # counts as it would have a moment earlier (as BookKeeper
                # changes the ensemble on any failed write).
                self._refused(pos, code, event.now_ms)
            else:  # acknowledged already (a late ack), or never sent
                self._stale()
            return
        if code == OK:
            bit = 1 << pos
            if pos in self._failed or pos in self._lagging or acks & bit:
                return
            acks |= bit
            self._acks[event.entry_id] = acks
            if acks.bit_count() >= self._qa and event.entry_id == self.last_add_confirmed + 1:
                self._advance(event.now_ms)
        else:
            self._refused(pos, code, event.now_ms)

    def _refused(self, pos: int, code: int, now_ms: int) -> None:
        """The bookie at ``pos`` answered an add of its write set with ``code``."""
        if code == LedgerFencedError.code:
            self._stop(FENCED, LedgerFencedError.code)
        elif code == UnauthorizedError.code:
            self._stop(FAILED, UnauthorizedError.code)
        elif code != BKTimeoutError.code:  # no answer is not an error: the tick retries
            self._bookie_failed(pos, now_ms)

    def _on_add_responses(self, event: ev.AddResponses) -> None:
        self.add_rows(event.request_id, event.bookie_id, event.ledger_id, event.entry_ids,
                      event.codes, event.now_ms)

    def add_rows(self, request_id: int, bookie_id: str, ledger_id: int, entry_ids, codes,
                 now_ms: int) -> None:
        """The batch path (an ``AddResponses``, or a part of a multi-ledger
        reply applied by ``writer_multi`` without an event object): the
        checks that hold for the whole batch once, then a tight loop;
        anything but OK falls back to the one-reply path.  ``codes[i]``
        answers ``entry_ids[i]`` (the caller matched them)."""
        if self._short and bookie_id in self._short and self._heal_reply(
                bookie_id, entry_ids, codes, now_ms):
            return  # every entry was a short one (writer_heal)
        pos = self._ws.index.get(bookie_id)
        if self._state != OPEN_STATE or pos is None or pos in self._failed \
                or pos in self._lagging:
            for entry_id, code in zip(entry_ids, codes, strict=True):
                self._on_add_response(ev.AddResponse(request_id, bookie_id, ledger_id,
                                                     entry_id, code, now_ms))
            return
        if entry_ids and max(entry_ids) <= self.last_add_confirmed and \
                codes.count(OK) == len(codes) == len(entry_ids):
            # the usual last reply of a write quorum wider than the ack quorum:
            # every entry acknowledged already, each a trailing one (writer_heal)
            self._trail_acks(1 << pos, entry_ids, now_ms)
            return
        bit, size, qw, qa = 1 << pos, self._size, self._qw, self._qa
        acks_map, held, advance = self._acks, self._held, False
        next_id = self.last_add_confirmed + 1
        for entry_id, code in zip(entry_ids, codes, strict=True):
            if code != OK:
                self._on_add_response(ev.AddResponse(request_id, bookie_id, ledger_id,
                                                     entry_id, code, now_ms))
                if self._state != OPEN_STATE or pos in self._failed:
                    break  # this bookie's remaining acks no longer count
                continue
            acks = acks_map.get(entry_id)
            if acks is None or (held and entry_id in held):  # acknowledged already (the
                if acks is None:  # late ack of a quorum: trailing), or never sent: as
                    self._trail_acks(bit, (entry_id,), now_ms)  # _on_add_response
                else:
                    self.stale_replies += 1
                continue
            if acks & bit or (pos - entry_id) % size >= qw:
                continue
            acks |= bit
            acks_map[entry_id] = acks
            if entry_id == next_id and acks.bit_count() >= qa:
                advance = True
        if advance and self._state == OPEN_STATE:
            self._advance(now_ms)

    def _advance(self, now_ms: int) -> None:
        op = self._op
        if op is not None and op.kind == "ensemble" and self._change_holds_acks:
            # No entry is acknowledged while an ensemble change is in flight
            # (as BookKeeper holds its add callbacks): the new fragment starts
            # at the LAC of the change's start, and an entry confirmed now by
            # the surviving bookies would leave ``_data`` unsent to the
            # replacement the metadata names for it - a copy short for good.
            # ``_apply_ensemble_change`` advances once it has resent them.
            return
        first = entry_id = self.last_add_confirmed + 1
        acks_map, data_map, held, qa = self._acks, self._data, self._held, self._qa
        length, overhead = self.length, self._overhead
        outside, size, stray = self._not_ws_masks, self._size, 0
        gone, ws_masks, trail, kept = 0, self._ws_masks, self._trail, self._kept_bytes
        if self._failed or self._lag_mask:  # rare: a position awaits replacement or lags
            gone = sum(1 << p for p in self._failed) | self._lag_mask  # (acks forgotten)
            outside = tuple(m | gone for m in outside)
        bound = self.config.heal_bytes_max
        room = bound - kept  # bytes of records that may still be kept
        while True:
            acks = acks_map.get(entry_id)
            if acks is None or acks.bit_count() < qa or (held and entry_id in held):
                break
            stray |= acks & outside[entry_id % size]  # acks from outside its write set
            del acks_map[entry_id]
            record = data_map.pop(entry_id)
            length += len(record) - overhead
            missing = ws_masks[entry_id % size] & ~acks  # bookies yet to ack (writer_heal)
            if missing:
                if missing & gone:  # short on a lagging bookie (or one being replaced)
                    self._kept_bytes = bound - room
                    self._note_short(entry_id, missing & gone, record)
                    room = bound - self._kept_bytes
                    missing &= ~gone
                if missing and len(record) <= room:  # trailing: kept until they ack
                    trail[entry_id] = missing
                    self._trail_data[entry_id] = record
                    room -= len(record)
                elif missing:
                    self.untracked += 1
            entry_id += 1
        self._kept_bytes = bound - room
        self.length = length
        if entry_id > first:
            if stray or self._state != OPEN_STATE or entry_id - 1 > self.last_add_pushed \
                    or (op is not None and op.kind == "ensemble" and self._change_holds_acks):
                self._check_acknowledged(first, entry_id - 1, stray)  # raises
            self.last_add_confirmed = entry_id - 1
            self._changes_in_a_row = 0
            self._lac_moved_ms = now_ms
            self._out.append(ev.CompleteAdds(self.ledger_id, first, entry_id - 1))
            self._arm_tick(now_ms)

    def _check_acknowledged(self, first: int, last: int, stray: int) -> None:
        """The rules of acknowledging ``first..last``, with their messages:
        called only when ``_advance``'s one-line guard saw one broken (the
        guard is the per-ack cost: a few comparisons, no call)."""
        lid = self.ledger_id
        invariant(self._state == OPEN_STATE, "ledger %d: writer acknowledging %d..%d in state "
                  "%s (the LAC is frozen from close() or a stop on)", lid, first, last,
                  self._state)
        invariant(last <= self.last_add_pushed, "ledger %d: acknowledging %d..%d, made only "
                  "up to %d", lid, first, last, self.last_add_pushed)
        invariant(not stray, "ledger %d: %d..%d acknowledged with acks from positions %s, "
                  "outside their write sets or awaiting replacement (Qa acks of the write "
                  "set are needed)", lid, first, last, bin(stray))
        op = self._op
        invariant(op is None or op.kind != "ensemble" or not self._change_holds_acks,
                  "ledger %d: %d..%d acknowledged while an ensemble change is in flight",
                  lid, first, last)
