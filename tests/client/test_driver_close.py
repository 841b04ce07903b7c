"""The driver's close with calls in flight: a call its loop never ran fails
with ``ClientClosedError``, also one queued while the client was closing
(after the leftovers were failed), and a call that ran keeps its result."""

from __future__ import annotations

import pytest

from appliance.errors import ClientClosedError
from tests.support.driver_fakes import driver_with_fakes


def test_a_call_the_loop_never_ran_fails_at_close():
    with driver_with_fakes() as driver:
        fut = driver.call(lambda: 42)  # the loop is not running: it stays queued
        assert not fut.done()
        driver._stopped = True  # as close() leaves it, once the loop has returned
        driver._fail_leftovers()
        with pytest.raises(ClientClosedError, match="before this call ran"):
            fut.result(timeout=0)


def test_a_call_queued_after_the_leftovers_were_failed_fails_too():
    with driver_with_fakes() as driver:
        driver._stopped = True  # closing: the loop returned, _closed not yet seen
        driver._fail_leftovers()
        fut = driver.call(lambda: 42)
        with pytest.raises(ClientClosedError):
            fut.result(timeout=0)
        driver._fail_leftovers()  # the closing thread again: no error, still failed
        assert isinstance(fut.exception(timeout=0), ClientClosedError)


def test_a_call_that_ran_keeps_its_result():
    with driver_with_fakes() as driver:
        fut = driver.call(lambda: 42)
        driver._apply(driver._q.popleft())  # the loop runs it
        driver._stopped = True
        driver._fail_leftovers()
        assert fut.result(timeout=0) == 42
