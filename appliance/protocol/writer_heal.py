"""The writer's delayed ensemble change and its healing: a failed bookie
with no spare to replace it stays in the ensemble while the ack quorum
holds, and every entry acknowledged without one of its bookies is re-sent
to that bookie once it answers again.

Guarantees:

* **Every bookie is followed, not only the ack quorum.**  An entry
  acknowledged at ``Qa`` acks stays *trailing* (its record kept) until every
  other bookie of its write set acknowledged it too.  A bookie whose oldest
  unacknowledged entry, trailing or pending, is ``add_timeout_ms`` old is
  resent and then failed as before (``writer_timers``), so a bookie that
  silently stops answering while the others keep the ack quorum is noticed.
  When it fails, its trailing entries become *short* on it.
* **Lagging, not failing.**  A failed bookie with no spare to replace it
  (``delay_ensemble_change``, BookKeeper's ``delayEnsembleChange``) becomes
  *lagging* instead of stopping the writer, but only while every write set
  keeps ``Qa`` positions that are neither lagging nor awaiting replacement
  (``_can_lag``).  Adds are not sent to a lagging position, its acks never
  count towards an ack quorum, and entries are acknowledged at ``Qa`` acks of
  the rest of their write set.  When the ack quorum itself is lost the
  writer stops with ``NotEnoughBookiesError`` as before.
* **A later ensemble change.**  While a position lags the writer retries the
  change on every tick and whenever the bookies it may use change; a spare
  found then replaces it as any change does (a new fragment from
  ``LAC + 1``).  When a spare exists at the failure the change is made at
  once, as without this rule.
* **Healing.**  Every entry acknowledged without a lagging or failed bookie
  of its write set is short on it: the writer keeps its record (by bookie
  id, so it survives a later replacement of the position) and every
  ``add_timeout_ms`` sends that bookie the lowest short entry as a probe; the
  first OK (the bookie answers again) sends it every short entry, and a
  lagging position of the current ensemble rejoins (it gets the adds
  pending and every later one).  An entry stops being short on a bookie only
  on an OK from that bookie: it then has one more copy, up to ``Qw``.
* **Close.**  ``close()`` waits (the LAC frozen) until no entry trails or is
  short on a bookie of the current ensemble that is still registered (one
  gone from the registry is autorecovery's), at most ``heal_close_wait_ms``;
  trailing entries still unanswered ``add_timeout_ms`` into the wait become
  short on their bookies (probed as above).
* **Bounded.**  Trailing and short records together never exceed
  ``heal_bytes_max`` bytes: past it an acknowledged entry is not kept (as
  without this rule: a bookie that missed it keeps it missing until
  re-replication), counted in ``untracked``.  What is still short when the
  writer ends (closed, fenced, failed, or a short bookie that was replaced)
  is counted in ``short_left``; each such entry has at least ``Qa`` copies.

State owned here: ``_trail`` / ``_trail_data`` (entry id -> positions yet to
acknowledge it, its record; inserted in entry order, so the first key is the
lowest), ``_lagging`` / ``_lag_mask``, ``_short`` (bookie -> {entry id:
record}), ``_kept_bytes``, ``_heal_ms`` / ``_heal_all`` (per bookie: last
probe or full resend, and whether it was the full resend),
``_close_wait_from``, ``short_left``, ``healed_entries``, ``untracked``.
"""

from __future__ import annotations

from appliance.protocol import events as ev
from appliance.protocol.core import CoreBase
from appliance.protocol.errors import OK, LedgerFencedError
from appliance.protocol.writer_states import CLOSING, FENCED, OPEN_STATE

HEAL_BATCH_ENTRIES = 256  # short entries per heal message


class WriterHeal(CoreBase):
    """The lagging-bookie part of ``LedgerWriter`` (see the module docstring)."""

    # -- lagging ------------------------------------------------------------------
    def _can_lag(self, positions) -> bool:
        """Whether every write set keeps ``Qa`` positions outside ``positions``."""
        qa = self._qa
        return all(sum(1 for p in ps if p not in positions) >= qa
                   for ps in self._ws.positions)

    def _lag(self) -> bool:
        """No replacement for ``_failed``: keep them in the ensemble as lagging
        when the rule allows it (True), else False (the caller stops)."""
        if not self.config.delay_ensemble_change:
            return False
        gone = self._failed | self._lagging
        if not self._can_lag(gone):
            return False
        self._lagging = gone
        self._failed = set()
        self._lag_mask = sum(1 << p for p in gone)
        return True

    def _unlag(self, pos: int, now_ms: int) -> None:
        """The lagging bookie at ``pos`` answers again: it rejoins."""
        if self.on_rejoin is not None:
            self.on_rejoin(self._ws.ensemble[pos])
        self._lagging.discard(pos)
        self._lag_mask = sum(1 << p for p in self._lagging)
        self._outstanding[pos] = []
        self._cursor[pos] = 0
        self._retries[pos], self._resent_ms[pos] = 0, -1
        if self._state == OPEN_STATE:
            held = self._held
            pending = [e for e in self._data if e not in held]
            self._send(pending, self._records(pending), frozenset((pos,)), now_ms)

    def _retry_change(self) -> None:
        """A lagging position may be replaced now that a spare exists."""
        if not self._lagging or self._op is not None or self._state != OPEN_STATE:
            return
        taken = set(self._ws.ensemble)
        if any(b not in taken for b in self.available_bookies):
            self._start_ensemble_change()

    def _on_available_bookies(self, event: ev.AvailableBookies) -> None:
        super()._on_available_bookies(event)
        self._retry_change()

    # -- trailing and short entries ------------------------------------------------------
    def _trail_acks(self, bit: int, entry_ids, now_ms: int) -> None:
        """OKs for acknowledged entries from the position of ``bit``."""
        trail, data, clear, freed, stale = self._trail, self._trail_data, ~bit, 0, 0
        for entry_id in entry_ids:
            missing = trail.get(entry_id)
            if missing == bit:  # the usual case: the last bookie of its write set
                del trail[entry_id]
                freed += len(data.pop(entry_id))
            elif missing is None or not missing & bit:
                stale += 1
            else:
                trail[entry_id] = missing & clear
        self._kept_bytes -= freed
        self.stale_replies += stale
        if not trail and self._state == CLOSING:
            self._maybe_close_after_heal(now_ms)

    def _trail_to_short(self, pos: int) -> None:
        """The bookie at ``pos`` failed: what trails on it is short on it."""
        bit, trail, data = 1 << pos, self._trail, self._trail_data
        moved = [e for e, missing in trail.items() if missing & bit]
        if not moved:
            return
        short = self._short.setdefault(self._ws.ensemble[pos], {})
        for entry_id in moved:
            record = data[entry_id]
            short[entry_id] = record
            self._kept_bytes += len(record)
            missing = trail[entry_id] & ~bit
            if missing:
                trail[entry_id] = missing
            else:
                del trail[entry_id]
                self._kept_bytes -= len(data.pop(entry_id))

    def _note_short(self, entry_id: int, missing: int, record: bytes) -> None:
        """``entry_id`` is acknowledged without the positions in ``missing``
        (lagging or awaiting replacement): it is short on their bookies."""
        ensemble, short = self._ws.ensemble, self._short
        for pos in range(self._size):
            if missing >> pos & 1:
                if self._kept_bytes + len(record) > self.config.heal_bytes_max:
                    self.untracked += 1
                    continue
                short.setdefault(ensemble[pos], {})[entry_id] = record
                self._kept_bytes += len(record)

    def _heal_tick(self, now_ms: int) -> None:
        """Probe each bookie holding short entries every ``add_timeout_ms``."""
        timeout_ms = self.config.add_timeout_ms
        if self._state == CLOSING and self._trail and self._close_wait_from is not None \
                and now_ms - self._close_wait_from >= timeout_ms:
            for pos in range(self._size):  # closing: no more waiting for trailing acks
                self._trail_to_short(pos)
        for bookie, entries in self._short.items():
            if entries and now_ms - self._heal_ms.get(bookie, -timeout_ms) >= timeout_ms:
                self._heal_ms[bookie], self._heal_all[bookie] = now_ms, False
                self._send_heal(bookie, [min(entries)])
        self._maybe_close_after_heal(now_ms)

    def _send_heal(self, bookie: str, entry_ids: list[int]) -> None:
        if not self._heal_enabled:
            return  # the simulation's switch: short entries stay short
        entries = self._short[bookie]
        for i in range(0, len(entry_ids), HEAL_BATCH_ENTRIES):
            ids = tuple(entry_ids[i:i + HEAL_BATCH_ENTRIES])
            self._out.append(ev.SendAdd(self._next_id(), bookie, self.ledger_id, ids,
                                        tuple(entries[e] for e in ids), False, self._key))

    def _heal_reply(self, bookie: str, entry_ids, codes, now_ms: int) -> bool:
        """Replies of ``bookie`` for its short entries; True when every entry
        of the reply was one (nothing left for the usual path)."""
        entries = self._short[bookie]
        healed = others = 0
        for entry_id, code in zip(entry_ids, codes, strict=True):
            if entry_id not in entries:
                others += 1
            elif code == OK:
                self._kept_bytes -= len(entries.pop(entry_id))
                healed += 1
            elif code == LedgerFencedError.code and self._state in (OPEN_STATE, CLOSING):
                self._stop(FENCED, LedgerFencedError.code)
                return True
        if healed:
            self.healed_entries += healed
            self._bookie_answers(bookie, now_ms)
        return others == 0

    def _bookie_answers(self, bookie: str, now_ms: int) -> None:
        entries = self._short[bookie]
        if not entries:
            del self._short[bookie]
            self._heal_ms.pop(bookie, None)
            self._heal_all.pop(bookie, None)
        elif not self._heal_all.get(bookie):  # the probe's answer: send them all
            self._heal_ms[bookie], self._heal_all[bookie] = now_ms, True
            self._send_heal(bookie, sorted(entries))
        pos = self._ws.index.get(bookie)
        if pos is not None and pos in self._lagging:
            self._unlag(pos, now_ms)
        self._maybe_close_after_heal(now_ms)

    # -- close ------------------------------------------------------------------------
    def _close_waits_heal(self, now_ms: int) -> bool:
        """Whether the close should wait for trailing or short entries: on a
        bookie of the ensemble that is still registered (one replaced, or gone
        from the registry, is autorecovery's: re-replicated once lost)."""
        if not self._heal_enabled or not self._waiting_for():
            return False
        if self._close_wait_from is None:
            self._close_wait_from = now_ms
        return now_ms - self._close_wait_from < self.config.heal_close_wait_ms

    def _waiting_for(self) -> set[str]:
        ensemble, mask = self._ws.ensemble, 0
        for missing in self._trail.values():
            mask |= missing
        bookies = {ensemble[p] for p in range(self._size) if mask >> p & 1}
        bookies.update(b for b, entries in self._short.items() if entries and b in ensemble)
        return bookies.intersection(self.available_bookies)

    def _close_after_heal(self, now_ms: int) -> None:
        """The close's CAS starts now, or once the short entries healed."""
        if not self._close_waits_heal(now_ms):
            self._close_wait_from = None
            self._start_close()
        else:
            self._arm_tick()

    def _maybe_close_after_heal(self, now_ms: int) -> None:
        if self._state == CLOSING and self._op is None and self._close_wait_from is not None:
            self._close_after_heal(now_ms)

    def _forget_short(self) -> None:
        """The writer is done: what is still short is counted, not kept."""
        self.short_left += sum(len(e) for e in self._short.values())
        self._short.clear()
        self._trail.clear()
        self._trail_data.clear()
        self._kept_bytes = 0
