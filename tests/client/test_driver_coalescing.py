"""The driver's add coalescing: small adds of many ledgers queued in one loop
turn travel to each bookie as one ADD_MULTI (ADD_BATCH to a bookie that
refuses ADD_MULTI) and come back to each core as its own ``AddResponses``;
an add that fills a message, or a bookie's only one, keeps its packed
message; a reply that leaves an entry out, or a
failed message, fails the parts it carried (never a false ack)."""

from __future__ import annotations

import pytest

from appliance.errors import (
    OK,
    BadRequestError,
    BKTimeoutError,
    BookieUnavailableError,
    LedgerFencedError,
)
from appliance.protocol import events as ev
from ipc.client import Event
from ipc.frames import Op
from ipc.packed import AddMultiReply, AddMultiRequest, AddPackedRequest
from ipc.replies import AddBatchReply, ErrorReply
from ipc.requests import AddBatchRequest
from tests.support.driver_fakes import FakeCore as _Core
from tests.support.driver_fakes import driver_with_fakes

KEY = b"k" * 32


@pytest.fixture
def driver():
    with driver_with_fakes() as d:
        yield d


def _add(driver, core, ledger_id, entry_ids, bookie="b1", request_id=None):
    action = ev.SendAdd(request_id or ledger_id, bookie, ledger_id, tuple(entry_ids),
                        tuple(b"e%d-%d" % (ledger_id, e) for e in entry_ids), False, KEY)
    driver._cores[id(core)] = core
    driver.outbound.add(core, action)
    return action


def test_small_adds_of_many_ledgers_share_one_message_per_bookie(driver):
    cores = {ledger: _Core() for ledger in range(1, 51)}
    for ledger, core in cores.items():
        _add(driver, core, ledger, [0], "b1")
        _add(driver, core, ledger, [0], "b2", request_id=1000 + ledger)
    big_core, entries_max = _Core(), driver.outbound.add_batch_entries_max
    _add(driver, big_core, 99, range(entries_max), "b1")  # a message by itself
    assert driver.transport.sent == []  # nothing leaves before the end of the turn
    driver.outbound.flush_adds()
    kinds = sorted((b, type(r).__name__) for b, r, _ in driver.transport.sent)
    assert kinds == [("b1", "AddMultiRequest"), ("b1", "AddPackedRequest"),
                     ("b2", "AddMultiRequest")]
    multi = next(r for b, r, _ in driver.transport.sent
                 if b == "b1" and isinstance(r, AddMultiRequest))
    assert multi.groups == [(n, KEY, 1) for n in range(1, 51)]
    assert [(g[0], list(g[2]), [bytes(d) for d in g[3]]) for g in multi.group_entries()] == \
        [(n, [0], [b"e%d-0" % n]) for n in range(1, 51)]
    packed = next(r for _, r, _ in driver.transport.sent if isinstance(r, AddPackedRequest))
    assert packed.ledger_id == 99 and len(packed.entry_ids) == entries_max

    rid = next(rid for b, r, rid in driver.transport.sent
               if b == "b1" and isinstance(r, AddMultiRequest))
    statuses = [LedgerFencedError.code if n == 7 else OK for n in range(1, 51)]
    driver._on_net([Event("b1", rid, 7, OK, AddMultiReply([0] * 50, statuses))])
    for ledger, core in cores.items():
        (got,) = core.events
        assert isinstance(got, ev.AddResponses) and got.ledger_id == ledger
        assert got.bookie_id == "b1" and got.entry_ids == (0,)
        assert got.codes == ((LedgerFencedError.code,) if ledger == 7 else (OK,))


def test_a_multi_reply_of_another_length_or_entry_fails_the_parts_it_does_not_answer(driver):
    a, b, c = _Core(), _Core(), _Core()
    _add(driver, a, 1, [0, 1])
    _add(driver, b, 2, [4])
    driver.outbound.flush_adds()
    (_, _, rid), = driver.transport.sent
    # one row short: rows name no ledger, so no part can be trusted
    driver._on_net([Event("b1", rid, 7, OK, AddMultiReply([0, 1], [OK, OK]))])
    assert _refused(a) == [(0, True), (1, True)] and _refused(b) == [(4, True)]
    a.events.clear(), b.events.clear()
    _add(driver, a, 1, [2])
    _add(driver, c, 3, [9])
    driver.outbound.flush_adds()
    rid = driver.transport.sent[-1][2]
    # ledger 3's row names another entry: that part fails, ledger 1's is acked
    driver._on_net([Event("b1", rid, 8, OK, AddMultiReply([2, 8], [OK, OK]))])
    assert a.events[0].codes == (OK,) and a.events[0].entry_ids == (2,)
    assert _refused(c) == [(9, True)]


def _refused(core) -> list:
    """(entry id, refused) of every reply ``core`` was given, whether as one
    ``AddResponse`` per entry or as ``AddResponses``."""
    return [(e, code != OK) for event in core.events
            for e, code in (zip(event.entry_ids, event.codes, strict=True)
                            if isinstance(event, ev.AddResponses)
                            else [(event.entry_id, event.code)])]


def test_a_bookie_refusing_add_multi_gets_the_parts_again_as_add_batch(driver):
    """An older bookie answers the unknown op BadRequest (nothing stored):
    the same parts go again as ADD_BATCH, and so does everything after."""
    a, b = _Core(), _Core()
    _add(driver, a, 1, [0])
    _add(driver, b, 2, [0])
    driver.outbound.flush_adds()
    (_, first, rid), = driver.transport.sent
    assert isinstance(first, AddMultiRequest)
    driver._on_net([Event("b1", rid, 7, OK, ErrorReply(Op.ADD_MULTI, rid, BadRequestError.code,
                                                       message="unknown op 14"))])
    assert a.events == [] and b.events == []  # no failure reached the cores
    (_, again, rid2) = driver.transport.sent[-1]
    assert isinstance(again, AddBatchRequest)
    assert [(i.ledger_id, i.entry_id, bytes(i.data)) for i in again.items] == \
        [(1, 0, b"e1-0"), (2, 0, b"e2-0")]
    driver._on_net([Event("b1", rid2, 8, OK, AddBatchReply([(1, 0, OK), (2, 0, OK)]))])
    assert a.events[0].codes == (OK,) and b.events[0].codes == (OK,)
    _add(driver, a, 1, [1])
    _add(driver, b, 2, [1])
    driver.outbound.flush_adds()
    assert isinstance(driver.transport.sent[-1][1], AddBatchRequest)


def test_a_bookie_that_took_add_multi_then_refuses_it_leaves_those_parts_unanswered(driver):
    """Once a bookie has answered ADD_MULTI, its messages' routes keep only
    the parts' ids, not their bytes.  Should it refuse a later one (an older
    version took its place), those parts count as unanswered, never acked
    (the writers' timeouts resend them), and what follows goes as ADD_BATCH."""
    a, b = _Core(), _Core()
    _add(driver, a, 1, [0])
    _add(driver, b, 2, [0])
    driver.outbound.flush_adds()
    rid = driver.transport.sent[-1][2]
    driver._on_net([Event("b1", rid, 7, OK, AddMultiReply([0, 0], [OK, OK]))])
    assert a.events[0].codes == (OK,) and b.events[0].codes == (OK,)
    a.events.clear(), b.events.clear()
    _add(driver, a, 1, [1])
    _add(driver, b, 2, [1])
    driver.outbound.flush_adds()
    rid, sent = driver.transport.sent[-1][2], len(driver.transport.sent)
    driver._on_net([Event("b1", rid, 8, OK, ErrorReply(Op.ADD_MULTI, rid, BadRequestError.code,
                                                       message="unknown op 14"))])
    assert len(driver.transport.sent) == sent  # nothing to send again from here
    for core, ledger in ((a, 1), (b, 2)):
        (got,) = core.events
        assert (got.ledger_id, got.entry_id, got.code) == (ledger, 1, BKTimeoutError.code)
    _add(driver, a, 1, [1])
    _add(driver, b, 2, [1])
    driver.outbound.flush_adds()
    assert isinstance(driver.transport.sent[-1][1], AddBatchRequest)


def test_a_batch_reply_leaving_an_entry_out_fails_that_part_only(driver):
    driver.outbound._multi_refused.add("b1")  # ADD_BATCH: rows name their ledger
    a, b = _Core(), _Core()
    _add(driver, a, 1, [0, 1])
    _add(driver, b, 2, [0])
    driver.outbound.flush_adds()
    (_, _, rid), = driver.transport.sent
    driver._on_net([Event("b1", rid, 7, OK, AddBatchReply([(1, 0, OK), (2, 0, OK)]))])
    assert [type(e).__name__ for e in a.events] == ["AddResponse", "AddResponse"]
    assert all(e.code != OK for e in a.events)  # entry 1 was not answered: no ack
    assert b.events[0].codes == (OK,)


def test_a_failed_message_fails_every_part_it_carried(driver):
    cores = [_Core() for _ in range(3)]
    for n, core in enumerate(cores, start=1):
        _add(driver, core, n, [5])
    driver.outbound.flush_adds()
    (_, _, rid), = driver.transport.sent
    driver._on_net([Event("b1", rid, 7, BookieUnavailableError.code)])
    for n, core in enumerate(cores, start=1):
        (got,) = core.events
        assert (got.ledger_id, got.entry_id, got.code) == (n, 5, BookieUnavailableError.code)


def test_a_lone_small_add_still_travels_packed(driver):
    core = _Core()
    _add(driver, core, 1, [0])
    driver.outbound.flush_adds()
    (_, request, _), = driver.transport.sent
    assert isinstance(request, AddPackedRequest)


def test_mid_size_parts_of_several_ledgers_share_a_message_within_the_limits(driver):
    """Not only one-entry parts: 100 ledgers with 40 entries each in a turn
    (a hundred ledgers written at once) travel as few ADD_MULTI messages,
    each within add_batch_entries_max."""
    driver.outbound.add_batch_entries_max = 256
    cores = [_Core() for _ in range(100)]
    for n, core in enumerate(cores, start=1):
        _add(driver, core, n, range(40))
    driver.outbound.flush_adds()
    sent = [r for _, r, _ in driver.transport.sent]
    assert all(isinstance(r, AddMultiRequest) for r in sent)
    assert [len(r.entry_ids) for r in sent] == [240] * 16 + [160]  # 6 parts a message
    assert [g[0] for r in sent for g in r.groups] == list(range(1, 101))
