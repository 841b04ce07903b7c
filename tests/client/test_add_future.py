"""AddFuture: the futures of one handle share a condition, yet each behaves
as a plain concurrent.futures.Future (results, errors, timeouts, cancel,
callbacks, wait/as_completed, several waiting threads)."""

import threading
from concurrent.futures import CancelledError, Future, as_completed, wait
from concurrent.futures import TimeoutError as FutureTimeout

import pytest

from appliance.client.add_future import AddFuture, complete_futures
from appliance.errors import LedgerFencedError


def futures(n):
    condition = threading.Condition()
    return condition, [AddFuture(condition) for _ in range(n)]


def test_results_errors_and_callbacks():
    condition, (a, b, c) = futures(3)
    assert isinstance(a, Future) and not a.done()
    seen = []
    a.add_done_callback(lambda f: seen.append(f.result()))
    complete_futures(condition, [(7, a), (8, b)], None)
    assert (a.result(), b.result(), seen) == (7, 8, [7])
    with pytest.raises(FutureTimeout):
        c.result(timeout=0.01)
    error = LedgerFencedError("fenced")
    complete_futures(condition, [(9, c)], error)
    assert c.exception() is error
    with pytest.raises(LedgerFencedError):
        c.result()


def test_a_cancelled_add_stays_cancelled_and_the_otherscomplete_futures():
    condition, (a, b) = futures(2)
    assert a.cancel()
    complete_futures(condition, [(0, a), (1, b)], None)
    with pytest.raises(CancelledError):
        a.result()
    assert b.result() == 1


def test_threads_waiting_on_different_futures_each_get_their_own():
    condition, fs = futures(4)
    got = {}

    def waiter(i):
        got[i] = fs[i].result(timeout=30)

    threads = [threading.Thread(target=waiter, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    complete_futures(condition, [(10, fs[0])], None)  # wakes every waiter; only one is done
    complete_futures(condition, [(11 + i, fs[i]) for i in range(1, 4)], None)
    for t in threads:
        t.join(timeout=30)
    assert got == {0: 10, 1: 12, 2: 13, 3: 14}


def test_wait_and_as_completed_see_completions():
    condition, fs = futures(3)
    threading.Timer(0.05, lambda: complete_futures(condition, list(enumerate(fs)), None)).start()
    done, not_done = wait(fs, timeout=30)
    assert len(done) == 3 and not not_done
    assert sorted(f.result() for f in as_completed(fs, timeout=30)) == [0, 1, 2]


def test_callbacks_run_in_the_order_added_whatever_their_number():
    condition, (a, b, c) = futures(3)
    seen = []
    a.add_done_callback(lambda f: seen.append(("a1", f.result())))
    for name in ("b1", "b2", "b3"):
        b.add_done_callback(lambda f, name=name: seen.append((name, f.result())))
    c.add_done_callback(lambda f: seen.append(("c1", f.exception())))
    c.add_done_callback(lambda f: seen.append(("c2", f.exception())))
    complete_futures(condition, [(1, a), (2, b)], None)
    error = LedgerFencedError("fenced")
    complete_futures(condition, [(3, c)], error)
    assert seen == [("a1", 1), ("b1", 2), ("b2", 2), ("b3", 2), ("c1", error), ("c2", error)]
    a.add_done_callback(lambda f: seen.append(("late", f.result())))  # done: runs at once
    assert seen[-1] == ("late", 1)


def test_a_cancelled_add_runs_its_callback_and_a_failing_callback_is_logged(caplog):
    condition, (a, b) = futures(2)
    seen = []
    a.add_done_callback(lambda f: seen.append(f.cancelled()))
    assert a.cancel()
    assert seen == [True]

    def broken(_f):
        raise RuntimeError("callback bug")

    b.add_done_callback(broken)
    b.add_done_callback(lambda f: seen.append(f.result()))
    with caplog.at_level("ERROR", logger="appliance.client.add_future"):
        complete_futures(condition, [(5, b)], None)
    assert seen == [True, 5]  # the second callback still ran
    assert "callback bug" in caplog.text


def test_an_add_with_one_callback_keeps_no_list_for_the_collector():
    # What each add in flight keeps alive is what young collections promote
    # and full ones scan: one callback per add (a caller timing its adds)
    # must not cost a list per add.
    import gc

    def callback(_f):
        pass

    condition = threading.Condition()
    gc.collect()
    before = len(gc.get_objects())
    fs = [AddFuture(condition) for _ in range(2000)]
    for fut in fs:
        fut.add_done_callback(callback)
    grown = len(gc.get_objects()) - before
    assert grown < 2000 * 1.2, grown  # the futures (and the list holding them), not 2 each
    complete_futures(condition, list(enumerate(fs)), None)
    assert [f.result() for f in fs[:3]] == [0, 1, 2]
