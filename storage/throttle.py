"""A byte-rate limit (token bucket) for background copying (compaction).

``TokenBucket(rate).take(n)`` returns once ``n`` more bytes fit the rate:
over any window of ``t`` seconds at most ``rate * t + burst`` bytes are
taken, where ``burst`` is at most one second's worth, saved up while idle
(the bucket starts empty: a run starts at the rate, not with a burst).  A
request larger than what is in the bucket is let through at once and
repaid afterwards (the bucket goes into debt and the next ``take`` waits it
out), so a chunk bigger than the burst never blocks for ever and the
long-run rate still holds.

A rate of 0 means no limit (``take`` never waits).  The clock and the
sleep are injectable: tests drive them without sleeping, and the compactor
passes a sleep that a stop request interrupts (``take`` then returns early;
the caller checks why).
"""

from __future__ import annotations

import time
from collections.abc import Callable


class TokenBucket:
    """See the module docstring.  Not thread-safe (one compaction at a time)."""

    def __init__(self, rate_bytes_per_s: int, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], object] = time.sleep):
        if rate_bytes_per_s < 0:
            raise ValueError(f"rate_bytes_per_s must be >= 0, not {rate_bytes_per_s}")
        self.rate = rate_bytes_per_s
        self._clock, self._sleep = clock, sleep
        self._tokens = 0.0  # empty at the start: no burst when a run begins
        self._at = clock()
        self.waited_s = 0.0  # total time take() spent waiting (status, metrics)

    def take(self, nbytes: int) -> float:
        """Account ``nbytes``; wait while the bucket is in debt.  Returns the
        seconds waited (0 when unlimited or within the burst)."""
        if self.rate <= 0 or nbytes <= 0:
            return 0.0
        self._refill()
        self._tokens -= nbytes
        if self._tokens >= 0:
            return 0.0
        wait_s = -self._tokens / self.rate
        started = self._clock()
        self._sleep(wait_s)
        self._refill()
        waited = max(0.0, self._clock() - started)
        self.waited_s += waited
        return waited

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(float(self.rate), self._tokens + (now - self._at) * self.rate)
        self._at = now
