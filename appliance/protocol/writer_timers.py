"""The writer's timers: add timeouts (a resend, then a replacement) and the
explicit LAC.

Guarantees: one tick is armed while adds are pending, entries trail or are
short (``writer_heal``), or the LAC is still to publish, never more.  A
bookie whose oldest add it has not acknowledged (pending, or trailing: the
ack quorum confirmed it without this bookie) is ``add_timeout_ms`` old gets
every such add of its write sets resent (the same record under the same id: an add is idempotent),
``add_retries_max`` times in a row, then it is replaced
(``writer_ensemble``).  With ``explicit_lac_interval_ms`` set, the LAC goes
to every bookie of the ensemble (``SendWriteLac``) one interval after it
last moved, so tailing readers see the last entry.

Cost: each tick checks each bookie's oldest unacknowledged add, not every
entry (the acknowledged front of its sent batches is dropped by one slice
deletion).  State owned here: ``_tick``, ``_retries``, ``_resent_ms``,
``add_retries``, ``lac_written``; shared with the send path: ``_outstanding``
and ``_cursor`` (the batches sent to each position).
"""

from __future__ import annotations

from appliance.protocol import events as ev
from appliance.protocol.core import CoreBase
from appliance.protocol.quorum import in_write_set
from appliance.protocol.writer_states import CLOSING, OPEN_STATE


class WriterTimers(CoreBase):
    """The timer part of ``LedgerWriter`` (see the module docstring)."""

    def _arm_tick(self, now_ms: int | None = None) -> None:
        """Keep one tick armed while adds are pending (their timeouts) or the
        LAC is still to publish.  With only the LAC left (``now_ms`` given),
        the tick falls when the writer will have been idle for
        ``explicit_lac_interval_ms``: the LAC goes out one interval after it
        last moved, not up to a tick later."""
        interval = self.config.explicit_lac_interval_ms
        lac_to_write = interval > 0 and self.last_add_confirmed > self.lac_written
        healing = (self._short or self._trail) and self._state in (OPEN_STATE, CLOSING)
        if self._tick is None and (healing or self._state == OPEN_STATE
                                   and (self._data or lac_to_write)):
            delay = self.config.tick_ms()
            if not self._data and now_ms is not None:
                delay = min(delay, max(1, self._lac_moved_ms + interval - now_ms))
            self._tick = self._timer(delay)

    def _on_timer(self, event: ev.TimerFired) -> None:
        if event.timer_id != self._tick:
            self._stale()
            return
        self._tick = None
        if self._state not in (OPEN_STATE, CLOSING):
            return
        if self._state == OPEN_STATE:
            self._check_timeouts(event.now_ms)
            self._maybe_write_lac(event.now_ms)
            self._retry_change()
        if self._short or self._trail or self._close_wait_from is not None:
            self._heal_tick(event.now_ms)
        self._arm_tick(event.now_ms)

    def _check_timeouts(self, now_ms: int) -> None:
        """A bookie whose oldest unacknowledged add is ``add_timeout_ms`` old
        gets its unacknowledged adds resent, ``add_retries_max`` times in a
        row (reset once it has caught up), then it is replaced."""
        timeout_ms = self.config.add_timeout_ms
        for pos, outstanding in enumerate(self._outstanding):
            sent_ms = self._oldest_unacked_ms(pos, outstanding)
            if sent_ms is None or sent_ms > self._resent_ms[pos]:
                self._retries[pos] = 0  # everything resent so far was acknowledged
            if sent_ms is None or now_ms - sent_ms < timeout_ms or self._state != OPEN_STATE \
                    or pos in self._failed or pos in self._lagging:
                continue
            if self._retries[pos] < self.config.add_retries_max:
                self._retries[pos] += 1
                self._resent_ms[pos] = now_ms
                self.add_retries += 1
                self._resend(pos, now_ms)
            else:
                self._bookie_failed(pos, now_ms)

    def _oldest_unacked_ms(self, pos: int, outstanding: list) -> int | None:
        """Drop the acknowledged front of ``pos``'s sent batches (one slice
        deletion); when the oldest entry still unacknowledged there was sent
        (None: none)."""
        bit, acks_map, trail = 1 << pos, self._acks, self._trail
        # entries below ``done`` are acknowledged and no longer trailing (the
        # trail's first key is its lowest: it is filled in entry order)
        done = min(self.last_add_confirmed + 1, next(iter(trail))) if trail \
            else self.last_add_confirmed + 1
        i = self._cursor[pos]
        for j, (entry_ids, sent_ms) in enumerate(outstanding):
            if entry_ids[-1] < done:  # every entry of the batch is done with
                i = 0
                continue
            if entry_ids[i] < done and entry_ids[-1] - entry_ids[0] == len(entry_ids) - 1:
                i = done - entry_ids[0]  # consecutive ids: jump over the done ones
            while i < len(entry_ids):
                entry_id = entry_ids[i]
                acks = acks_map.get(entry_id)
                if (not acks & bit) if acks is not None else trail.get(entry_id, 0) & bit:
                    del outstanding[:j]
                    self._cursor[pos] = i
                    return sent_ms
                i += 1
            i = 0
        outstanding.clear()
        self._cursor[pos] = 0
        return None

    def _resend(self, pos: int, now_ms: int) -> None:
        """Send ``pos`` every entry of its write sets it has not acknowledged
        (an add is idempotent: the same record under the same id)."""
        bit, size, qw = 1 << pos, self._size, self._qw
        held, data = self._held, self._trail_data
        trailing = [e for e, missing in self._trail.items() if missing & bit]
        again = [e for e, acks in self._acks.items()
                 if e not in held and not acks & bit and in_write_set(pos, e, size, qw)]
        self._outstanding[pos] = []
        self._cursor[pos] = 0
        records = [data[e] for e in trailing] + self._records(again)
        self._send(trailing + again, records, frozenset((pos,)), now_ms)

    def _maybe_write_lac(self, now_ms: int) -> None:
        interval_ms = self.config.explicit_lac_interval_ms
        lac = self.last_add_confirmed
        idle_ms = now_ms - self._lac_moved_ms
        if interval_ms <= 0 or lac <= self.lac_written or idle_ms < interval_ms:
            return
        self.lac_written = lac
        for bookie in self._ws.ensemble:
            self._out.append(ev.SendWriteLac(self._next_id(), bookie, self.ledger_id, lac,
                                             self._key))
