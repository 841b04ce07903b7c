"""The compaction rate limit's token bucket, on an injected clock: nothing
here sleeps."""

from __future__ import annotations

import pytest

from storage.throttle import TokenBucket


class FakeTime:
    def __init__(self):
        self.now = 100.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_no_limit_never_waits():
    t = FakeTime()
    bucket = TokenBucket(0, t.clock, t.sleep)
    assert all(bucket.take(1 << 30) == 0.0 for _ in range(10))
    assert t.sleeps == [] and bucket.waited_s == 0.0


def test_one_seconds_worth_passes_at_once_then_the_rate_holds():
    t = FakeTime()
    bucket = TokenBucket(1000, t.clock, t.sleep)
    assert bucket.take(600) == 0.0 and bucket.take(400) == 0.0  # the burst
    assert bucket.take(500) == pytest.approx(0.5)
    for _ in range(20):
        bucket.take(250)
    # 6,500 bytes in total: one second's burst, then 5.5 s at 1,000 B/s
    assert t.now - 100.0 == pytest.approx(5.5)
    assert bucket.waited_s == pytest.approx(5.5)


def test_a_take_bigger_than_the_burst_goes_through_and_is_repaid():
    t = FakeTime()
    bucket = TokenBucket(1000, t.clock, t.sleep)
    assert bucket.take(4000) == pytest.approx(3.0)  # 1,000 in the bucket, 3,000 of debt
    assert bucket.take(1000) == pytest.approx(1.0)


def test_idle_time_refills_at_most_one_second():
    t = FakeTime()
    bucket = TokenBucket(1000, t.clock, t.sleep)
    bucket.take(1000)
    t.now += 3600.0  # an hour idle: still only one second's burst
    assert bucket.take(1000) == 0.0
    assert bucket.take(1000) == pytest.approx(1.0)


def test_a_wait_cut_short_is_counted_as_waited():
    t = FakeTime()
    bucket = TokenBucket(1000, t.clock, lambda s: None)  # an interrupted sleep returns early
    bucket.take(1000)
    assert bucket.take(2000) == 0.0 and bucket.waited_s == 0.0


def test_a_negative_rate_is_refused():
    with pytest.raises(ValueError, match="rate_bytes_per_s"):
        TokenBucket(-1)
