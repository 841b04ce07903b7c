"""Codec: every op round-trips; every class of malformed input is refused with
the right error (never another exception); encoders name the bad field."""

from __future__ import annotations

import random
import struct

import pytest

from appliance.errors import (
    BadRequestError,
    LedgerFencedError,
    NoSuchEntryError,
    ProtocolVersionError,
    TooManyRequestsError,
    UnauthorizedError,
)
from ipc.frames import (
    ADD_ROW,
    DEFAULT_LIMITS,
    FLAG_FENCE,
    FLAG_KEY,
    FLAG_RECOVERY,
    LAC_ROW,
    REPLY_HEAD,
    REQUEST_HEAD,
    VERSION,
    Op,
    WireLimits,
    salvage_ids,
)
from ipc.replies import (
    AddBatchReply,
    AddReply,
    CompactReply,
    ErrorReply,
    InfoReply,
    LacReply,
    PingReply,
    ReadBatchReply,
    ReadReply,
    WriteCloseReply,
    WriteLacMultiReply,
    decode_reply,
    encode_reply,
    error_reply,
)
from ipc.requests import (
    AddBatchRequest,
    AddItem,
    AddRequest,
    CompactRequest,
    InfoRequest,
    PingRequest,
    ReadBatchRequest,
    ReadLacRequest,
    ReadRequest,
    WaitLacRequest,
    WriteCloseRequest,
    WriteLacMultiRequest,
    WriteLacRequest,
    decode_request,
    encode_request,
)

KEY = bytes(range(32))
KEY2 = bytes(range(100, 132))

REQUESTS = [
    PingRequest(request_id=1),
    InfoRequest(request_id=2),
    CompactRequest(request_id=20),
    CompactRequest(major=True, request_id=21),
    CompactRequest(suspend=True, request_id=22),
    CompactRequest(resume=True, request_id=23),
    AddRequest(7, 0, KEY, b"entry-0", request_id=3),
    AddRequest(2**63 - 1, 2**63 - 1, KEY, b"", recovery=True, request_id=2**64 - 1),
    ReadRequest(7, 5, request_id=4),
    ReadRequest(7, 5, fence=True, master_key=KEY, request_id=5),
    ReadLacRequest(7, request_id=6),
    ReadLacRequest(7, fence=True, master_key=KEY, request_id=7),
    WaitLacRequest(7, -1, 1500, request_id=8),
    WaitLacRequest(7, 41, 0, request_id=9),
    WriteLacRequest(7, 41, KEY, request_id=10),
    WriteLacRequest(7, -1, KEY, request_id=11),
    WriteLacMultiRequest([(7, 41, KEY), (8, -1, KEY2), (7, 42, KEY)], request_id=19),
    WriteLacMultiRequest([(2**63 - 1, 2**63 - 1, KEY)], request_id=2**64 - 1),
    WriteCloseRequest(7, KEY, request_id=14),
    WriteCloseRequest(2**63 - 1, KEY2, request_id=2**64 - 1),
    AddBatchRequest([AddItem(7, 1, KEY, b"a"), AddItem(8, 0, KEY2, b"bb" * 100),
                     AddItem(7, 2, KEY, b"")], request_id=10),
    AddBatchRequest([AddItem(9, 3, KEY, b"r")], recovery=True, request_id=11),
    ReadBatchRequest(7, 0, 99, 64, 1 << 20, request_id=12),
    ReadBatchRequest(7, 10, 10, 1, 1, fence=True, master_key=KEY, request_id=13),
    # plain reads carrying the key (FLAG_KEY): what every reader sends
    ReadRequest(7, 5, master_key=KEY2, request_id=15),
    ReadLacRequest(7, master_key=KEY, request_id=16),
    WaitLacRequest(7, 41, 1500, request_id=17, master_key=KEY),
    ReadBatchRequest(7, 0, 99, 64, 1 << 20, master_key=KEY2, request_id=18),
]

REPLIES = [
    PingReply(1),
    InfoReply({"bookie_id": "b1", "counters": {"bad_messages": 3}}, 2),
    CompactReply({"ticket": 3, "compaction": {"running": True}}, 20),
    AddReply(7, 0, 3),
    ReadReply(7, 5, b"entry-5", 4),
    LacReply(7, 4, 5, b"entry-5", 6, Op.READ_LAC),
    LacReply(7, -1, -1, None, 7, Op.READ_LAC),
    LacReply(7, 42, 42, None, 8, Op.WAIT_LAC),
    LacReply(7, 41, -1, None, 9, Op.WRITE_LAC),
    WriteLacMultiReply([(7, 41, 0), (8, -1, UnauthorizedError.code), (9, -1, 2)], 19),
    WriteCloseReply(7, 14),
    ErrorReply(Op.WRITE_CLOSE, 15, 7, 7, -1, "ledger 7: master key mismatch"),
    AddBatchReply([(7, 1, 0), (8, 0, LedgerFencedError.code), (7, 2, 0)], 10),
    ReadBatchReply(7, [(0, 0, b"e0"), (1, 0, b""), (2, NoSuchEntryError.code, None)], 12),
    ReadBatchReply(7, [], 13),
    ErrorReply(Op.ADD, 14, LedgerFencedError.code, 7, 3, "ledger 7 is fenced"),
    ErrorReply(Op.ERROR, 0, BadRequestError.code),
]


@pytest.mark.parametrize("request_", REQUESTS, ids=lambda r: type(r).__name__)
def test_every_request_round_trips(request_):
    frames = encode_request(request_)
    assert frames[0][0] == VERSION and frames[0][1] == request_.OP
    assert decode_request(frames) == request_


@pytest.mark.parametrize("reply", REPLIES, ids=lambda r: type(r).__name__)
def test_every_reply_round_trips(reply):
    assert decode_reply(encode_reply(reply)) == reply


def test_entry_data_travels_as_its_own_frame_without_copy():
    data = bytearray(b"x" * 1000)
    frames = encode_request(AddRequest(1, 0, KEY, data))
    assert frames[1] is data  # encoder passes the caller's buffer through
    decoded = decode_request(frames)
    assert isinstance(decoded.data, memoryview) and decoded.data.obj is data


def test_headers_are_fixed_size_network_order():
    frames = encode_request(ReadRequest(0x0102030405060708, 9, request_id=0x1122))
    assert len(frames[0]) == REQUEST_HEAD.size == 28
    assert frames[0][4:12] == (0x1122).to_bytes(8, "big")
    assert frames[0][12:20] == bytes(range(1, 9))
    assert len(encode_reply(AddReply(1, 2, 3))[0]) == REPLY_HEAD.size == 32


def test_error_reply_builds_from_request_and_exception():
    reply = error_reply(AddRequest(7, 3, KEY, b"x", request_id=9), LedgerFencedError())
    assert (reply.op, reply.request_id, reply.status, reply.ledger_id, reply.entry_id) == (
        Op.ADD, 9, LedgerFencedError.code, 7, 3)
    assert isinstance(decode_reply(encode_reply(reply)).error(), LedgerFencedError)


# -- malformed requests ----------------------------------------------------------
def _head(op, flags=0, ledger=1, entry=0, version=VERSION, rid=5) -> bytes:
    return struct.pack("!BBHQQq", version, op, flags, rid, ledger, entry)


def test_every_truncation_of_every_request_is_a_bad_request():
    for request_ in REQUESTS:
        frames = encode_request(request_)
        head = bytes(frames[0])
        for cut in range(len(head)):
            with pytest.raises(BadRequestError):
                decode_request([head[:cut], *frames[1:]])
        if len(frames) > 1:  # a message cut after any frame
            for keep in range(1, len(frames)):
                with pytest.raises(BadRequestError):
                    decode_request(frames[:keep])


@pytest.mark.parametrize("frames, exc, words", [
    ([], BadRequestError, "empty message"),
    ([b""], BadRequestError, "empty header"),
    ([b"\x01\x03"], BadRequestError, "needs at least 28"),
    ([_head(Op.PING, version=2)], ProtocolVersionError, "version 2"),
    ([_head(Op.PING, version=0)], ProtocolVersionError, "version 0"),
    ([_head(0)], BadRequestError, "unknown op 0"),
    ([_head(200)], BadRequestError, "unknown op 200"),
    ([_head(Op.PING, flags=1)], BadRequestError, "flags"),
    ([_head(Op.COMPACT, flags=0x0030)], BadRequestError, "suspends or resumes, not both"),
    ([_head(Op.ADD, flags=FLAG_FENCE) + KEY, b"x"], BadRequestError, "flags"),
    ([_head(Op.PING), b"extra"], BadRequestError, "2 frames"),
    ([_head(Op.PING) + b"junk"], BadRequestError, "32 bytes"),
    ([_head(Op.ADD) + KEY], BadRequestError, "1 frames"),
    ([_head(Op.ADD) + KEY[:31], b"x"], BadRequestError, "master key"),
    ([_head(Op.ADD, entry=-1) + KEY, b"x"], BadRequestError, "entry id -1"),
    ([_head(Op.ADD, ledger=2**63) + KEY, b"x"], BadRequestError, "ledger id"),
    ([_head(Op.READ, flags=FLAG_FENCE)], BadRequestError, "master key"),
    ([_head(Op.READ, flags=FLAG_KEY)], BadRequestError, "master key"),
    ([_head(Op.READ, flags=FLAG_KEY) + KEY[:31]], BadRequestError, "master key"),
    ([_head(Op.READ) + KEY], BadRequestError, "60 bytes, expected 28"),
    ([_head(Op.READ_LAC, flags=FLAG_KEY) + KEY + b"x"], BadRequestError, "master key"),
    ([_head(Op.WAIT_LAC, flags=FLAG_KEY) + b"\0\0\0\1"], BadRequestError, "master key"),
    ([_head(Op.WAIT_LAC, flags=FLAG_FENCE) + b"\0\0\0\1" + KEY], BadRequestError, "flags"),
    ([_head(Op.READ_BATCH, flags=FLAG_KEY) + struct.pack("!qII", 4, 1, 1)], BadRequestError,
     "master key"),
    ([_head(Op.ADD, flags=FLAG_KEY) + KEY, b"x"], BadRequestError, "flags"),
    ([_head(Op.WRITE_LAC, flags=FLAG_KEY) + KEY], BadRequestError, "flags"),
    ([_head(Op.READ, entry=-5)], BadRequestError, "entry id -5"),
    ([_head(Op.WAIT_LAC, entry=-2) + b"\0\0\0\1"], BadRequestError, "entry id -2"),
    ([_head(Op.WAIT_LAC) + b"\0\0"], BadRequestError, "header"),
    ([_head(Op.READ_BATCH, entry=5) + struct.pack("!qII", 4, 1, 1)], BadRequestError,
     "before first"),
    ([_head(Op.READ_BATCH) + struct.pack("!qII", 4, 0, 1)], BadRequestError, ">= 1"),
    ([_head(Op.ADD_BATCH) + struct.pack("!I", 0), b""], BadRequestError, "count 0"),
    ([_head(Op.ADD_BATCH) + struct.pack("!I", 2), ADD_ROW.pack(1, 0, KEY), b"x"],
     BadRequestError, "3 frames"),
    ([_head(Op.ADD_BATCH) + struct.pack("!I", 2), ADD_ROW.pack(1, 0, KEY), b"x", b"y"],
     BadRequestError, "table"),
    ([_head(Op.ADD_BATCH) + struct.pack("!I", 1), ADD_ROW.pack(1, -3, KEY), b"x"],
     BadRequestError, "entry id -3"),
    ([_head(Op.WRITE_LAC_MULTI, entry=-1) + struct.pack("!I", 0), b""], BadRequestError,
     "count 0"),
    ([_head(Op.WRITE_LAC_MULTI, entry=-1) + struct.pack("!I", 2), LAC_ROW.pack(1, 0, KEY)],
     BadRequestError, "table"),
    ([_head(Op.WRITE_LAC_MULTI, entry=-1) + struct.pack("!I", 1), LAC_ROW.pack(1, -2, KEY)],
     BadRequestError, "entry id -2"),
    ([_head(Op.WRITE_LAC_MULTI, entry=-1) + struct.pack("!I", 1), LAC_ROW.pack(2**63, 0, KEY)],
     BadRequestError, "ledger id"),
    ([_head(Op.WRITE_LAC_MULTI, entry=-1) + struct.pack("!I", 1)], BadRequestError, "1 frames"),
    ([_head(Op.WRITE_LAC_MULTI, flags=FLAG_RECOVERY) + struct.pack("!I", 1),
      LAC_ROW.pack(1, 0, KEY)], BadRequestError, "flags"),
])
def test_malformed_request_classes(frames, exc, words):
    with pytest.raises(exc) as info:
        decode_request(frames)
    assert words in str(info.value)


def test_oversize_entries_batches_and_frame_counts_are_refused():
    limits = WireLimits(entry_bytes_max=100, batch_entries_max=4, batch_bytes_max=250)
    big = encode_request(AddRequest(1, 0, KEY, b"x" * 101), WireLimits())
    with pytest.raises(BadRequestError, match="entry_bytes_max"):
        decode_request(big, limits)
    items = [AddItem(1, i, KEY, b"x" * 90) for i in range(3)]
    batch = encode_request(AddBatchRequest(items), WireLimits())
    with pytest.raises(BadRequestError, match="batch_bytes_max"):
        decode_request(batch, limits)
    items = [AddItem(1, i, KEY, b"") for i in range(5)]
    with pytest.raises(BadRequestError, match="over the limit"):
        decode_request(encode_request(AddBatchRequest(items), WireLimits()), limits)
    head = _head(Op.ADD_BATCH) + struct.pack("!I", 5)
    with pytest.raises(BadRequestError, match="count 5"):
        decode_request([head, ADD_ROW.pack(1, 0, KEY) * 5, *([b""] * 3)], limits)


def test_random_mutations_only_ever_raise_bad_request():
    rng = random.Random(1234)
    samples = [encode_request(r) for r in REQUESTS]
    outcomes = {"ok": 0, "bad": 0}
    for _ in range(20000):
        frames = [bytearray(f) for f in rng.choice(samples)]
        i = rng.randrange(len(frames))
        if frames[i] and rng.random() < 0.7:
            frames[i][rng.randrange(len(frames[i]))] = rng.randrange(256)
        else:
            frames[i] = frames[i][: rng.randrange(len(frames[i]) + 1)]
        try:
            decode_request(frames)
            outcomes["ok"] += 1
        except BadRequestError:
            outcomes["bad"] += 1
    assert outcomes["bad"] > 1000 and outcomes["ok"] > 100  # both paths exercised


# -- malformed replies -------------------------------------------------------------
def test_every_truncation_of_every_reply_is_refused():
    for reply in REPLIES:
        frames = encode_reply(reply)
        head = bytes(frames[0])
        for cut in range(len(head)):
            with pytest.raises(BadRequestError):
                decode_reply([head[:cut], *frames[1:]])


@pytest.mark.parametrize("frames, words", [
    ([], "empty reply"),
    ([struct.pack("!BBHQQqi", 9, Op.ADD, 0, 1, 1, 1, 0)], "version 9"),
    ([struct.pack("!BBHQQqi", VERSION, Op.ERROR, 0, 1, 0, -1, 0)], "status OK"),
    ([struct.pack("!BBHQQqi", VERSION, Op.ADD, 0, 1, 0, -1, 10), b"m", b"extra"], "frames"),
    ([struct.pack("!BBHQQqi", VERSION, Op.INFO, 0, 1, 0, -1, 0), b"{not json"], "JSON"),
    ([struct.pack("!BBHQQqi", VERSION, Op.INFO, 0, 1, 0, -1, 0), b"[1]"], "JSON object"),
    ([struct.pack("!BBHQQqi", VERSION, Op.READ, 0, 1, 0, 0, 0)], "frames"),
    ([struct.pack("!BBHQQqiI", VERSION, Op.READ_BATCH, 0, 1, 0, 0, 0, 1), b"\0" * 12],
     "frames"),
    ([struct.pack("!BBHQQqiI", VERSION, Op.ADD_BATCH, 0, 1, 0, 0, 0, 2), b"\0" * 20],
     "status table"),
    ([struct.pack("!BBHQQqiI", VERSION, Op.WRITE_LAC_MULTI, 0, 1, 0, -1, 0, 2), b"\0" * 20],
     "status table"),
    ([struct.pack("!BBHQQqiI", VERSION, Op.WRITE_LAC_MULTI, 0, 1, 0, -1, 0, 1)], "frames"),
])
def test_malformed_reply_classes(frames, words):
    with pytest.raises(BadRequestError, match=words):
        decode_reply(frames)


def test_salvage_ids_reads_what_it_can():
    assert salvage_ids(b"") == (Op.ERROR, 0)
    assert salvage_ids(_head(Op.READ, rid=77)[:12]) == (Op.READ, 77)
    assert salvage_ids(_head(99, rid=77)) == (Op.ERROR, 77)


# -- encoders refuse bad arguments before anything is sent -----------------------------
@pytest.mark.parametrize("request_, exc, words", [
    (AddRequest(1, -1, KEY, b"x"), ValueError, "entry_id"),
    (AddRequest(1, 0, KEY[:5], b"x"), ValueError, "master_key"),
    (AddRequest(1, 0, KEY, "text"), TypeError, "data"),
    (AddRequest(-1, 0, KEY, b"x"), ValueError, "ledger_id"),
    (AddRequest(True, 0, KEY, b"x"), TypeError, "ledger_id"),
    (AddRequest(1, 0, KEY, b"x" * (DEFAULT_LIMITS.entry_bytes_max + 1)), ValueError,
     "entry_bytes_max"),
    (ReadRequest(1, 0, fence=True), ValueError, "master_key"),
    (ReadRequest(1, 0, master_key=b"short"), ValueError, "master_key"),
    (ReadLacRequest(1, master_key=KEY + b"x"), ValueError, "master_key"),
    (WaitLacRequest(1, 0, 10, master_key="text"), ValueError, "master_key"),
    (ReadBatchRequest(1, 0, 4, 1, 1, master_key=b""), ValueError, "master_key"),
    (WaitLacRequest(1, -2, 10), ValueError, "previous_lac"),
    (WriteLacRequest(1, -2, KEY), ValueError, "lac"),
    (WriteLacRequest(1, 3, b"short"), ValueError, "master_key"),
    (WriteLacMultiRequest([]), ValueError, "rows"),
    (WriteLacMultiRequest([(1, 3, KEY), (2, -2, KEY)]), ValueError, "rows[1].lac"),
    (WriteLacMultiRequest([(1, 3, KEY), (2, 0, b"short")]), ValueError, "rows[1].master_key"),
    (WriteLacMultiRequest([(-1, 3, KEY)]), ValueError, "rows[0].ledger_id"),
    (WriteLacMultiRequest([(1, 3, KEY)] * (DEFAULT_LIMITS.batch_entries_max + 1)), ValueError,
     "rows"),
    (WaitLacRequest(1, 0, 2**32), ValueError, "timeout_ms"),
    (AddBatchRequest([]), ValueError, "items"),
    (AddBatchRequest([AddItem(1, 0, KEY, b"x"), AddItem(1, 1, b"k", b"x")]), ValueError,
     "items[1].master_key"),
    (ReadBatchRequest(1, 5, 4, 1, 1), ValueError, "last_entry_id"),
    (ReadBatchRequest(1, 0, 4, 0, 1), ValueError, "max_entries"),
])
def test_encoder_names_the_bad_field(request_, exc, words):
    with pytest.raises(exc) as info:
        encode_request(request_)
    assert words in str(info.value)


def test_encoders_refuse_non_messages():
    with pytest.raises(TypeError):
        encode_request(object())
    with pytest.raises(ValueError):
        encode_reply(ErrorReply(Op.ADD, 1, 0))
    with pytest.raises(TypeError):
        encode_reply(TooManyRequestsError())


def test_write_close_refuses_malformed_frames_and_bad_keys():
    """BP-32's WRITE_CLOSE: exactly the header plus a 32-byte key, one frame,
    no flags; a key of another size is refused before anything is sent."""
    frames = encode_request(WriteCloseRequest(7, KEY, request_id=3))
    assert len(frames) == 1 and len(frames[0]) == REQUEST_HEAD.size + 32
    for bad in ([frames[0][:-1]], [frames[0] + b"x"], [frames[0], b"extra"],
                [frames[0][:2] + b"\x00\x02" + frames[0][4:]]):  # FENCE flag: not allowed
        with pytest.raises(BadRequestError):
            decode_request(bad)
    with pytest.raises(ValueError, match="master_key"):
        encode_request(WriteCloseRequest(7, b"short"))
    reply = encode_reply(WriteCloseReply(7, 3))
    assert len(reply) == 1 and len(reply[0]) == REPLY_HEAD.size
    with pytest.raises(BadRequestError):
        decode_reply([reply[0], b"extra"])


def test_a_read_key_follows_the_extension_with_the_key_flag_or_the_fence_flag():
    """FLAG_KEY: the 32-byte key right after the op's extension, where a
    fencing read puts it; a fencing read keeps sending FENCE alone (older
    bookies accept it), and FENCE | KEY from a peer means the same."""
    plain = encode_request(ReadRequest(7, 5, master_key=KEY, request_id=1))[0]
    assert struct.unpack_from("!H", plain, 2)[0] == FLAG_KEY
    assert len(plain) == REQUEST_HEAD.size + 32 and plain[REQUEST_HEAD.size:] == KEY
    fence = encode_request(ReadRequest(7, 5, fence=True, master_key=KEY, request_id=1))[0]
    assert struct.unpack_from("!H", fence, 2)[0] == FLAG_FENCE
    assert fence[REQUEST_HEAD.size:] == plain[REQUEST_HEAD.size:]
    both = decode_request([_head(Op.READ, flags=FLAG_FENCE | FLAG_KEY, entry=5) + KEY])
    assert (both.fence, both.master_key) == (True, KEY)
    batch = encode_request(ReadBatchRequest(7, 0, 9, 10, 100, master_key=KEY2))[0]
    assert batch[-32:] == KEY2 and len(batch) == REQUEST_HEAD.size + 16 + 32
    wait = encode_request(WaitLacRequest(7, 3, 250, master_key=KEY))[0]
    assert struct.unpack_from("!I", wait, REQUEST_HEAD.size)[0] == 250 and wait[-32:] == KEY
    assert len(encode_request(ReadRequest(7, 5))[0]) == REQUEST_HEAD.size  # no key: none sent
