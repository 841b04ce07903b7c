"""WRITE_LAC_MULTI on a bookie over a real ``LedgerStorage``: each row is
checked and kept on its own exactly as a WRITE_LAC of it would be (unknown
ledger, wrong key refused; the highest LAC kept), its reply row says what
the bookie holds, and a long poll parked on a ledger of the message is
answered with the new LAC."""

from __future__ import annotations

import pytest

from appliance.bookie.handler import BookieHandler
from appliance.checks.digest import make_digest
from appliance.errors import OK, NoSuchLedgerError, UnauthorizedError
from appliance.protocol.entry import pack_entries
from appliance.protocol.keys import master_key
from ipc.frames import DEFAULT_LIMITS
from ipc.replies import ErrorReply, LacReply, WriteLacMultiReply, decode_reply, encode_reply
from ipc.requests import (
    WaitLacRequest,
    WriteLacMultiRequest,
    WriteLacRequest,
    decode_request,
    encode_request,
)
from tests.support.bookie_handler import handler_on_storage

KEY = master_key(b"pw")
OTHER_KEY = master_key(b"other")


class _Server:
    """What the handler needs of ``ipc.server.FrameServer`` here (long polls'
    timers are never fired)."""

    limits = DEFAULT_LIMITS

    class _Timer:
        def cancel(self) -> None:
            pass

    def __init__(self):
        self.sent: list = []

    def watch_fd(self, fd, callback) -> None:
        pass

    def send_reply(self, peer: bytes, reply) -> bool:
        self.sent.append((peer, reply))
        return True

    def call_later_ms(self, delay_ms: int, fn):
        return self._Timer()


@pytest.fixture
def handler(tmp_path):
    with handler_on_storage(tmp_path, _Server()) as h:
        yield h


def _store(h: BookieHandler, ledger_id: int, count: int, key: bytes = KEY) -> None:
    """``count`` entries of ``ledger_id`` (their headers carry LAC -1)."""
    records, _ = pack_entries(ledger_id, 0, -1, 0, [b"x" * 10] * count,
                              make_digest("crc32c", key))
    codes, ticket = h.core.add_batch(ledger_id, list(range(count)), records, key)
    assert codes == [OK] * count
    h.storage.wait_durable(ticket)


def _multi(h: BookieHandler, rows: list, request_id: int = 5) -> WriteLacMultiReply:
    """The request as a bookie receives it: through the codec both ways."""
    req = decode_request(encode_request(WriteLacMultiRequest(rows, request_id)))
    reply = h.handle(b"w", req)
    return decode_reply(encode_reply(reply))


def test_each_row_is_kept_or_refused_on_its_own(handler):
    for ledger_id in (1, 2):
        _store(handler, ledger_id, 3)
    _store(handler, 3, 1, OTHER_KEY)
    reply = _multi(handler, [(1, 2, KEY), (3, 0, KEY), (2, 1, KEY), (99, 0, KEY)])
    assert isinstance(reply, WriteLacMultiReply) and reply.request_id == 5
    assert reply.rows == [(1, 2, OK), (3, -1, UnauthorizedError.code), (2, 1, OK),
                          (99, -1, NoSuchLedgerError.code)]
    storage = handler.storage
    assert [storage.get_explicit_lac(n) for n in (1, 2, 3)] == [2, 1, -1]
    # a lower LAC is not kept: the bookie holds the highest it was told
    assert _multi(handler, [(1, 0, KEY), (2, 2, KEY)], 6).rows == [(1, 2, OK), (2, 2, OK)]
    assert [storage.get_explicit_lac(n) for n in (1, 2)] == [2, 2]


def test_a_row_means_what_a_write_lac_of_it_means(handler):
    _store(handler, 1, 4)
    _store(handler, 2, 4, OTHER_KEY)
    single = [handler.handle(b"w", WriteLacRequest(n, 3, KEY, request_id=n)) for n in (1, 2, 9)]
    assert isinstance(single[0], LacReply) and single[0].lac == 3
    assert [r.status for r in single[1:]] == [UnauthorizedError.code, NoSuchLedgerError.code]
    assert all(isinstance(r, ErrorReply) for r in single[1:])
    rows = _multi(handler, [(1, 3, KEY), (2, 3, KEY), (9, 3, KEY)]).rows
    assert [status for _, _, status in rows] == [OK] + [r.status for r in single[1:]]


def test_a_parked_long_poll_is_answered_with_the_new_lac(handler):
    _store(handler, 1, 5)
    _store(handler, 2, 2)
    assert handler.core.lac(1) == -1  # no explicit LAC yet, nor one in the headers
    assert handler.handle(b"reader", WaitLacRequest(1, -1, 60_000, request_id=77,
                                                    master_key=KEY)) is None
    assert handler.server.sent == []
    _multi(handler, [(2, 1, KEY), (1, 4, KEY)])
    ((peer, answer),) = handler.server.sent
    assert peer == b"reader" and isinstance(answer, LacReply)
    assert (answer.request_id, answer.lac) == (77, 4)
