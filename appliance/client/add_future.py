"""``AddFuture``, the future of one add, and ``complete_futures``, which
settles a batch of them.

Guarantees: an ``AddFuture`` is a real ``concurrent.futures.Future``
(``wait``, ``as_completed``, callbacks and ``cancel`` all work), so callers
treat it as any other future; a batch of adds completes under one lock with
one wake-up; a future its user cancelled stays cancelled (cancelling does
not un-write the entry); a callback that raises is logged, as ``Future``
does, and never stops the others.  Cost: no ``Condition`` and no list per
add (the reasons are in ``AddFuture``'s docstring).  Used by the write
handle and by the log writer for its records.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures._base import CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED, PENDING

log = logging.getLogger(__name__)


class AddFuture(Future):
    """The future of one add: a real ``concurrent.futures.Future`` (``wait``,
    ``as_completed``, callbacks, ``cancel`` all work) whose condition is shared
    by every add of its handle, because building a ``Condition`` per add cost
    a quarter of the client's CPU.  So ``result``/``exception`` wait in a loop
    (a completion wakes every thread waiting on that handle and each re-checks
    its own future), and a batch of adds completes under one lock.
    Its two lists (``wait``'s waiters, callbacks) are made on first use: most
    adds never get either, and two lists per add in flight were most of the
    objects the garbage collector kept scanning.  An add's first callback is
    kept without a list (the usual one: a caller timing or chaining each
    add), for the same reason: a list per add in flight was an object more
    for each young collection to promote, and the promotions are what bring
    the full collections that pause every thread of the process.
    Cancelling an add's future does not un-write the entry."""

    def __init__(self, condition: threading.Condition):
        self._condition = condition
        self._state = PENDING
        self._result = None
        self._exception = None
        self._waiter_list = None
        self._callback_one = None  # the first callback, while it is the only one
        self._callback_list = None  # all of them, once there are two

    @property
    def _waiters(self) -> list:  # the base class and concurrent.futures.wait use it
        if self._waiter_list is None:
            self._waiter_list = []
        return self._waiter_list

    @property
    def _done_callbacks(self) -> list:
        if self._callback_list is None:
            one, self._callback_one = self._callback_one, None
            self._callback_list = [] if one is None else [one]
        return self._callback_list

    def add_done_callback(self, fn) -> None:
        """As ``Future.add_done_callback``: called with this future once it
        is done (at once if it is), in the order the callbacks were added."""
        with self._condition:
            if self._state not in (CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED):
                if self._callback_one is None and self._callback_list is None:
                    self._callback_one = fn
                else:
                    self._done_callbacks.append(fn)
                return
        _call_back(fn, self)

    def _invoke_callbacks(self) -> None:
        one = self._callback_one
        for callback in (one,) if one is not None else (self._callback_list or ()):
            _call_back(callback, self)

    def _wait_done(self, timeout: float | None) -> None:
        """Hold ``_condition``; return once finished (or raise)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._state in (CANCELLED, CANCELLED_AND_NOTIFIED):
                raise CancelledError()
            if self._state == FINISHED:
                return
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise FutureTimeout()
            self._condition.wait(remaining)

    def result(self, timeout: float | None = None):
        with self._condition:
            self._wait_done(timeout)
            error = self._exception
        if error is not None:
            try:
                raise error
            finally:
                error = None  # no reference cycle through the traceback
        return self._result

    def exception(self, timeout: float | None = None):
        with self._condition:
            self._wait_done(timeout)
            return self._exception


def outcome(fut: Future):
    """(result, exception) of a future known to be finished, without its
    lock (a completion callback reading the futures of the same in-order
    batch: ``complete_futures`` finished them before calling back); None if
    it is not finished."""
    if type(fut) is not AddFuture:
        return (fut.result(), None) if fut.done() and fut.exception() is None else \
            ((None, fut.exception()) if fut.done() else None)
    if fut._state != FINISHED:
        return None
    return fut._result, fut._exception


def _call_back(callback, fut: Future) -> None:
    """Run one done-callback; its exception is logged, as ``Future`` does."""
    try:
        callback(fut)
    except Exception:
        log.exception("exception calling callback for %r", fut)


def complete_futures(condition: threading.Condition, settled: list, error) -> None:
    """Finish ``settled`` ((entry id, AddFuture) pairs) with their entry id or
    ``error``: one lock and one wake-up for the batch, then the callbacks.
    A future its user cancelled stays cancelled."""
    done = []
    with condition:
        for entry_id, fut in settled:
            if fut._state != PENDING:
                continue
            fut._state = FINISHED
            waiters = fut._waiter_list or ()
            if error is None:
                fut._result = entry_id
                for waiter in waiters:
                    waiter.add_result(fut)
            else:
                fut._exception = error
                for waiter in waiters:
                    waiter.add_exception(fut)
            if fut._callback_one is not None or fut._callback_list:
                done.append(fut)
        condition.notify_all()
    for fut in done:
        fut._invoke_callbacks()
