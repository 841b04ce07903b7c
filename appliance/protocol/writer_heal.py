"""The writer's delayed ensemble change and its healing: a failed bookie
with no spare to replace it stays in the ensemble while the ack quorum
holds, and the entries acknowledged without it are re-sent to it once it
answers again.

Guarantees:

* **Lagging, not failing.**  A bookie of the current ensemble that errs,
  disconnects or stays silent past its retries, when no spare bookie can
  replace it (``delay_ensemble_change``, BookKeeper's
  ``delayEnsembleChange``), becomes *lagging* instead of stopping the
  writer, but only while every write set keeps ``Qa`` positions that are
  neither lagging nor awaiting replacement (``_can_lag``).  Adds are not
  sent to a lagging position, its acks never count towards an ack quorum,
  and entries are still acknowledged at ``Qa`` acks of the rest of their
  write set: durability is what it is with ``Qa`` copies.  When the ack
  quorum itself is lost the writer stops with ``NotEnoughBookiesError`` as
  before.
* **A later ensemble change.**  While a position lags the writer retries the
  change on every tick and whenever the bookies it may use change; a spare
  found then replaces it as any change does (a new fragment from
  ``LAC + 1``).  When a spare exists at the failure the change is made at
  once, as without this rule.
* **Healing.**  Every entry acknowledged while a bookie of its write set
  lagged is *short* on that bookie: the writer keeps its record (by bookie
  id, so it survives a later replacement of the position) and every
  ``add_timeout_ms`` sends the bookie the lowest short entry as a probe; the
  first OK (the bookie answers again) sends it every short entry, and a
  lagging position of the current ensemble rejoins (it gets the adds
  pending and every later one).  An entry leaves the short set only on an
  OK from that bookie: it then has its write quorum again.
* **Bounded.**  The records kept for healing never exceed
  ``heal_bytes_max`` bytes: an entry that would pass it stops the writer
  with ``NotEnoughBookiesError`` (its adds fail clearly; nothing
  acknowledged is lost: every short entry has ``Qa`` copies).
* **A crash of the writer heals too.**  While entries are short, the LAC
  the writer publishes (carried by its entries and explicit LAC writes)
  stays below the lowest of them, so a recovery of this ledger (the next
  opener, autorecovery) reads forward from there and writes every later
  entry back to its whole write set, the lagging bookie included.
* **Close.**  ``close()`` waits for the short entries to heal, at most
  ``heal_close_wait_ms`` (the LAC is frozen meanwhile), then closes; what
  is still short then is counted in ``short_left`` (each such entry keeps
  ``Qa`` copies; autorecovery re-replicates it once its bookie is lost).

State owned here: ``_lagging`` (positions kept in the ensemble after a
failure), ``_short`` (bookie -> {entry id: record}), ``_short_bytes``,
``_short_first`` (lowest short entry, or None), ``_heal_ms`` / ``_heal_all``
(per bookie: last probe or full resend, and whether that was the full
resend), ``_close_wait_from``, ``short_left``, ``healed_entries``.
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

    # -- short entries --------------------------------------------------------------
    def _note_short(self, entry_id: int, missing: int, record: bytes) -> None:
        """``entry_id`` is acknowledged without the lagging positions in
        ``missing`` (a bit mask): remember it for them."""
        ensemble, short = self._ws.ensemble, self._short
        for pos in self._lagging:
            if missing >> pos & 1:
                short.setdefault(ensemble[pos], {})[entry_id] = record
                self._short_bytes += len(record)
        if self._short_first is None:
            self._short_first = entry_id
        if self._short_bytes > self.config.heal_bytes_max:
            self._heal_overflow = True

    def _published_lac(self) -> int:
        """The LAC to carry: below the lowest short entry while there is one."""
        first = self._short_first
        lac = self.last_add_confirmed
        return lac if first is None or first > lac else first - 1

    def _heal_tick(self, now_ms: int) -> None:
        """Probe each bookie holding short entries every ``add_timeout_ms``."""
        timeout_ms = self.config.add_timeout_ms
        for bookie, entries in self._short.items():
            if entries and now_ms - self._heal_ms.get(bookie, -timeout_ms) >= timeout_ms:
                self._heal_ms[bookie], self._heal_all[bookie] = now_ms, False
                first = min(entries)
                self._send_heal(bookie, [first])
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
                self._short_bytes -= len(entries.pop(entry_id))
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
        self._short_first = min((min(e) for e in self._short.values() if e), default=None)
        self._maybe_close_after_heal(now_ms)

    # -- close ------------------------------------------------------------------------
    def _close_waits_heal(self, now_ms: int) -> bool:
        """Whether the close should wait for short entries to heal."""
        ensemble = set(self._ws.ensemble)  # a replaced bookie's are autorecovery's
        if not self._heal_enabled or not any(b in ensemble for b in self._short):
            return False
        if self._close_wait_from is None:
            self._close_wait_from = now_ms
        return now_ms - self._close_wait_from < self.config.heal_close_wait_ms

    def _close_after_heal(self, now_ms: int) -> None:
        """The close's CAS starts now, or once the short entries healed."""
        if not self._close_waits_heal(now_ms):
            self._close_wait_from = None
            self._start_close()

    def _maybe_close_after_heal(self, now_ms: int) -> None:
        if self._state == CLOSING and self._op is None and self._close_wait_from is not None:
            self._close_after_heal(now_ms)

    def _forget_short(self) -> None:
        """The writer is done: what is still short is counted, not kept."""
        self.short_left += sum(len(e) for e in self._short.values())
        self._short.clear()
        self._short_bytes = 0
        self._short_first = None
