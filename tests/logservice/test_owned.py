"""An owned log's answers with its writer stood in for: a request written as
one run is answered with its records' positions once the run is stored,
and a retry of records still being stored waits for them and gets the
same positions (no second copy)."""

from __future__ import annotations

import threading
import types

from appliance.client.add_future import AddFuture, complete_futures
from appliance.logservice.owned import OPEN, OwnedLog
from appliance.protocol.log_service import runs_dlsns
from appliance.protocol.logs import DLSN
from tests.support.launch import wait_for

PID = bytes(range(16))


class FakeWriter:
    """Takes runs and records; the test stores them (``settle``)."""

    def __init__(self):
        self.cond = threading.Condition()
        self.runs: list[tuple[AddFuture, int]] = []
        self.written = 0
        self.room = True  # the ledger handle's window (LogWriter.has_room)

    def has_room(self, payloads):
        return self.room

    def write_run_async(self, payloads, tags):
        fut = AddFuture(self.cond)
        self.runs.append((fut, len(payloads)))
        self.written += len(payloads)
        return fut

    def write_many_async(self, payloads, tags):  # a producer's first request
        futures = [AddFuture(self.cond) for _ in payloads]
        self.runs += [(f, 1) for f in futures]
        self.written += len(payloads)
        return futures

    def settle(self, run: int, result) -> None:
        complete_futures(self.cond, [(result, self.runs[run][0])], None)


def _owned(**options):
    replies = []
    owned = OwnedLog(types.SimpleNamespace(), "fake", "test", lambda i, d: replies.append(d),
                     lambda: None, **options)
    wait_for(lambda: owned.state != "opening", 10)  # its opening fails: no real client
    owned.writer, owned.state, owned.error = FakeWriter(), OPEN, None
    return owned, replies


def test_a_run_is_answered_once_stored_and_a_retry_meanwhile_gets_the_same_positions():
    owned, replies = _owned()
    head = {"log": "fake", "pid": PID.hex(), "seq": 1, "gen": 1}
    assert owned.write(b"p", head, PID, 1, 1, [b"a"]) is None  # a new producer: one by one
    owned.writer.settle(0, DLSN(1, 6, 0))
    assert runs_dlsns(replies.pop()["runs"]) == [(1, 6, 0)]
    assert owned.write(b"p", {**head, "seq": 2}, PID, 2, 2, [b"b", b"c", b"d"]) is None
    # the producer timed out and sends records 3 and 4 again, before the run is stored
    assert owned.write(b"p", {**head, "seq": 3, "gen": 2}, PID, 3, 2, [b"c", b"d"]) is None
    assert replies == [] and owned.writer.written == 4  # nothing stored twice
    owned.writer.settle(1, [[1, 7, 0, 2], [1, 8, 0, 1]])  # split over two entries
    first, retry = replies
    assert runs_dlsns(first["runs"]) == [(1, 7, 0), (1, 7, 1), (1, 8, 0)]
    assert retry["seq"] == 3 and runs_dlsns(retry["runs"]) == [(1, 7, 1), (1, 8, 0)]
    # a retry after the run was stored is answered at once
    assert owned.write(b"p", {**head, "seq": 4, "gen": 3}, PID, 4, 2, [b"d"]) is None
    assert runs_dlsns(replies[-1]["runs"]) == [(1, 8, 0)]


def test_held_records_wait_for_the_producers_just_answered_then_leave_in_one_entry():
    owned, replies = _owned(gather_s=1.0, monotonic=lambda: 100.0)  # answers at 100 s
    sent = []
    owned.writer.entries_inflight = 0
    owned.writer.send_if_idle = lambda wake, entries_max=1: sent.append(owned.writer.written) \
        or True
    other = bytes(16)
    for pid, seq in ((PID, 1), (other, 1)):
        head = {"log": "fake", "pid": pid.hex(), "seq": seq, "gen": 1}
        assert owned.write(b"i", head, pid, seq, seq, [b"x"]) is None
    for run in range(2):
        owned.writer.settle(run, DLSN(1, run, 0))
    assert len(replies) == 2 and len(owned.gate) == 2  # both answered: awaited
    head = {"log": "fake", "pid": PID.hex(), "seq": 2, "gen": 1}
    owned.write(b"i", head, PID, 2, 2, [b"y"])
    due = owned.send_buffered(100.25, 2.0, 2)
    assert due == 101.0 and sent == []  # the other producer is awaited (until 100 + 1 s)
    owned.write(b"i", {**head, "pid": other.hex()}, other, 2, 2, [b"z"])
    assert owned.send_buffered(100.5, 2.0, 2) is None
    assert sent == [4]  # both records left together


def test_a_producer_that_writes_again_before_its_reply_returns_is_not_awaited():
    """The reply leaves before the thread that sent it goes on (another
    thread reads the producer's next request meanwhile): that producer has
    written already, so the next entry must not wait for it (the gather rule
    would hold it ``gather_s`` for nothing)."""
    replies, owned_box = [], []

    def reply(identity, doc):  # the producer's next write is read at once
        replies.append(doc)
        owned = owned_box[0]
        seq = doc["seq"] + 1
        owned.write(b"p", {**doc, "op": "write", "seq": seq}, PID, seq, seq, [b"next"])

    owned = OwnedLog(types.SimpleNamespace(), "fake", "test", reply, lambda: None,
                     gather_s=1.0, monotonic=lambda: 100.0)
    owned_box.append(owned)
    wait_for(lambda: owned.state != "opening", 10)  # its opening fails: no real client
    owned.writer, owned.state, owned.error = FakeWriter(), OPEN, None
    head = {"log": "fake", "pid": PID.hex(), "seq": 1, "gen": 1}
    assert owned.write(b"p", head, PID, 1, 1, [b"a"]) is None  # first request: one by one
    owned.writer.settle(0, DLSN(1, 0, 0))  # answered (_send_answers); write 2 came meanwhile
    assert len(replies) == 1 and len(owned.gate) == 0
    owned.writer.settle(1, DLSN(1, 1, 0))  # write 2 is a run (_send_runs); write 3 came
    assert len(replies) == 2 and len(owned.gate) == 0


def test_a_request_its_ledger_has_no_room_for_is_answered_retry_at_once_and_taken_later():
    owned, replies = _owned()
    head = {"log": "fake", "pid": PID.hex(), "seq": 1, "gen": 1}
    owned.writer.room = False  # acks stalled: the handle's window is full
    answer = owned.write(b"p", head, PID, 1, 1, [b"a", b"b"])
    assert answer["op"] == "error" and answer["code"] == "retry", answer
    assert "inflight_adds_max" in answer["message"]
    assert owned.writer.written == 0 and owned.stats["busy"] == 1
    assert owned.hello(PID) is None  # nothing judged: the producer is not even known
    owned.writer.room = True  # acks came: the producer's resend is taken
    assert owned.write(b"p", {**head, "gen": 2}, PID, 1, 1, [b"a", b"b"]) is None
    assert owned.writer.written == 2
    owned.writer.settle(0, DLSN(1, 0, 0))
    owned.writer.settle(1, DLSN(1, 0, 1))
    assert runs_dlsns(replies.pop()["runs"]) == [(1, 0, 0), (1, 0, 1)]


class _Window:
    """A ledger handle's window: ``WriteHandle.has_room``'s rule."""

    def __init__(self, adds_max: int, inflight: int):
        self.adds_max, self.inflight, self.asked = adds_max, inflight, []

    def has_room(self, count, size):
        self.asked.append(count)
        return self.inflight + count <= self.adds_max


def _writer(window: _Window, buffered: int = 0):
    from appliance.logs.writer import LogWriter
    from appliance.protocol.log_entry import HEADER_BYTES

    w = LogWriter.__new__(LogWriter)  # the fields has_room reads, nothing else
    w._entry_max, w._flush_bytes, w._record_overhead = 1024 + HEADER_BYTES, 256, 8
    w._buf_bytes, w._wh, w._inflight = buffered, window, [object()] * window.inflight
    return w


def test_the_room_a_request_needs_counts_only_the_entries_its_append_sends():
    full = _Window(adds_max=2, inflight=2)
    # below flush_bytes with the buffer: nothing is sent by the append
    assert _writer(full, buffered=100).has_room([b"x" * 100]) and full.asked == []
    # reaching it: one entry per flush_bytes plus one, and the window is full
    assert not _writer(full, buffered=100).has_room([b"x" * 200])
    assert full.asked == [2]
    # a record that may not fit after a buffer (over 1024 - 256) is an entry of its own
    assert not _writer(full).has_room([b"x" * 900, b"y"])
    assert full.asked[-1] == (900 + 1 + 16) // 256 + 1 + 2
    # with room, or with nothing in flight (a request larger than the window)
    assert _writer(_Window(adds_max=4, inflight=1)).has_room([b"x" * 300])
    assert _writer(_Window(adds_max=1, inflight=0)).has_room([b"x" * 900] * 3)
