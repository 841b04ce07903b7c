"""The driver's explicit LACs: those of several ledgers queued for one bookie
in one loop turn travel as one WRITE_LAC_MULTI (a bookie's only one as a
plain WRITE_LAC); a bookie that refuses the op as a bad request (one from
before it) gets them again one by one, and only WRITE_LAC from then on."""

from __future__ import annotations

import pytest

from appliance.errors import OK, BadRequestError, UnauthorizedError
from appliance.protocol import events as ev
from ipc.client import Event
from ipc.frames import Op
from ipc.replies import ErrorReply, WriteLacMultiReply
from ipc.requests import WriteLacMultiRequest, WriteLacRequest
from tests.support.driver_fakes import FakeCore as _Core
from tests.support.driver_fakes import driver_with_fakes

KEY = b"k" * 32


@pytest.fixture
def driver():
    with driver_with_fakes() as d:
        yield d


def _write_lac(driver, core, ledger_id, lac, bookie):
    driver._cores[id(core)] = core
    driver.run(core, [ev.SendWriteLac(ledger_id * 10, bookie, ledger_id, lac, KEY)])


def _sent(driver):
    return [(b, type(r).__name__) for b, r, _ in driver.transport.sent]


def test_lacs_of_a_turn_share_one_message_per_bookie(driver):
    cores = {ledger: _Core() for ledger in range(1, 6)}
    for ledger, core in cores.items():
        _write_lac(driver, core, ledger, ledger + 40, "b1")
    _write_lac(driver, cores[1], 1, 41, "b2")  # b2's only one
    assert driver.transport.sent == []  # nothing leaves before the end of the turn
    driver.outbound.flush_lacs()
    assert sorted(_sent(driver)) == [("b1", "WriteLacMultiRequest"), ("b2", "WriteLacRequest")]
    multi = next(r for b, r, _ in driver.transport.sent if b == "b1")
    assert multi.rows == [(n, n + 40, KEY) for n in range(1, 6)]
    single = next(r for b, r, _ in driver.transport.sent if b == "b2")
    assert (single.ledger_id, single.lac, single.master_key) == (1, 41, KEY)
    driver.outbound.flush_lacs()
    assert len(driver.transport.sent) == 2  # sent once

    # the reply (even a refused row) is dropped, as a WRITE_LAC's: best effort
    rid = next(rid for b, _, rid in driver.transport.sent if b == "b1")
    reply = WriteLacMultiReply([(n, n + 40, OK) for n in range(1, 5)]
                               + [(5, -1, UnauthorizedError.code)], rid)
    driver._on_net([Event("b1", rid, int(Op.WRITE_LAC_MULTI), OK, reply)])
    assert all(core.events == [] for core in cores.values())
    assert len(driver.transport.sent) == 2 and rid not in driver._routes


def test_a_turn_with_more_lacs_than_a_message_holds_sends_several(driver):
    driver.outbound.add_batch_entries_max = 4
    cores = [_Core() for _ in range(10)]
    for ledger, core in enumerate(cores, 1):
        _write_lac(driver, core, ledger, 7, "b1")
    driver.outbound.flush_lacs()
    rows = [[row[0] for row in r.rows] for _, r, _ in driver.transport.sent]
    assert rows == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10]]


def test_a_bookie_refusing_the_op_gets_the_lacs_one_by_one_from_then_on(driver):
    cores = [_Core() for _ in range(3)]
    for ledger, core in enumerate(cores, 1):
        _write_lac(driver, core, ledger, 5, "b1")
    _write_lac(driver, cores[0], 1, 5, "b2")
    _write_lac(driver, cores[1], 2, 5, "b2")
    driver.outbound.flush_lacs()
    assert sorted(_sent(driver)) == [("b1", "WriteLacMultiRequest"),
                                     ("b2", "WriteLacMultiRequest")]
    driver.unregister(cores[2])  # a handle closed meanwhile: its LAC no longer matters
    rid = next(rid for b, _, rid in driver.transport.sent if b == "b1")
    refused = ErrorReply(Op.WRITE_LAC_MULTI, rid, BadRequestError.code, 0, -1,
                         "unknown op 15")
    driver._on_net([Event("b1", rid, int(Op.WRITE_LAC_MULTI), OK, refused)])
    again = [(r.ledger_id, r.lac) for b, r, _ in driver.transport.sent[2:]]
    assert again == [(1, 5), (2, 5)]
    assert all(isinstance(r, WriteLacRequest) for _, r, _ in driver.transport.sent[2:])

    # from then on b1 gets WRITE_LAC only; b2, which did not refuse, still the multi
    before = len(driver.transport.sent)
    for ledger, core in enumerate(cores[:2], 1):
        _write_lac(driver, core, ledger, 6, "b1")
        _write_lac(driver, core, ledger, 6, "b2")
    driver.outbound.flush_lacs()
    assert sorted(_sent(driver)[before:]) == [("b1", "WriteLacRequest"),
                                              ("b1", "WriteLacRequest"),
                                              ("b2", "WriteLacMultiRequest")]


def test_another_failure_of_the_message_is_not_a_refusal(driver):
    cores = [_Core() for _ in range(2)]
    for ledger, core in enumerate(cores, 1):
        _write_lac(driver, core, ledger, 5, "b1")
    driver.outbound.flush_lacs()
    (_, _, rid), = driver.transport.sent
    busy = ErrorReply(Op.WRITE_LAC_MULTI, rid, 12, 0, -1, "overloaded")  # TooManyRequests
    driver._on_net([Event("b1", rid, int(Op.WRITE_LAC_MULTI), OK, busy)])
    assert len(driver.transport.sent) == 1 and "b1" not in driver.outbound._lac_multi_refused
    for ledger, core in enumerate(cores, 1):
        _write_lac(driver, core, ledger, 6, "b1")
    driver.outbound.flush_lacs()
    assert isinstance(driver.transport.sent[-1][1], WriteLacMultiRequest)
