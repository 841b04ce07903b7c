"""A client's view of its bookies' health: strikes, quarantine, and the
order in which bookies are asked.

A *strike* is a read that failed with an error (not an explicit negative:
"I have no such entry" is an answer, not a fault), timed out, or was
outrun by a speculative read because the bookie had not answered in
``speculative_read_timeout_ms``.  A bookie with ``strikes_max`` strikes
within ``window_ms`` is *quarantined* for ``quarantine_ms`` (BookKeeper's
``bookieQuarantineTime``), then released by itself.

What a quarantine changes, and what it never does:

* reads ask a quarantined bookie last (``order``): it is still asked when
  the others fail, so a quarantine never turns an answer into a failure,
  and the BP-46 rule (an explicit negative needs every replica's "no")
  does not depend on it;
* new ensembles leave quarantined bookies out while enough others are
  available (``prefer``), and use them when too few are left;
* it is advice, not membership: nothing is written anywhere, and each
  client keeps its own.

Pure: the clock comes in as ``now_ms`` arguments.  Bounded: at most
``strikes_max`` strike times per bookie and ``bookies_max`` bookies.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from appliance.protocol import limits


class BookieHealth:
    """Strikes and quarantines of the bookies one client reads from (see
    the module docstring); also counts the speculative reads it sent."""

    def __init__(self, quarantine_ms: int = limits.CLIENT_BOOKIE_QUARANTINE_MS,
                 strikes_max: int = limits.CLIENT_BOOKIE_QUARANTINE_STRIKES,
                 window_ms: int = limits.CLIENT_BOOKIE_STRIKE_WINDOW_MS,
                 bookies_max: int = limits.CLIENT_BOOKIE_HEALTH_BOOKIES_MAX):
        if quarantine_ms < 0 or strikes_max < 1 or window_ms < 0 or bookies_max < 1:
            raise ValueError("quarantine_ms and window_ms must be >= 0, strikes_max and "
                             "bookies_max >= 1")
        self.quarantine_ms, self.strikes_max = quarantine_ms, strikes_max
        self.window_ms, self.bookies_max = window_ms, bookies_max
        self._strikes: dict[str, deque[int]] = {}
        self._until: dict[str, int] = {}  # quarantined bookie -> release time
        self.quarantines = 0  # bookies put in quarantine so far
        self.speculative_reads = 0  # reads also sent to another replica so far

    def strike(self, bookie: str, now_ms: int) -> bool:
        """One more strike against ``bookie``; True when it is quarantined
        by this one."""
        if self.quarantine_ms == 0 or self.is_quarantined(bookie, now_ms):
            return False
        times = self._strikes.get(bookie)
        if times is None:
            if len(self._strikes) >= self.bookies_max:
                self._strikes.pop(next(iter(self._strikes)))
            times = self._strikes[bookie] = deque(maxlen=self.strikes_max)
        times.append(now_ms)
        if len(times) < self.strikes_max or now_ms - times[0] > self.window_ms:
            return False
        times.clear()
        self._until[bookie] = now_ms + self.quarantine_ms
        self.quarantines += 1
        return True

    def is_quarantined(self, bookie: str, now_ms: int) -> bool:
        until = self._until.get(bookie)
        if until is None:
            return False
        if now_ms >= until:  # released
            del self._until[bookie]
            return False
        return True

    def quarantined(self, now_ms: int) -> tuple[str, ...]:
        """The bookies in quarantine now, sorted."""
        return tuple(sorted(b for b in list(self._until) if self.is_quarantined(b, now_ms)))

    def quarantined_count(self, now_ms: int) -> int:
        """How many are in quarantine now, without releasing any (safe to
        call from another thread than the one that strikes: it only reads)."""
        return sum(until > now_ms for until in list(self._until.values()))

    def order(self, bookies: tuple[str, ...], now_ms: int) -> tuple[str, ...]:
        """``bookies`` in the same order, the quarantined ones moved last."""
        if not self._until:
            return bookies
        late = [b for b in bookies if self.is_quarantined(b, now_ms)]
        if not late:
            return bookies
        return tuple(b for b in bookies if b not in late) + tuple(late)

    def prefer(self, bookies: Iterable[str], needed: int, now_ms: int) -> tuple[str, ...]:
        """The candidates for a new ensemble of ``needed``: ``bookies``
        without the quarantined ones, unless fewer than ``needed`` would be
        left (then all of them: a quarantined bookie beats no ledger)."""
        bookies = tuple(bookies)
        healthy = tuple(b for b in bookies if not self.is_quarantined(b, now_ms))
        return healthy if len(healthy) >= needed else bookies
