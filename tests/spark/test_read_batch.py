"""The bookie's READ_BATCH path (``BookieHandler._read_batch``) over a real
``LedgerStorage``: batched storage reads must keep the per-entry semantics
(fence first, cuts at max entries / max bytes, one error row that ends the
batch, limbo -> DataUnknown)."""

from __future__ import annotations

import pytest

from appliance.bookie.handler import BookieHandler
from appliance.checks.digest import make_digest
from appliance.errors import (
    OK,
    CorruptRecordError,
    DataUnknownError,
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
)
from appliance.protocol.bookie import BookieCore
from appliance.protocol.entry import pack_entries
from appliance.protocol.keys import master_key
from ipc.frames import DEFAULT_LIMITS
from ipc.packed import ReadPackedReply, ReadPackedRequest
from ipc.replies import ErrorReply, ReadBatchReply, decode_reply, encode_reply
from ipc.requests import ReadBatchRequest
from storage import LedgerStorage, StorageOptions
from tests.support.bookie_handler import handler_on_storage

KEY = master_key(b"pw")
LEDGER = 7


class _Server:
    """What the handler needs of ``ipc.server.FrameServer`` here."""

    limits = DEFAULT_LIMITS

    def __init__(self):
        self.sent: list = []

    def watch_fd(self, fd, callback) -> None:
        pass  # no durability wake-ups needed: these tests only read

    def send_reply(self, peer: bytes, reply) -> bool:
        self.sent.append(reply)
        return True


@pytest.fixture
def handler(tmp_path):
    with handler_on_storage(tmp_path, _Server()) as h:
        yield h


def _store(h: BookieHandler, payloads: list[bytes], first: int = 0, batch: int = 50) -> list:
    """Add entries in several batches (several storage blocks); returns the records."""
    records, length = [], 0
    for lo in range(0, len(payloads), batch):
        recs, length = pack_entries(LEDGER, first + lo, first + lo - 1, length,
                                    payloads[lo:lo + batch], make_digest("crc32c", KEY))
        codes, ticket = h.core.add_batch(LEDGER, list(range(first + lo, first + lo + len(recs))),
                                         recs, KEY)
        assert codes == [OK] * len(recs)
        h.storage.wait_durable(ticket)
        records += recs
    return records


@pytest.fixture(params=["READ_BATCH", "READ_PACKED"])
def op(request):
    return request.param


def _rows(h, first, last, max_entries=1024, max_bytes=1 << 24, fence=False, op="READ_BATCH"):
    """The reply's rows ``(entry id, status, bytes or None)``; a READ_PACKED
    reply goes through the wire encoder and decoder first."""
    cls = ReadPackedRequest if op == "READ_PACKED" else ReadBatchRequest
    reply = h.handle(b"peer", cls(LEDGER, first, last, max_entries, max_bytes,
                                  fence=fence, master_key=KEY))
    if reply is None:  # a fence reply waits for the journal, as in the server loop
        h.storage.flush()
        h._on_durable()
        reply = h.server.sent.pop()
    if op == "READ_PACKED":
        assert isinstance(reply, ReadPackedReply)
        reply = decode_reply(encode_reply(reply))
        datas = iter(reply.entries())
        return [(e, s, bytes(next(datas)) if s == OK else None)
                for e, s in zip(reply.entry_ids, reply.statuses, strict=True)]
    assert isinstance(reply, ReadBatchReply)
    return [(e, s, None if d is None else bytes(d)) for e, s, d in reply.rows]


def test_full_range_in_order_with_exact_bytes(handler, op):
    records = _store(handler, [b"p%05d" % i for i in range(300)])
    rows = _rows(handler, 0, 299, op=op)
    assert [(e, s) for e, s, _ in rows] == [(i, OK) for i in range(300)]
    assert [d for _, _, d in rows] == records


def test_cuts_at_max_entries_and_max_bytes(handler, op):
    records = _store(handler, [bytes(100) for _ in range(200)])
    assert len(_rows(handler, 10, 199, max_entries=37, op=op)) == 37
    size = len(records[0])
    rows = _rows(handler, 0, 199, max_bytes=size * 5 + size // 2, op=op)
    assert [e for e, _, _ in rows] == [0, 1, 2, 3, 4]
    # the first entry always comes back, even when it alone is over max_bytes
    assert [e for e, _, _ in _rows(handler, 3, 199, max_bytes=1, op=op)] == [3]


def test_past_the_end_ends_with_one_no_such_entry_row(handler, op):
    _store(handler, [b"x"] * 120)
    rows = _rows(handler, 100, 500, op=op)
    assert [(e, s) for e, s, _ in rows] == [(i, OK) for i in range(100, 120)] + \
        [(120, NoSuchEntryError.code)]
    assert rows[-1][2] is None
    assert _rows(handler, 200, 300, op=op) == [(200, NoSuchEntryError.code, None)]


def test_gap_inside_the_range_stops_at_the_gap(handler, op):
    _store(handler, [b"a"] * 10)
    _store(handler, [b"b"] * 10, first=15)
    rows = _rows(handler, 0, 24, op=op)
    assert [(e, s) for e, s, _ in rows] == [(i, OK) for i in range(10)] + \
        [(10, NoSuchEntryError.code)]


def test_unknown_ledger_is_an_explicit_negative(handler):
    reply = handler.handle(b"peer", ReadBatchRequest(99, 0, 5, 10, 1 << 20))
    assert isinstance(reply, ReadBatchReply)
    assert reply.rows == [(0, NoSuchLedgerError.code, None)]


def test_limbo_ledger_answers_data_unknown_not_a_negative(handler, op):
    _store(handler, [b"z"] * 30)
    handler.storage.wait_durable(handler.storage.mark_limbo(LEDGER))
    rows = _rows(handler, 20, 40, op=op)
    assert [(e, s) for e, s, _ in rows] == [(i, OK) for i in range(20, 30)] + \
        [(30, DataUnknownError.code)]


def test_fence_flag_fences_before_reading(handler, op):
    records = _store(handler, [b"f"] * 5)
    assert _rows(handler, 0, 4, fence=True, op=op) == [(i, OK, records[i]) for i in range(5)]
    assert handler.storage.is_fenced(LEDGER)
    more, _ = pack_entries(LEDGER, 5, 4, 5, [b"late"], make_digest("crc32c", KEY))
    codes, _ = handler.core.add_batch(LEDGER, [5], more, KEY)
    assert codes == [LedgerFencedError.code]


def test_fence_with_a_wrong_key_is_refused(handler):
    _store(handler, [b"k"] * 3)
    reply = handler.handle(b"peer", ReadBatchRequest(LEDGER, 0, 2, 10, 1 << 20, fence=True,
                                                      master_key=master_key(b"other")))
    rows = reply.rows if isinstance(reply, ReadBatchReply) else None
    assert isinstance(reply, ErrorReply) or rows[0][1] != OK
    assert not handler.storage.is_fenced(LEDGER)


def test_corrupt_record_on_disk_ends_the_batch_with_its_error(tmp_path, op):
    journal, ledgers = tmp_path / "j2", tmp_path / "l2"
    opts = StorageOptions(entry_log_buffer_bytes=64 * 1024, checkpoint_interval_s=3600.0)
    LedgerStorage.format("bookie-2", journal, ledgers, opts)
    storage = LedgerStorage.open("bookie-2", journal, ledgers, opts)
    h = BookieHandler("bookie-2", storage, BookieCore(storage))
    h.server = _Server()
    try:
        records = _store(h, [b"c%05d" % i * 20 for i in range(200)])
    finally:
        storage.close()
    log = next(p for p in sorted(ledgers.iterdir()) if p.name.startswith("entrylog-")
               and records[57] in p.read_bytes())
    pos = log.read_bytes().find(records[57]) + len(records[57]) - 3
    with open(log, "r+b") as f:
        f.seek(pos)
        f.write(b"\x00\xff\x00")
    storage = LedgerStorage.open("bookie-2", journal, ledgers, opts)
    h = BookieHandler("bookie-2", storage, BookieCore(storage))
    h.server = _Server()
    try:
        rows = _rows(h, 0, 199, op=op)
        assert rows == [(i, OK, records[i]) for i in range(57)] + \
            [(57, CorruptRecordError.code, None)]
        assert _rows(h, 58, 199, op=op) == [(i, OK, records[i]) for i in range(58, 200)]
    finally:
        storage.close()
