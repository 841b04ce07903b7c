"""The bookie handler's read rule over a real ``LedgerStorage``: refusals
for every read op, counted in INFO and in the metrics under their result
code, logged once per ledger per interval, and parked long polls checked
again when they are answered."""

from __future__ import annotations

import logging

from appliance.bookie.metrics import BookieMetrics, MetricsGate
from appliance.bookie.read_refusals import ReadRefusals
from appliance.checks.digest import make_digest
from appliance.errors import OK, UnauthorizedError
from appliance.protocol.entry import pack_entry
from appliance.protocol.keys import master_key
from ipc.packed import ReadPackedRequest
from ipc.replies import ErrorReply, LacReply, ReadReply
from ipc.requests import AddRequest, ReadLacRequest, ReadRequest, WaitLacRequest
from tests.spark.test_read_batch import KEY, LEDGER, _Server, _store, handler  # noqa: F401

WRONG = master_key(b"wrong")
REFUSED = UnauthorizedError.code


class _Clock:
    def __init__(self):
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def test_refusals_are_logged_once_per_ledger_per_interval(caplog):
    clock = _Clock()
    refusals = ReadRefusals("bookie-1", interval_s=60.0, ledgers_max=2, clock=clock)
    with caplog.at_level(logging.WARNING, logger="appliance.bookie"):
        logged = [refusals.refused(7, "READ", False, b"client-1") for _ in range(10)]
        assert logged == [True] + [False] * 9
        clock.now_s += 60.0
        assert refusals.refused(7, "READ_LAC", True, b"client-1")
        assert refusals.refused(8, "READ", True, b"client-2")
        assert refusals.refused(9, "READ", True, b"client-2")  # 7 is forgotten (bound 2)
        assert refusals.refused(7, "READ", True, b"client-2")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 5 and refusals.total == 14 and refusals.logged == 5
    assert "no master key (server.reads_need_key)" in lines[0] and "client-1" in lines[0]
    assert "a wrong master key" in lines[1] and "(9 more refused since the last line)" in lines[1]


def test_every_read_op_is_refused_counted_and_shows_under_its_code(handler):  # noqa: F811
    _store(handler, [b"r%d" % i for i in range(4)])
    metrics = BookieMetrics()
    gate = MetricsGate(handler, metrics)
    for key in (None, WRONG):
        read = gate.handle(b"peer", ReadRequest(LEDGER, 0, master_key=key))
        assert isinstance(read, ErrorReply) and read.status == REFUSED
        packed = gate.handle(b"peer", ReadPackedRequest(LEDGER, 0, 3, 10, 1 << 20,
                                                        master_key=key))
        assert list(packed.statuses) == [REFUSED] and len(packed.data) == 0
        lac = gate.handle(b"peer", ReadLacRequest(LEDGER, master_key=key))
        assert lac.status == REFUSED
        wait = gate.handle(b"peer", WaitLacRequest(LEDGER, -1, 0, master_key=key))
        assert wait.status == REFUSED
    assert handler.counters["reads_refused"] == 8
    assert metrics.read_entries == {REFUSED: 4}  # READ and READ_PACKED, twice each
    read = gate.handle(b"peer", ReadRequest(LEDGER, 0, master_key=KEY))
    assert isinstance(read, ReadReply) and read.data is not None
    assert metrics.read_entries == {REFUSED: 4, OK: 1}
    assert handler.counters["reads_refused"] == 8


class _TimerServer(_Server):
    """``_Server`` plus the timers long polls park with (never fired here)."""

    class _Timer:
        def cancel(self) -> None:
            pass

    def call_later_ms(self, delay_ms: int, fn):
        return self._Timer()


def test_a_parked_long_poll_is_checked_again_when_answered(handler):  # noqa: F811
    handler.server = _TimerServer()
    storage = handler.storage
    storage.wait_durable(storage.fence(LEDGER))  # known to the bookie, without a key yet
    assert handler.handle(b"p1", WaitLacRequest(LEDGER, -1, 60_000, request_id=1)) is None
    assert handler.handle(b"p2", WaitLacRequest(LEDGER, -1, 60_000, request_id=2,
                                                master_key=KEY)) is None
    digest = make_digest("crc32c", KEY)
    for entry_id in (0, 1):  # recovery adds (the ledger is fenced) store the key
        record = pack_entry(LEDGER, entry_id, entry_id - 1, entry_id + 1, b"x", digest)
        handler.handle(b"w", AddRequest(LEDGER, entry_id, KEY, record, recovery=True))
    answers = {r.request_id: r for r in handler.server.sent if r.request_id in (1, 2)}
    assert isinstance(answers[1], ErrorReply) and answers[1].status == REFUSED
    assert isinstance(answers[2], LacReply) and answers[2].lac == 0
    assert handler.counters["reads_refused"] == 1
