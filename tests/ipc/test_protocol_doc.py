"""ipc/PROTOCOL.md stays true: op codes, status codes, sizes and the example
bytes in it are checked against the codec."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from appliance.errors import LedgerFencedError, UnauthorizedError, all_errors
from ipc.frames import (
    ADD_ROW,
    ADD_STATUS_ROW,
    LAC_ROW,
    LAC_STATUS_ROW,
    READ_STATUS_ROW,
    REPLY_HEAD,
    REQUEST_HEAD,
    Op,
)
from ipc.replies import AddReply, ErrorReply, WriteCloseReply, encode_reply
from ipc.requests import AddRequest, WriteCloseRequest, encode_request

DOC = (Path(__file__).resolve().parents[2] / "ipc" / "PROTOCOL.md").read_text()


@pytest.mark.parametrize("op", [op for op in Op if op is not Op.ERROR], ids=lambda o: o.name)
def test_every_op_is_in_the_request_table(op):
    assert re.search(rf"^\| {int(op)} \| {op.name} \|", DOC, re.M), op.name


def test_every_status_code_is_in_the_table_with_its_retryability():
    for code, cls in all_errors().items():
        row = re.search(rf"^\| {code} \| {cls.__name__} \|.*\| (yes|no) \|$", DOC, re.M)
        assert row, f"code {code} ({cls.__name__}) missing from PROTOCOL.md"
        assert (row.group(1) == "yes") == cls.retryable, cls.__name__


def test_sizes_in_the_text_match_the_layouts():
    assert f"Request header (frame 0), {REQUEST_HEAD.size} bytes" in DOC
    assert f"Reply header (frame 0), {REPLY_HEAD.size} bytes" in DOC
    assert f"rows of {ADD_ROW.size} bytes" in DOC
    assert f"rows of {ADD_STATUS_ROW.size} bytes" in DOC
    assert f"rows of {READ_STATUS_ROW.size} bytes" in DOC
    assert f"`table`: `count` rows of {LAC_ROW.size} bytes, `u64\n  ledger id, i64 LAC" in DOC
    assert f"`count` rows of {LAC_STATUS_ROW.size} bytes, one per request row in order: " \
           "`u64 ledger id, i64 lac, i32 status`" in DOC


def _hex_blocks() -> list[bytes]:
    blocks = re.findall(r"```\n(.*?)```", DOC, re.S)
    out = []
    for block in blocks:
        lines = [re.sub(r"^frame \d \(\d+ bytes\):\s*", "", line) for line in block.splitlines()]
        out.append(bytes.fromhex(" ".join(lines)))
    return out


def test_the_example_bytes_are_what_the_codec_produces():
    request, ok_reply, fenced_reply = _hex_blocks()[:3]
    frames = encode_request(AddRequest(7, 3, bytes(range(32)), b"hello", request_id=42))
    assert request == bytes(frames[0]) + bytes(frames[1])
    assert ok_reply == encode_reply(AddReply(7, 3, 42))[0]
    fenced = ErrorReply(Op.ADD, 42, LedgerFencedError.code, 7, 3)
    assert fenced_reply == encode_reply(fenced)[0]


def test_the_compact_example_is_what_the_codec_produces():
    from ipc.requests import CompactRequest

    shown = re.search(r"Request header of a major run, request id 5:\s*`([0-9a-f ]+)`", DOC)
    assert shown, "COMPACT example missing"
    assert bytes.fromhex(shown.group(1)) == bytes(
        encode_request(CompactRequest(major=True, request_id=5))[0])


def test_the_write_close_example_bytes_are_what_the_codec_produces():
    request, ok_reply, refused = _hex_blocks()[3:6]
    assert request == encode_request(WriteCloseRequest(7, bytes(range(32)), request_id=43))[0]
    assert ok_reply == encode_reply(WriteCloseReply(7, 43))[0]
    unauthorized = ErrorReply(Op.WRITE_CLOSE, 43, UnauthorizedError.code, 7, -1)
    assert refused == encode_reply(unauthorized)[0]


def test_the_keyed_read_example_bytes_are_what_the_codec_produces():
    from ipc.requests import ReadRequest

    request, refused = _hex_blocks()[6:8]
    assert request == encode_request(ReadRequest(7, 3, master_key=bytes(range(32)),
                                                 request_id=44))[0]
    assert refused == encode_reply(ErrorReply(Op.READ, 44, UnauthorizedError.code, 7, 3))[0]
