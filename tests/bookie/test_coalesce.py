"""Small ADD_PACKED requests and the ADD_MULTI requests of one drain are
stored together (``BookieHandler`` holds them until ``after_drain``): each
request (each ledger group of an ADD_MULTI) still
gets exactly the codes it would get alone, no reply leaves before the block
holding it is durable, a request of another kind is answered after the adds
that came before it, and a failed store answers every held request."""

from __future__ import annotations

import pytest

from appliance.bookie.handler import BookieHandler
from appliance.checks.digest import make_digest
from appliance.errors import (
    OK,
    BadRequestError,
    BookieIOError,
    LedgerFencedError,
    UnauthorizedError,
)
from appliance.protocol.entry import pack_entries
from appliance.protocol.keys import master_key
from appliance.protocol.limits import BOOKIE_COALESCE_ENTRIES_MAX as COALESCE_ENTRIES_MAX
from ipc.frames import DEFAULT_LIMITS
from ipc.packed import AddMultiReply, AddMultiRequest, AddPackedReply, AddPackedRequest
from ipc.replies import ErrorReply, ReadReply
from ipc.requests import ReadRequest
from tests.support.bookie_handler import handler_on_storage

KEY = master_key(b"pw")
OTHER_KEY = master_key(b"other")


class _Server:
    """What the handler needs of ``ipc.server.FrameServer`` here."""

    limits = DEFAULT_LIMITS

    def __init__(self):
        self.sent: list = []
        self.fds: dict = {}

    def watch_fd(self, fd, callback) -> None:
        self.fds[fd] = callback

    def send_reply(self, peer: bytes, reply) -> bool:
        self.sent.append((peer, reply))
        return True


@pytest.fixture
def handler(tmp_path):
    with handler_on_storage(tmp_path, _Server()) as h:
        yield h


def _add(ledger_id: int, first: int, n: int, key: bytes = KEY, request_id: int = 0,
         bad: int | None = None) -> AddPackedRequest:
    records, _ = pack_entries(ledger_id, first, first - 1, 0,
                              [bytes([i % 251]) * 100 for i in range(n)],
                              make_digest("crc32c", key))
    if bad is not None:  # a record filed under another entry id
        records[bad] = pack_entries(ledger_id, first + n + 5, 0, 0, [b"x"],
                                    make_digest("crc32c", key))[0][0]
    req = AddPackedRequest.of(ledger_id, key, range(first, first + n), records)
    req.request_id = request_id
    return req


def _settle(h: BookieHandler) -> dict:
    """Wait until every parked reply is durable and sent; replies by request id."""
    h.storage.wait_durable(h.storage._journal_seq, 30)
    h._on_durable()
    return {reply.request_id: reply for _, reply in h.server.sent}


def test_held_adds_get_their_own_codes_and_one_block(handler):
    h = handler
    h.handle(b"p", _add(3, 0, 1, OTHER_KEY, request_id=90))  # ledger 3 is OTHER_KEY's
    h.after_drain()
    _settle(h)
    h.core.storage.fence(4)  # ledger 4: fenced, no key yet
    batches = h.storage.stats()["add_batches"]
    reqs = [_add(1, 0, 5, request_id=1), _add(2, 0, 3, request_id=2),
            _add(1, 5, 4, request_id=3, bad=2), _add(3, 1, 2, KEY, request_id=4),
            _add(4, 0, 2, request_id=5)]
    for req in reqs:
        assert h.handle(b"p", req) is None
    assert len(h.server.sent) == 1  # the first drain's reply only: nothing before durable
    h.after_drain()
    replies = _settle(h)
    assert h.storage.stats()["add_batches"] == batches + 1  # one block for every good entry
    want = {1: [OK] * 5, 2: [OK] * 3, 3: [OK, OK, BadRequestError.code, OK],
            4: [UnauthorizedError.code] * 2, 5: [LedgerFencedError.code] * 2}
    for rid, codes in want.items():
        assert isinstance(replies[rid], AddPackedReply)
        assert list(replies[rid].statuses) == codes, rid
    assert h.storage.last_entry_id(1) == 8 and h.storage.last_entry_id(2) == 2


def test_a_read_after_held_adds_sees_them(handler):
    h = handler
    h.handle(b"p", _add(1, 0, 3, request_id=1))
    reply = h.handle(b"p", ReadRequest(1, 2, master_key=KEY, request_id=2))
    assert isinstance(reply, ReadReply)  # the held add was stored first
    replies = _settle(h)
    assert list(replies[1].statuses) == [OK] * 3


def test_big_and_recovery_adds_are_not_held(handler):
    h = handler
    h.handle(b"p", _add(1, 0, 2, request_id=1))
    h.handle(b"p", _add(1, 2, COALESCE_ENTRIES_MAX, request_id=2))
    assert h._held_adds == []  # the held add was stored first, the big one at once
    recovery = _add(2, 0, 1, request_id=3)
    recovery.recovery = True
    h.handle(b"p", recovery)
    assert h._held_adds == []
    replies = _settle(h)
    assert list(replies[1].statuses) == [OK] * 2
    assert list(replies[2].statuses) == [OK] * COALESCE_ENTRIES_MAX
    assert list(replies[3].statuses) == [OK]
    assert h.storage.last_entry_id(1) == 1 + COALESCE_ENTRIES_MAX


def test_a_failed_store_answers_every_held_add(handler, monkeypatch):
    h = handler

    def broken(*args):
        raise BookieIOError("disk on fire")

    monkeypatch.setattr(h.storage, "add_entries", broken)
    for rid in (1, 2, 3):
        h.handle(b"p", _add(rid, 0, 2, request_id=rid))
    h.after_drain()
    replies = {reply.request_id: reply for _, reply in h.server.sent}
    assert sorted(replies) == [1, 2, 3]
    assert all(isinstance(r, ErrorReply) and r.status == BookieIOError.code
               for r in replies.values())


def _multi(parts, request_id: int = 0, recovery: bool = False) -> AddMultiRequest:
    """One ADD_MULTI of ``_add`` requests' parts (ledger, first, n, key, bad)."""
    groups, ids, records = [], [], []
    for ledger_id, first, n, key, bad in parts:
        one = _add(ledger_id, first, n, key, bad=bad)
        groups.append((ledger_id, key, n))
        ids += list(one.entry_ids)
        records += [bytes(r) for r in one.entries()]
    return AddMultiRequest(groups, ids, [len(r) for r in records], b"".join(records), recovery,
                           request_id)


def test_add_multi_groups_get_their_own_codes_in_one_block_with_held_adds(handler):
    h = handler
    h.handle(b"p", _add(3, 0, 1, OTHER_KEY, request_id=90))  # ledger 3 is OTHER_KEY's
    h.after_drain()
    _settle(h)
    h.core.storage.fence(4)
    batches = h.storage.stats()["add_batches"]
    assert h.handle(b"p", _add(1, 0, 2, request_id=1)) is None
    multi = _multi([(1, 2, 3, KEY, 1), (2, 0, 2, KEY, None), (3, 1, 1, KEY, None),
                    (4, 0, 1, KEY, None), (5, 0, 1, KEY, None)], request_id=2)
    assert h.handle(b"p", multi) is None  # held with the ADD_PACKED before it
    h.after_drain()
    replies = _settle(h)
    assert h.storage.stats()["add_batches"] == batches + 1  # one block for both messages
    assert isinstance(replies[1], AddPackedReply) and list(replies[1].statuses) == [OK] * 2
    assert isinstance(replies[2], AddMultiReply)
    assert list(replies[2].entry_ids) == [2, 3, 4, 0, 1, 1, 0, 0]
    assert list(replies[2].statuses) == [OK, BadRequestError.code, OK, OK, OK,
                                         UnauthorizedError.code, LedgerFencedError.code, OK]
    assert h.storage.last_entry_id(1) == 4 and h.storage.last_entry_id(5) == 0
    read = h.handle(b"p", ReadRequest(2, 1, master_key=KEY, request_id=3))
    assert isinstance(read, ReadReply) and bytes(read.data) == bytes(_add(2, 0, 2).entries()[1])


def test_a_lone_or_recovery_add_multi_is_answered_alone(handler):
    h = handler
    h.handle(b"p", _multi([(1, 0, 2, KEY, None), (2, 0, 1, KEY, None)], request_id=1))
    h.after_drain()
    h.core.storage.fence(1)
    recovery = _multi([(1, 2, 1, KEY, None), (3, 0, 1, OTHER_KEY, None)], request_id=2,
                      recovery=True)
    h.handle(b"p", recovery)  # not held: a fenced ledger takes recovery adds
    assert h._held_adds == []
    replies = _settle(h)
    assert list(replies[1].statuses) == [OK] * 3
    assert list(replies[2].statuses) == [OK, OK]
    assert h.storage.last_entry_id(1) == 2 and h.storage.last_entry_id(3) == 0
