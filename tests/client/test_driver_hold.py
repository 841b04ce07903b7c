"""The driver's hold of adds per bookie (``[client] add_messages_inflight``):
a write handle's fresh batch to a bookie that already has that many add
messages awaiting replies waits for one of those replies, at most
``add_linger_us``, and travels with the other ledgers' adds in one message;
adds that must not wait (resends, recovery writes, batches that already
waited at their handle) take the held ones along at once, and a full
message never waits."""

from __future__ import annotations

import time

import pytest

from appliance.errors import OK, BKTimeoutError
from appliance.protocol import events as ev
from ipc.client import Event
from ipc.packed import AddMultiReply, AddMultiRequest, AddPackedReply, AddPackedRequest
from tests.support.driver_fakes import FakeCore, driver_with_fakes

KEY = b"k" * 32


@pytest.fixture
def driver():
    with driver_with_fakes() as d:
        assert d.outbound.add_messages_inflight == 1  # the default
        yield d


def _add(driver, ledger_id, entry_ids, bookie="b1", holdable=True):
    core = FakeCore()
    driver._cores[id(core)] = core
    action = ev.SendAdd(ledger_id, bookie, ledger_id, tuple(entry_ids),
                        tuple(b"e%d-%d" % (ledger_id, e) for e in entry_ids), False, KEY)
    driver.run(core, [action], holdable)
    return core


def _sent_after(driver, ledger_id, entry_ids=(0,), holdable=True) -> int:
    """Messages sent so far, after ``ledger_id``'s add to b1 and a turn's end."""
    _add(driver, ledger_id, entry_ids, holdable=holdable)
    driver.outbound.flush_adds()
    return len(driver.transport.sent)


def _one_out(driver):
    """Ledger 1's add to b1, sent at once (nothing awaits a reply yet)."""
    core = _add(driver, 1, [0])
    driver.outbound.flush_adds()
    (bookie, request, rid), = driver.transport.sent
    assert bookie == "b1" and isinstance(request, AddPackedRequest)
    return core, rid


def _reply_packed(driver, rid, ledger_id, entry_ids):
    driver._on_net([Event("b1", rid, 7, OK, AddPackedReply(ledger_id, list(entry_ids),
                                                           [OK] * len(entry_ids)))])


def test_fresh_adds_wait_for_the_reply_then_share_one_message(driver):
    first, rid = _one_out(driver)
    cores = [_add(driver, ledger, [0]) for ledger in (2, 3, 4)]
    driver.outbound.flush_adds()
    assert len(driver.transport.sent) == 1  # held: b1 has a message awaiting its reply
    driver.outbound.flush_adds()
    assert len(driver.transport.sent) == 1  # still held on the next turn
    _reply_packed(driver, rid, 1, [0])
    assert first.events[0].codes == (OK,)
    driver.outbound.flush_adds()  # the end of the turn that applied the reply
    assert len(driver.transport.sent) == 2
    _, multi, rid2 = driver.transport.sent[1]
    assert isinstance(multi, AddMultiRequest)
    assert [g[0] for g in multi.groups] == [2, 3, 4]
    driver._on_net([Event("b1", rid2, 7, OK, AddMultiReply([0, 0, 0], [OK, OK, OK]))])
    assert [c.events[0].codes for c in cores] == [(OK,)] * 3
    # every message answered: the next fresh add leaves at once again
    _add(driver, 5, [0])
    driver.outbound.flush_adds()
    assert len(driver.transport.sent) == 3


def test_held_adds_leave_at_the_linger_without_a_reply(driver):
    _one_out(driver)
    assert _sent_after(driver, 2) == 1
    (deadline, _, _, _), = driver._later  # a deferred call ends the loop's wait in time
    assert 0 < deadline - time.monotonic() <= driver.outbound.add_hold_s
    driver.outbound._held_since["b1"] -= driver.outbound.add_hold_s  # as if the linger had passed
    driver.outbound.flush_adds()
    assert len(driver.transport.sent) == 2  # no reply came: the linger sent it
    assert driver.transport.sent[1][1].ledger_id == 2


def test_an_add_that_must_not_wait_takes_the_held_ones_along(driver):
    _one_out(driver)
    assert _sent_after(driver, 2) == 1
    # a resend, a recovery write, a batch held at its handle: it goes, and the held one too
    assert _sent_after(driver, 3, [5], holdable=False) == 2
    multi = driver.transport.sent[1][1]
    assert isinstance(multi, AddMultiRequest) and [g[0] for g in multi.groups] == [2, 3]


def test_only_the_busy_bookie_holds(driver):
    _one_out(driver)  # b1 has a message out, b2 none
    _add(driver, 2, [0], "b1")
    _add(driver, 2, [0], "b2")
    driver.outbound.flush_adds()
    assert [b for b, _, _ in driver.transport.sent] == ["b1", "b2"]


def test_a_full_message_never_waits(driver):
    _one_out(driver)
    entries_max = driver.outbound.add_batch_entries_max
    assert _sent_after(driver, 2, range(entries_max - 1)) == 1  # one short
    assert _sent_after(driver, 3) == 2  # now the held adds fill a message: they go
    assert [g[0] for g in driver.transport.sent[1][1].groups] == [2, 3]


def test_a_timed_out_message_ends_the_wait(driver):
    first, rid = _one_out(driver)
    assert _sent_after(driver, 2) == 1
    driver._on_net([Event("b1", rid, 7, BKTimeoutError.code, None)])
    assert first.events and all(e.code == BKTimeoutError.code for e in first.events)
    driver.outbound.flush_adds()
    assert len(driver.transport.sent) == 2


def test_zero_turns_the_hold_off(driver):
    driver.outbound.add_messages_inflight = 0
    _one_out(driver)
    assert _sent_after(driver, 2) == 2


def test_a_higher_limit_holds_only_past_it(driver):
    driver.outbound.add_messages_inflight = 2
    _one_out(driver)
    assert _sent_after(driver, 2) == 2  # one message out: below the limit
    assert _sent_after(driver, 3) == 2  # two out: held
