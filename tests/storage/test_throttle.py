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


def test_a_run_starts_at_the_rate_without_a_burst():
    t = FakeTime()
    bucket = TokenBucket(1000, t.clock, t.sleep)
    assert bucket.take(500) == pytest.approx(0.5)
    for _ in range(22):
        bucket.take(250)
    # 6,000 bytes at 1,000 B/s: 6 s
    assert t.now - 100.0 == pytest.approx(6.0)
    assert bucket.waited_s == pytest.approx(6.0)


def test_a_take_bigger_than_the_bucket_goes_through_and_is_repaid():
    t = FakeTime()
    bucket = TokenBucket(1000, t.clock, t.sleep)
    assert bucket.take(3000) == pytest.approx(3.0)  # 3,000 of debt, waited out
    t.now += 0.5
    assert bucket.take(1000) == pytest.approx(0.5)


def test_idle_time_saves_up_at_most_one_second():
    t = FakeTime()
    bucket = TokenBucket(1000, t.clock, t.sleep)
    t.now += 0.4
    assert bucket.take(400) == 0.0  # saved up while idle
    t.now += 3600.0  # an hour idle: only one second's burst
    assert bucket.take(1000) == 0.0
    assert bucket.take(1000) == pytest.approx(1.0)


def test_a_wait_cut_short_is_counted_as_waited():
    t = FakeTime()
    bucket = TokenBucket(1000, t.clock, lambda s: None)  # an interrupted sleep returns early
    assert bucket.take(2000) == 0.0 and bucket.waited_s == 0.0


def test_a_negative_rate_is_refused():
    with pytest.raises(ValueError, match="rate_bytes_per_s"):
        TokenBucket(-1)
