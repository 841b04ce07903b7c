"""A small fixed-bucket histogram for hot paths: one ``bisect`` and three
additions per observation, no locks (one writer thread; a reader takes a
``snapshot`` whose count is the sum of its buckets, so it is always
consistent with itself).  Exposed as Prometheus histograms by
``appliance.bookie.metrics``; storage itself does not depend on a metrics
library."""

from __future__ import annotations

from bisect import bisect_left

# seconds: 100 us .. 10 s
LATENCY_BOUNDS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                    0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Histogram:
    """Counts of observations per bucket (``value <= bound``, then +Inf)."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds=LATENCY_BOUNDS_S):
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0.0

    def observe(self, value: float, weight: int = 1) -> None:
        """Record ``value`` ``weight`` times (a batch of entries, one latency)."""
        self.counts[bisect_left(self.bounds, value)] += weight
        self.total += value * weight

    def snapshot(self) -> tuple[list[tuple[float, int]], float, int]:
        """(cumulative (bound, count) pairs ending with +Inf, sum, count)."""
        counts, total = list(self.counts), self.total
        out, running = [], 0
        for bound, n in zip((*self.bounds, float("inf")), counts, strict=True):
            running += n
            out.append((bound, running))
        return out, total, running
