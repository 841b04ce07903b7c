"""The driver's add coalescing: small adds of many ledgers queued in one loop
turn travel to each bookie as one ADD_BATCH and come back to each core as
its own ``AddResponses``; big adds keep their packed message; a reply that
leaves an entry out, or a failed message, fails the parts it carried (never
a false ack)."""

from __future__ import annotations

import pytest

from appliance.client.driver import COALESCE_ENTRIES_MAX, Driver
from appliance.errors import OK, BookieUnavailableError, LedgerFencedError
from appliance.protocol import events as ev
from ipc.client import Event
from ipc.packed import AddPackedRequest
from ipc.replies import AddBatchReply
from ipc.requests import AddBatchRequest

KEY = b"k" * 32


class _Registry:
    def available(self):
        return {b: {"endpoint": f"ipc:///nowhere/{b}.sock"} for b in ("b1", "b2")}


class _Transport:
    def __init__(self):
        self.sent: list[tuple[str, object, int]] = []

    def send(self, bookie_id, request, timeout_ms):
        self.sent.append((bookie_id, request, len(self.sent) + 1))
        return len(self.sent)

    def add_bookie(self, *_):
        pass


class _Core:
    def __init__(self):
        self.events = []

    def handle(self, event):
        self.events.append(event)
        return []


@pytest.fixture
def driver():
    d = Driver(None, _Registry())
    real = d.transport
    d.transport = _Transport()
    yield d
    real.close()
    d._pool.shutdown(wait=True)


def _add(driver, core, ledger_id, entry_ids, bookie="b1", request_id=None):
    action = ev.SendAdd(request_id or ledger_id, bookie, ledger_id, tuple(entry_ids),
                        tuple(b"e%d-%d" % (ledger_id, e) for e in entry_ids), False, KEY)
    driver._cores[id(core)] = core
    driver._send_add(core, action)
    return action


def test_small_adds_of_many_ledgers_share_one_message_per_bookie(driver):
    cores = {ledger: _Core() for ledger in range(1, 51)}
    for ledger, core in cores.items():
        _add(driver, core, ledger, [0], "b1")
        _add(driver, core, ledger, [0], "b2", request_id=1000 + ledger)
    big_core = _Core()
    _add(driver, big_core, 99, range(COALESCE_ENTRIES_MAX + 1), "b1")
    assert driver.transport.sent == []  # nothing leaves before the end of the turn
    driver._flush_adds()
    kinds = sorted((b, type(r).__name__) for b, r, _ in driver.transport.sent)
    assert kinds == [("b1", "AddBatchRequest"), ("b1", "AddPackedRequest"),
                     ("b2", "AddBatchRequest")]
    batch = next(r for b, r, _ in driver.transport.sent
                 if b == "b1" and isinstance(r, AddBatchRequest))
    assert [(i.ledger_id, i.entry_id) for i in batch.items] == [(n, 0) for n in range(1, 51)]
    packed = next(r for _, r, _ in driver.transport.sent if isinstance(r, AddPackedRequest))
    assert packed.ledger_id == 99 and len(packed.entry_ids) == COALESCE_ENTRIES_MAX + 1

    rid = next(rid for b, r, rid in driver.transport.sent
               if b == "b1" and isinstance(r, AddBatchRequest))
    statuses = [(n, 0, LedgerFencedError.code if n == 7 else OK) for n in range(1, 51)]
    driver._on_net([Event("b1", rid, 7, OK, AddBatchReply(statuses))])
    for ledger, core in cores.items():
        (got,) = core.events
        assert isinstance(got, ev.AddResponses) and got.ledger_id == ledger
        assert got.bookie_id == "b1" and got.entry_ids == (0,)
        assert got.codes == ((LedgerFencedError.code,) if ledger == 7 else (OK,))


def test_a_reply_leaving_an_entry_out_fails_that_part_only(driver):
    a, b = _Core(), _Core()
    _add(driver, a, 1, [0, 1])
    _add(driver, b, 2, [0])
    driver._flush_adds()
    (_, _, rid), = driver.transport.sent
    driver._on_net([Event("b1", rid, 7, OK, AddBatchReply([(1, 0, OK), (2, 0, OK)]))])
    assert [type(e).__name__ for e in a.events] == ["AddResponse", "AddResponse"]
    assert all(e.code != OK for e in a.events)  # entry 1 was not answered: no ack
    assert b.events[0].codes == (OK,)


def test_a_failed_message_fails_every_part_it_carried(driver):
    cores = [_Core() for _ in range(3)]
    for n, core in enumerate(cores, start=1):
        _add(driver, core, n, [5])
    driver._flush_adds()
    (_, _, rid), = driver.transport.sent
    driver._on_net([Event("b1", rid, 7, BookieUnavailableError.code)])
    for n, core in enumerate(cores, start=1):
        (got,) = core.events
        assert (got.ledger_id, got.entry_id, got.code) == (n, 5, BookieUnavailableError.code)


def test_a_lone_small_add_still_travels_packed(driver):
    core = _Core()
    _add(driver, core, 1, [0])
    driver._flush_adds()
    (_, request, _), = driver.transport.sent
    assert isinstance(request, AddPackedRequest)
