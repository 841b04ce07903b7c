"""Replies (bookie -> client): one class per op, ``encode_reply`` and ``decode_reply``.

Every reply header carries a status: 0 (OK) or an ``appliance.protocol.errors`` code.
A non-OK reply has the same shape for every op (``ErrorReply``: the 32-byte
header and, optionally, one UTF-8 message frame for humans; programs act on
the code only).  OK replies carry the op's fixed extension and frames.

Guarantees: ``decode_reply`` raises only ``BadRequestError`` (or
``ProtocolVersionError``) for malformed input, so a client treats a garbled
reply as an "unknown" response (BP-46), never as a crash.  Entry bytes come
back as ``memoryview``s over the received frames.  Layouts: ``ipc/PROTOCOL.md``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from appliance.protocol.errors import OK, BadRequestError, BKError, code_of, error_for_code
from ipc.frames import (
    ADD_STATUS_ROW,
    DEFAULT_LIMITS,
    I64,
    LAC_STATUS_ROW,
    READ_STATUS_ROW,
    REPLY_HEAD,
    U32,
    VERSION,
    Op,
    WireLimits,
    check_entry_bytes,
    check_frame_count,
    check_size,
    read_head,
)
from ipc.packed import (
    AddMultiReply,
    AddPackedReply,
    ReadPackedReply,
    dec_add_multi_reply,
    dec_add_packed_reply,
    dec_read_packed_reply,
    enc_add_multi_reply,
    enc_add_packed_reply,
    enc_read_packed_reply,
)

Buffer = bytes | bytearray | memoryview


@dataclass(slots=True)
class ErrorReply:
    """Any op failed as a whole: ``status`` is the error code."""

    op: int
    request_id: int
    status: int
    ledger_id: int = 0
    entry_id: int = -1
    message: str = ""

    def error(self) -> BKError:
        return error_for_code(self.status, self.message or None)


@dataclass(slots=True)
class PingReply:
    request_id: int = 0
    OP = Op.PING
    status = OK


@dataclass(slots=True)
class InfoReply:
    """Bookie id, instance id, version, counters: a JSON object."""

    info: dict
    request_id: int = 0
    OP = Op.INFO
    status = OK


@dataclass(slots=True)
class CompactReply:
    """COMPACT accepted: ``info`` holds ``ticket`` (the run is done once the
    INFO document's ``storage.compaction.requests_done`` reaches it) and the
    compaction status as of now."""

    info: dict
    request_id: int = 0
    OP = Op.COMPACT
    status = OK


@dataclass(slots=True)
class AddReply:
    ledger_id: int
    entry_id: int
    request_id: int = 0
    OP = Op.ADD
    status = OK


@dataclass(slots=True)
class ReadReply:
    ledger_id: int
    entry_id: int
    data: Buffer
    request_id: int = 0
    OP = Op.READ
    status = OK


@dataclass(slots=True)
class LacReply:
    """READ_LAC / WAIT_LAC / WRITE_LAC answer: the LAC the bookie knows (-1 =
    none; for WRITE_LAC the highest explicit LAC it was told), its last stored
    entry id (-1 = none) and, optionally, that entry's bytes."""

    ledger_id: int
    lac: int
    last_entry_id: int = -1
    last_entry: Buffer | None = None
    request_id: int = 0
    op: int = Op.READ_LAC
    status = OK


@dataclass(slots=True)
class AddBatchReply:
    """One (ledger id, entry id, status) row per entry of the request, in order."""

    rows: list[tuple[int, int, int]] = field(default_factory=list)
    request_id: int = 0
    OP = Op.ADD_BATCH
    status = OK


@dataclass(slots=True)
class ReadBatchReply:
    """Rows (entry id, status, data or None) in entry order from the first asked."""

    ledger_id: int
    rows: list[tuple[int, int, Buffer | None]] = field(default_factory=list)
    request_id: int = 0
    OP = Op.READ_BATCH
    status = OK


@dataclass(slots=True)
class WriteCloseReply:
    """BP-32: the bookie recorded the write close of ``ledger_id``."""

    ledger_id: int
    request_id: int = 0
    OP = Op.WRITE_CLOSE
    status = OK


@dataclass(slots=True)
class WriteLacMultiReply:
    """One (ledger id, LAC the bookie holds for it, status) row per request
    row, in order: the LAC is the highest explicit LAC the bookie was told
    (-1 when the row's status is not OK)."""

    rows: list[tuple[int, int, int]] = field(default_factory=list)
    request_id: int = 0
    OP = Op.WRITE_LAC_MULTI
    status = OK


Reply = (ErrorReply | PingReply | InfoReply | CompactReply | AddReply | ReadReply | LacReply
         | AddBatchReply | ReadBatchReply | AddPackedReply | ReadPackedReply | WriteCloseReply
         | AddMultiReply | WriteLacMultiReply)


def error_reply(request, exc: BaseException) -> ErrorReply:
    """The ErrorReply answering ``request`` (any request object) with ``exc``."""
    return ErrorReply(op=int(request.OP), request_id=request.request_id, status=code_of(exc),
                      ledger_id=getattr(request, "ledger_id", 0),
                      entry_id=getattr(request, "entry_id", -1), message=str(exc))


# -- encoding (server side) --------------------------------------------------
def _head(op: int, request_id: int, ledger_id: int, entry_id: int, status: int) -> bytes:
    return REPLY_HEAD.pack(VERSION, op, 0, request_id, ledger_id, entry_id, status)


def encode_reply(reply: Reply, limits: WireLimits = DEFAULT_LIMITS) -> list[Buffer]:
    encoder = _ENCODERS.get(type(reply))
    if encoder is None:
        raise TypeError(f"not a reply: {type(reply).__name__}")
    return encoder(reply, limits)


def _enc_error(r: ErrorReply, limits) -> list[Buffer]:
    if r.status == OK:
        raise ValueError("an ErrorReply needs a non-zero status")
    frames: list[Buffer] = [_head(r.op, r.request_id, r.ledger_id, r.entry_id, r.status)]
    if r.message:
        text = r.message.encode("utf-8", "replace")[: limits.text_bytes_max]
        frames.append(text)
    return frames


def _enc_ping(r: PingReply, limits) -> list[Buffer]:
    return [_head(Op.PING, r.request_id, 0, -1, OK)]


def _enc_info(r: InfoReply | CompactReply, limits) -> list[Buffer]:
    text = json.dumps(r.info, sort_keys=True).encode()
    if len(text) > limits.text_bytes_max:
        raise ValueError(f"info is {len(text)} bytes, over text_bytes_max")
    return [_head(r.OP, r.request_id, 0, -1, OK), text]


def _enc_add(r: AddReply, limits) -> list[Buffer]:
    return [_head(Op.ADD, r.request_id, r.ledger_id, r.entry_id, OK)]


def _enc_read(r: ReadReply, limits) -> list[Buffer]:
    return [_head(Op.READ, r.request_id, r.ledger_id, r.entry_id, OK), r.data]


def _enc_lac(r: LacReply, limits) -> list[Buffer]:
    if r.op not in (Op.READ_LAC, Op.WAIT_LAC, Op.WRITE_LAC):
        raise ValueError(f"LacReply op must be READ_LAC, WAIT_LAC or WRITE_LAC, got {r.op}")
    head = _head(r.op, r.request_id, r.ledger_id, r.last_entry_id, OK) + I64.pack(r.lac)
    return [head] if r.last_entry is None else [head, r.last_entry]


def _enc_write_close(r: WriteCloseReply, limits) -> list[Buffer]:
    return [_head(Op.WRITE_CLOSE, r.request_id, r.ledger_id, -1, OK)]


def _enc_add_batch(r: AddBatchReply, limits) -> list[Buffer]:
    table = b"".join(ADD_STATUS_ROW.pack(*row) for row in r.rows)
    return [_head(Op.ADD_BATCH, r.request_id, 0, -1, OK) + U32.pack(len(r.rows)), table]


def _enc_write_lac_multi(r: WriteLacMultiReply, limits) -> list[Buffer]:
    table = b"".join(LAC_STATUS_ROW.pack(*row) for row in r.rows)
    return [_head(Op.WRITE_LAC_MULTI, r.request_id, 0, -1, OK) + U32.pack(len(r.rows)), table]


def _enc_read_batch(r: ReadBatchReply, limits) -> list[Buffer]:
    first = r.rows[0][0] if r.rows else -1
    head = _head(Op.READ_BATCH, r.request_id, r.ledger_id, first, OK) + U32.pack(len(r.rows))
    table = b"".join(READ_STATUS_ROW.pack(entry, status) for entry, status, _ in r.rows)
    datas = [data if status == OK and data is not None else b"" for _, status, data in r.rows]
    return [head, table, *datas]


_ENCODERS = {
    AddPackedReply: enc_add_packed_reply,
    AddMultiReply: enc_add_multi_reply,
    ReadPackedReply: enc_read_packed_reply,
    ErrorReply: _enc_error,
    PingReply: _enc_ping,
    InfoReply: _enc_info,
    CompactReply: _enc_info,
    AddReply: _enc_add,
    ReadReply: _enc_read,
    LacReply: _enc_lac,
    AddBatchReply: _enc_add_batch,
    WriteLacMultiReply: _enc_write_lac_multi,
    ReadBatchReply: _enc_read_batch,
    WriteCloseReply: _enc_write_close,
}


# -- decoding (client side) --------------------------------------------------
def decode_reply(frames, limits: WireLimits = DEFAULT_LIMITS) -> Reply:
    """Decode one reply (a DEALER receives no identity frame)."""
    if not frames:
        raise BadRequestError("empty reply")
    if len(frames) > limits.frames_max:
        raise BadRequestError(f"reply has {len(frames)} frames, over {limits.frames_max}")
    head = memoryview(frames[0])
    if len(head) >= 2 and head[0] == VERSION and head[1] == Op.ERROR:
        return _dec_error(frames, head, limits)
    _, op, _, rid, ledger_id, entry_id, status = read_head(head, REPLY_HEAD)
    if status != OK:
        return _dec_error(frames, head, limits)
    return _DECODERS[op](frames, head, rid, ledger_id, entry_id, limits)


def _dec_error(frames, head, limits) -> ErrorReply:
    if len(head) != REPLY_HEAD.size:
        raise BadRequestError(f"error reply header is {len(head)} bytes, "
                              f"expected {REPLY_HEAD.size}")
    _, op, _, rid, ledger_id, entry_id, status = REPLY_HEAD.unpack_from(head)
    if status == OK:
        raise BadRequestError("ERROR reply with status OK")
    if len(frames) > 2:
        raise BadRequestError(f"error reply has {len(frames)} frames, expected 1 or 2")
    message = ""
    if len(frames) == 2:
        text = memoryview(frames[1])
        if text.nbytes > limits.text_bytes_max:
            raise BadRequestError("error message frame over text_bytes_max")
        message = bytes(text).decode("utf-8", "replace")
    return ErrorReply(op, rid, status, ledger_id, entry_id, message)


def _dec_ping(frames, head, rid, ledger_id, entry_id, limits):
    check_frame_count(frames, 1, Op.PING)
    check_size(head, REPLY_HEAD.size, "header")
    return PingReply(rid)


def _dec_json(frames, head, op: Op, limits) -> dict:
    check_frame_count(frames, 2, op)
    check_size(head, REPLY_HEAD.size, "header")
    text = memoryview(frames[1])
    if text.nbytes > limits.text_bytes_max:
        raise BadRequestError(f"{op.name} frame over text_bytes_max")
    try:
        info = json.loads(bytes(text))
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadRequestError(f"{op.name} frame is not JSON: {exc}") from None
    if not isinstance(info, dict):
        raise BadRequestError(f"{op.name} frame is not a JSON object")
    return info


def _dec_info(frames, head, rid, ledger_id, entry_id, limits):
    return InfoReply(_dec_json(frames, head, Op.INFO, limits), rid)


def _dec_compact(frames, head, rid, ledger_id, entry_id, limits):
    return CompactReply(_dec_json(frames, head, Op.COMPACT, limits), rid)


def _dec_add(frames, head, rid, ledger_id, entry_id, limits):
    check_frame_count(frames, 1, Op.ADD)
    check_size(head, REPLY_HEAD.size, "header")
    return AddReply(ledger_id, entry_id, rid)


def _dec_read(frames, head, rid, ledger_id, entry_id, limits):
    check_frame_count(frames, 2, Op.READ)
    check_size(head, REPLY_HEAD.size, "header")
    data = memoryview(frames[1])
    check_entry_bytes(data.nbytes, limits)
    return ReadReply(ledger_id, entry_id, data, rid)


def _dec_lac(frames, head, rid, ledger_id, entry_id, limits):
    op = head[1]
    if len(frames) not in (1, 2):
        raise BadRequestError(f"{Op(op).name} reply has {len(frames)} frames, expected 1 or 2")
    check_size(head, REPLY_HEAD.size + I64.size, "header")
    (lac,) = I64.unpack_from(head, REPLY_HEAD.size)
    last_entry = None
    if len(frames) == 2:
        last_entry = memoryview(frames[1])
        check_entry_bytes(last_entry.nbytes, limits)
    return LacReply(ledger_id, lac, entry_id, last_entry, rid, op)


def _dec_write_close(frames, head, rid, ledger_id, entry_id, limits):
    check_frame_count(frames, 1, Op.WRITE_CLOSE)
    check_size(head, REPLY_HEAD.size, "header")
    return WriteCloseReply(ledger_id, rid)


def _dec_count(head, limits, op: int) -> int:
    check_size(head, REPLY_HEAD.size + U32.size, "header")
    (count,) = U32.unpack_from(head, REPLY_HEAD.size)
    if count > limits.batch_entries_max:
        raise BadRequestError(f"{Op(op).name} reply count {count} over batch_entries_max")
    return count


def _status_rows(frames, head, limits, op: Op, row) -> list:
    """``[header + u32 count, table]``: the table's ``count`` rows of ``row``."""
    count = _dec_count(head, limits, op)
    check_frame_count(frames, 2, op)
    table = memoryview(frames[1])
    check_size(table, count * row.size, f"{op.name} status table")
    return list(row.iter_unpack(table))


def _dec_add_batch(frames, head, rid, ledger_id, entry_id, limits):
    return AddBatchReply(_status_rows(frames, head, limits, Op.ADD_BATCH, ADD_STATUS_ROW), rid)


def _dec_write_lac_multi(frames, head, rid, ledger_id, entry_id, limits):
    rows = _status_rows(frames, head, limits, Op.WRITE_LAC_MULTI, LAC_STATUS_ROW)
    return WriteLacMultiReply(rows, rid)


def _dec_read_batch(frames, head, rid, ledger_id, entry_id, limits):
    count = _dec_count(head, limits, Op.READ_BATCH)
    check_frame_count(frames, count + 2, Op.READ_BATCH)
    table = memoryview(frames[1])
    check_size(table, count * READ_STATUS_ROW.size, "READ_BATCH status table")
    rows = []
    for i, (row_entry, status) in enumerate(READ_STATUS_ROW.iter_unpack(table)):
        data = memoryview(frames[i + 2])
        check_entry_bytes(data.nbytes, limits)
        if status != OK and data.nbytes:
            raise BadRequestError(f"READ_BATCH row {i} has status {status} and data")
        rows.append((row_entry, status, data if status == OK else None))
    return ReadBatchReply(ledger_id, rows, rid)


_DECODERS = {
    Op.PING: _dec_ping,
    Op.INFO: _dec_info,
    Op.COMPACT: _dec_compact,
    Op.ADD: _dec_add,
    Op.READ: _dec_read,
    Op.READ_LAC: _dec_lac,
    Op.WAIT_LAC: _dec_lac,
    Op.WRITE_LAC: _dec_lac,
    Op.WRITE_CLOSE: _dec_write_close,
    Op.ADD_BATCH: _dec_add_batch,
    Op.WRITE_LAC_MULTI: _dec_write_lac_multi,
    Op.READ_BATCH: _dec_read_batch,
    Op.ADD_PACKED: dec_add_packed_reply,
    Op.ADD_MULTI: dec_add_multi_reply,
    Op.READ_PACKED: dec_read_packed_reply,
}
