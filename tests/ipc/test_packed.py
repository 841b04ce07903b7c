"""ADD_PACKED / READ_PACKED codecs: round trips through both table paths
(struct for a few rows, numpy for many) and refusals of malformed input."""

import os
import struct

import pytest

from appliance.errors import BadRequestError
from ipc.frames import REQUEST_HEAD, VERSION, Op, WireLimits
from ipc.packed import (
    SMALL_ROWS,
    AddPackedReply,
    AddPackedRequest,
    ReadPackedReply,
    ReadPackedRequest,
)
from ipc.replies import decode_reply, encode_reply
from ipc.requests import decode_request, encode_request

KEY = bytes(range(32))


def _wire(frames):
    return [bytes(f) for f in frames]


@pytest.mark.parametrize("count", [1, SMALL_ROWS - 1, SMALL_ROWS, 300])
def test_add_packed_round_trip(count):
    datas = [os.urandom(i % 50) for i in range(count)]
    ids = [5 + 2 * i for i in range(count)]
    req = AddPackedRequest.of(9, KEY, ids, datas, recovery=True)
    req.request_id = 77
    frames = encode_request(req)
    assert len(frames) == 3  # header, table, one data frame whatever the count
    got = decode_request(_wire(frames))
    assert (got.ledger_id, got.entry_ids, got.master_key, got.recovery, got.request_id) == \
        (9, ids, KEY, True, 77)
    assert [bytes(e) for e in got.entries()] == datas
    reply = AddPackedReply(9, ids, [i % 3 for i in range(count)], 77)
    back = decode_reply(_wire(encode_reply(reply)))
    assert (back.entry_ids, back.statuses, back.request_id) == (ids, reply.statuses, 77)


@pytest.mark.parametrize("count", [0, 2, 100])
def test_read_packed_round_trip(count):
    rows = [(10 + i, 0, os.urandom(i)) for i in range(count)]
    if count:
        rows[-1] = (rows[-1][0], 3, None)  # a non-OK last row carries no bytes
    back = decode_reply(_wire(encode_reply(ReadPackedReply.from_rows(4, rows, 5))))
    assert back.entry_ids == [r[0] for r in rows] and back.statuses == [r[1] for r in rows]
    assert [bytes(e) for e in back.entries()] == [r[2] or b"" for r in rows]
    for req in (ReadPackedRequest(4, 10, 20, 11, 1 << 20, True, KEY, 6),
                ReadPackedRequest(4, 10, 20, 11, 1 << 20, master_key=KEY, request_id=7),
                ReadPackedRequest(4, 10, 20, 11, 1 << 20, request_id=8)):
        assert decode_request(_wire(encode_request(req))) == req
    head = bytes(encode_request(ReadPackedRequest(4, 10, 20, 11, 1 << 20, master_key=KEY))[0])
    for bad in (head[:-1], head + b"x", head[:2] + b"\x00\x00" + head[4:]):
        with pytest.raises(BadRequestError, match="header"):
            decode_request([bad])


def _add_frames(count=2, table=None, data=b"abcd", key=KEY, flags=0):
    head = REQUEST_HEAD.pack(VERSION, Op.ADD_PACKED, flags, 1, 3, 0) + struct.pack("!I", count)
    if table is None:
        table = b"".join(struct.pack(">qI", i, 2) for i in range(count))
    return [head + key, table, data]


@pytest.mark.parametrize(("frames", "message"), [
    (_add_frames()[:2], "frames"),
    (_add_frames(count=0, table=b"", data=b""), "count 0"),
    (_add_frames(table=b"\0" * 11), "table"),
    (_add_frames(data=b"abc"), "data frame is 3 bytes"),
    (_add_frames(table=struct.pack(">qI", -1, 2) + struct.pack(">qI", 1, 2)), "below 0"),
    (_add_frames(key=KEY[:31]), "header"),
    (_add_frames(flags=0x2), "flags"),
])
def test_malformed_add_packed_is_a_bad_request(frames, message):
    with pytest.raises(BadRequestError, match=message):
        decode_request(frames)


def test_limits_are_enforced_both_ways():
    limits = WireLimits(entry_bytes_max=10, batch_entries_max=4)
    with pytest.raises(ValueError):
        encode_request(AddPackedRequest.of(1, KEY, [0], [b"x" * 11]), limits)
    with pytest.raises(ValueError):
        encode_request(AddPackedRequest.of(1, KEY, range(5), [b"x"] * 5), limits)
    with pytest.raises(BadRequestError, match="entry_bytes_max"):
        decode_request(_wire(encode_request(AddPackedRequest.of(1, KEY, [0], [b"x" * 11]))),
                       limits)
    with pytest.raises(BadRequestError, match="batch_entries_max"):
        decode_request(_add_frames(count=5, data=b"x" * 10), limits)
