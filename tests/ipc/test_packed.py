"""ADD_PACKED / READ_PACKED / ADD_MULTI codecs: round trips through both
table paths (struct for a few rows, numpy for many) and refusals of
malformed input."""

import os
import struct

import pytest

from appliance.errors import BadRequestError
from ipc.frames import REQUEST_HEAD, VERSION, Op, WireLimits
from ipc.packed import (
    MULTI_EXT,
    MULTI_GROUP_ROW,
    SMALL_ROWS,
    AddMultiReply,
    AddMultiRequest,
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


def _multi(counts, key=KEY, recovery=False):
    groups = [(1000 + g, bytes([g]) * 32 if key is None else key, n) for g, n in enumerate(counts)]
    ids = [7 * g + i for g, n in enumerate(counts) for i in range(n)]
    datas = [os.urandom((i * 13) % 70) for i in range(len(ids))]
    return AddMultiRequest(groups, ids, [len(d) for d in datas], b"".join(datas), recovery), datas


@pytest.mark.parametrize("counts", [[1], [1, 1], [3, 1, 2], [1] * 40, [2] * 200])
def test_add_multi_round_trip(counts):
    req, datas = _multi(counts, key=None, recovery=True)
    req.request_id = 91
    frames = encode_request(req)
    assert len(frames) == 4  # header, groups, table, one data frame whatever the count
    got = decode_request(_wire(frames))
    assert (got.groups, got.entry_ids, got.lengths, got.recovery, got.request_id) == \
        (req.groups, req.entry_ids, req.lengths, True, 91)
    pos = 0
    for (ledger, key, ids, views), (g_ledger, g_key, n) in zip(got.group_entries(), req.groups,
                                                             strict=True):
        assert (ledger, key, list(ids)) == (g_ledger, g_key, req.entry_ids[pos:pos + n])
        assert [bytes(v) for v in views] == datas[pos:pos + n]
        pos += n
    reply = AddMultiReply(req.entry_ids, [i % 4 for i in range(len(req.entry_ids))], 91)
    back = decode_reply(_wire(encode_reply(reply)))
    assert (back.entry_ids, back.statuses, back.request_id) == (reply.entry_ids, reply.statuses,
                                                                 91)


def _multi_frames(count=2, groups=((5, 2),), table=None, data=b"abcd", flags=0, ngroups=None):
    head = REQUEST_HEAD.pack(VERSION, Op.ADD_MULTI, flags, 1, 0, -1) + \
        MULTI_EXT.pack(count, len(groups) if ngroups is None else ngroups)
    rows = b"".join(MULTI_GROUP_ROW.pack(ledger, n, KEY) for ledger, n in groups)
    if table is None:
        table = b"".join(struct.pack(">qI", i, 2) for i in range(count))
    return [head, rows, table, data]


@pytest.mark.parametrize(("frames", "message"), [
    (_multi_frames()[:3], "frames"),
    (_multi_frames(count=0, groups=(), table=b"", data=b""), "count 0"),
    (_multi_frames(ngroups=0), "group count 0"),
    (_multi_frames(ngroups=3, groups=((5, 1), (6, 1), (7, 0))), "group count 3 not in 1..2"),
    (_multi_frames(ngroups=2), "groups table"),
    (_multi_frames(groups=((5, 1),)), "groups hold 1 entries; the header says 2"),
    (_multi_frames(groups=((5, 2), (6, 0))), "with 0 entries"),
    (_multi_frames(groups=((2**63, 2),)), "ledger id"),
    (_multi_frames(table=b"\0" * 11), "table"),
    (_multi_frames(data=b"abc"), "data frame is 3 bytes"),
    (_multi_frames(table=struct.pack(">qI", -1, 2) + struct.pack(">qI", 1, 2)), "below 0"),
    (_multi_frames(flags=0x2), "flags"),
])
def test_malformed_add_multi_is_a_bad_request(frames, message):
    with pytest.raises(BadRequestError, match=message):
        decode_request(frames)


def test_add_multi_encoder_names_the_bad_field():
    req, _ = _multi([2, 1])
    for change, message in [(lambda r: setattr(r, "groups", [(1, KEY, 2)]), "groups count 2"),
                            (lambda r: setattr(r, "groups", [(1, KEY[:5], 3)]), "master key"),
                            (lambda r: setattr(r, "groups", [(-1, KEY, 3)]), "ledger id"),
                            (lambda r: setattr(r, "groups", [(1, KEY, 0), (2, KEY, 3)]),
                             "entry count"),
                            (lambda r: setattr(r, "data", b"x"), "data is 1 bytes")]:
        bad, _ = _multi([2, 1])
        change(bad)
        with pytest.raises(ValueError, match=message):
            encode_request(bad)
    limits = WireLimits(batch_entries_max=2)
    with pytest.raises(ValueError, match="1..2 entries"):
        encode_request(req, limits)
    with pytest.raises(BadRequestError, match="batch_entries_max|not in 1..2"):
        decode_request(_wire(encode_request(req)), limits)
