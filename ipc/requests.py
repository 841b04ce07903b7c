"""Requests (client -> bookie): one class per op, ``encode`` and ``decode_request``.

A message is a list of frames; frame 0 is the fixed request header (plus the
op's fixed extension), entry bytes travel as frames of their own and are
never copied: the decoder hands out ``memoryview``s of the received frames,
the encoder passes the caller's buffers through.

Guarantees: ``encode`` raises ``ValueError``/``TypeError`` naming the field
before anything is sent; ``decode_request`` raises only ``BadRequestError``
(or its subclass ``ProtocolVersionError``) for any input whatsoever: short,
truncated, unknown version/op/flags, wrong frame counts, oversize entries or
batches.  Layouts: ``ipc/PROTOCOL.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial

from appliance.protocol.errors import BadRequestError
from ipc.frames import (
    ADD_ROW,
    DEFAULT_LIMITS,
    FLAG_FENCE,
    FLAG_GC,
    FLAG_MAJOR,
    FLAG_RECOVERY,
    FLAG_RESUME,
    FLAG_SUSPEND,
    LAC_ROW,
    LEDGER_ID_MAX,
    MASTER_KEY,
    MASTER_KEY_BYTES,
    READ_BATCH_EXT,
    REQUEST_HEAD,
    U32,
    VERSION,
    Op,
    WireLimits,
    check_entry_bytes,
    check_flags,
    check_frame_count,
    check_ids,
    check_size,
    read_head,
    read_key,
    read_key_part,
)
from ipc.packed import (
    AddMultiRequest,
    AddPackedRequest,
    ReadPackedRequest,
    dec_add_multi,
    dec_add_packed,
    dec_read_range,
    enc_add_multi,
    enc_add_packed,
    enc_read_packed,
)

Buffer = bytes | bytearray | memoryview


@dataclass(slots=True)
class PingRequest:
    request_id: int = 0
    OP = Op.PING


@dataclass(slots=True)
class InfoRequest:
    request_id: int = 0
    OP = Op.INFO


@dataclass(slots=True)
class CompactRequest:
    """Start a compaction (``major``: the major threshold), or with ``gc`` a
    garbage-collection pass (deleted ledgers, their entry logs, then a minor
    compaction); answered at once.  ``suspend`` / ``resume`` (at most one):
    instead, suspend or resume the bookie's automatic compaction."""

    major: bool = False
    gc: bool = False
    request_id: int = 0
    suspend: bool = False
    resume: bool = False
    OP = Op.COMPACT


@dataclass(slots=True)
class AddRequest:
    """Store ``data`` (the client-built entry bytes) as (ledger_id, entry_id)."""

    ledger_id: int
    entry_id: int
    master_key: bytes
    data: Buffer
    recovery: bool = False
    request_id: int = 0
    OP = Op.ADD


@dataclass(slots=True)
class ReadRequest:
    """Read one entry; with ``fence`` the bookie first fences the ledger.
    ``master_key`` (required with ``fence``) is sent whenever it is set: a
    bookie that knows the ledger's key refuses reads without it."""

    ledger_id: int
    entry_id: int
    fence: bool = False
    master_key: bytes | None = None
    request_id: int = 0
    OP = Op.READ


@dataclass(slots=True)
class ReadLacRequest:
    """Ask for the bookie's LAC and last entry; with ``fence``, fence first.
    ``master_key`` (required with ``fence``) is sent whenever it is set."""

    ledger_id: int
    fence: bool = False
    master_key: bytes | None = None
    request_id: int = 0
    OP = Op.READ_LAC


@dataclass(slots=True)
class WriteLacRequest:
    """The writer's LAC (explicit LAC): lets readers of an idle ledger see its
    last entry.  The bookie keeps the highest it was told; needs the key."""

    ledger_id: int
    lac: int
    master_key: bytes
    request_id: int = 0
    OP = Op.WRITE_LAC


@dataclass(slots=True)
class WriteLacMultiRequest:
    """WRITE_LAC for several ledgers in one message: ``rows`` of (ledger id,
    LAC, master key).  Each row is checked and kept on its own; the reply
    (``WriteLacMultiReply``) has a row per request row, in order."""

    rows: Sequence[tuple[int, int, bytes]]
    request_id: int = 0
    OP = Op.WRITE_LAC_MULTI


@dataclass(slots=True)
class WriteCloseRequest:
    """BP-32 advisory write close: the writer is done with the ledger (its
    log can be rotated).  Needs the key; the reply is only ever logged."""

    ledger_id: int
    master_key: bytes
    request_id: int = 0
    OP = Op.WRITE_CLOSE


@dataclass(slots=True)
class WaitLacRequest:
    """Long poll: reply once the LAC passes ``previous_lac`` or at ``timeout_ms``.
    ``master_key``: sent when set, as by every read."""

    ledger_id: int
    previous_lac: int
    timeout_ms: int
    request_id: int = 0
    master_key: bytes | None = None
    OP = Op.WAIT_LAC


@dataclass(slots=True)
class AddItem:
    ledger_id: int
    entry_id: int
    master_key: bytes
    data: Buffer


@dataclass(slots=True)
class AddBatchRequest:
    """Many adds (any ledgers) in one message; the reply has one status each."""

    items: list[AddItem] = field(default_factory=list)
    recovery: bool = False
    request_id: int = 0
    OP = Op.ADD_BATCH


@dataclass(slots=True)
class ReadBatchRequest:
    """Entries first..last of one ledger, cut at max_entries / max_bytes.
    ``master_key`` (required with ``fence``) is sent whenever it is set."""

    ledger_id: int
    first_entry_id: int
    last_entry_id: int
    max_entries: int
    max_bytes: int
    fence: bool = False
    master_key: bytes | None = None
    request_id: int = 0
    OP = Op.READ_BATCH


Request = (PingRequest | InfoRequest | CompactRequest | AddRequest | ReadRequest | ReadLacRequest
           | WaitLacRequest | WriteLacRequest | AddBatchRequest | ReadBatchRequest
           | AddPackedRequest | ReadPackedRequest | WriteCloseRequest | AddMultiRequest
           | WriteLacMultiRequest)


# -- encoding (client side: ValueError / TypeError naming the field) ---------
def _check_int(name: str, value, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}")


def _check_key(name: str, key) -> bytes:
    if not isinstance(key, bytes | bytearray) or len(key) != MASTER_KEY_BYTES:
        raise ValueError(f"{name} must be {MASTER_KEY_BYTES} bytes")
    return bytes(key)


def _check_data(name: str, data, limits: WireLimits) -> None:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(f"{name} must be bytes-like, got {type(data).__name__}")
    if memoryview(data).nbytes > limits.entry_bytes_max:
        raise ValueError(f"{name} is {memoryview(data).nbytes} bytes, over entry_bytes_max "
                         f"({limits.entry_bytes_max})")


def _head(op: int, flags: int, request_id: int, ledger_id: int, entry_id: int) -> bytes:
    _check_int("request_id", request_id, 0, 2**64 - 1)
    _check_int("ledger_id", ledger_id, 0, LEDGER_ID_MAX)
    return REQUEST_HEAD.pack(VERSION, op, flags, request_id, ledger_id, entry_id)


def encode_request(req: Request, limits: WireLimits = DEFAULT_LIMITS) -> list[Buffer]:
    """The frames of ``req`` (header first).  Validates every field."""
    encoder = _ENCODERS.get(type(req))
    if encoder is None:
        raise TypeError(f"not a request: {type(req).__name__}")
    return encoder(req, limits)


def _enc_simple(req, limits) -> list[Buffer]:
    return [_head(req.OP, 0, req.request_id, 0, -1)]


def _enc_add(req: AddRequest, limits) -> list[Buffer]:
    _check_int("entry_id", req.entry_id, 0, 2**63 - 1)
    key = _check_key("master_key", req.master_key)
    _check_data("data", req.data, limits)
    flags = FLAG_RECOVERY if req.recovery else 0
    return [_head(Op.ADD, flags, req.request_id, req.ledger_id, req.entry_id) + key, req.data]


def _enc_read(req: ReadRequest, limits) -> list[Buffer]:
    _check_int("entry_id", req.entry_id, 0, 2**63 - 1)
    flags, key = read_key_part(req.fence, req.master_key)
    return [_head(Op.READ, flags, req.request_id, req.ledger_id, req.entry_id) + key]


def _enc_read_lac(req: ReadLacRequest, limits) -> list[Buffer]:
    flags, key = read_key_part(req.fence, req.master_key)
    return [_head(Op.READ_LAC, flags, req.request_id, req.ledger_id, -1) + key]


def _enc_write_lac(req: WriteLacRequest, limits) -> list[Buffer]:
    _check_int("lac", req.lac, -1, 2**63 - 1)
    key = _check_key("master_key", req.master_key)
    return [_head(Op.WRITE_LAC, 0, req.request_id, req.ledger_id, req.lac) + key]


def _enc_write_lac_multi(req: WriteLacMultiRequest, limits) -> list[Buffer]:
    n = len(req.rows)
    if not 1 <= n <= limits.batch_entries_max:
        raise ValueError(f"rows must hold 1..{limits.batch_entries_max} LACs, got {n}")
    pack, table = LAC_ROW.pack, []
    for i, (ledger_id, lac, key) in enumerate(req.rows):
        if not (type(ledger_id) is int and type(lac) is int and type(key) is bytes
                and 0 <= ledger_id <= LEDGER_ID_MAX and -1 <= lac <= 2**63 - 1
                and len(key) == MASTER_KEY_BYTES):
            _check_int(f"rows[{i}].ledger_id", ledger_id, 0, LEDGER_ID_MAX)
            _check_int(f"rows[{i}].lac", lac, -1, 2**63 - 1)
            key = _check_key(f"rows[{i}].master_key", key)
        table.append(pack(ledger_id, lac, key))
    head = _head(Op.WRITE_LAC_MULTI, 0, req.request_id, 0, -1) + U32.pack(n)
    return [head, b"".join(table)]


def _enc_write_close(req: WriteCloseRequest, limits) -> list[Buffer]:
    key = _check_key("master_key", req.master_key)
    return [_head(Op.WRITE_CLOSE, 0, req.request_id, req.ledger_id, -1) + key]


def _enc_wait_lac(req: WaitLacRequest, limits) -> list[Buffer]:
    _check_int("previous_lac", req.previous_lac, -1, 2**63 - 1)
    _check_int("timeout_ms", req.timeout_ms, 0, 2**32 - 1)
    flags, key = read_key_part(False, req.master_key)
    head = _head(Op.WAIT_LAC, flags, req.request_id, req.ledger_id, req.previous_lac)
    return [head + U32.pack(req.timeout_ms) + key]


def _enc_add_batch(req: AddBatchRequest, limits) -> list[Buffer]:
    n = len(req.items)
    if not 1 <= n <= limits.batch_entries_max:
        raise ValueError(f"items must hold 1..{limits.batch_entries_max} entries, got {n}")
    rows, total = [], 0
    pack, entry_max = ADD_ROW.pack, limits.entry_bytes_max
    for i, item in enumerate(req.items):
        lid, eid, key, data = item.ledger_id, item.entry_id, item.master_key, item.data
        # the common case checked without building a message; anything else
        # takes the checks that name the field
        if not (type(lid) is int and type(eid) is int and type(key) is bytes
                and type(data) is bytes and 0 <= lid <= LEDGER_ID_MAX
                and 0 <= eid <= 2**63 - 1 and len(key) == MASTER_KEY_BYTES
                and len(data) <= entry_max):
            _check_int(f"items[{i}].ledger_id", lid, 0, LEDGER_ID_MAX)
            _check_int(f"items[{i}].entry_id", eid, 0, 2**63 - 1)
            key = _check_key(f"items[{i}].master_key", key)
            _check_data(f"items[{i}].data", data, limits)
        total += memoryview(data).nbytes
        rows.append(pack(lid, eid, key))
    if total > limits.batch_bytes_max:
        raise ValueError(f"items hold {total} bytes, over batch_bytes_max "
                         f"({limits.batch_bytes_max})")
    flags = FLAG_RECOVERY if req.recovery else 0
    head = _head(Op.ADD_BATCH, flags, req.request_id, 0, -1) + U32.pack(n)
    return [head, b"".join(rows), *(item.data for item in req.items)]


def _enc_read_batch(req: ReadBatchRequest, limits) -> list[Buffer]:
    _check_int("first_entry_id", req.first_entry_id, 0, 2**63 - 1)
    _check_int("last_entry_id", req.last_entry_id, req.first_entry_id, 2**63 - 1)
    _check_int("max_entries", req.max_entries, 1, 2**32 - 1)
    _check_int("max_bytes", req.max_bytes, 1, 2**32 - 1)
    flags, key = read_key_part(req.fence, req.master_key)
    head = _head(Op.READ_BATCH, flags, req.request_id, req.ledger_id, req.first_entry_id)
    ext = READ_BATCH_EXT.pack(req.last_entry_id, req.max_entries, req.max_bytes)
    return [head + ext + key]


def _enc_compact(req: CompactRequest, limits) -> list[Buffer]:
    if req.suspend and req.resume:
        raise BadRequestError("a COMPACT request suspends or resumes, not both")
    flags = ((FLAG_MAJOR if req.major else 0) | (FLAG_GC if req.gc else 0)
             | (FLAG_SUSPEND if req.suspend else 0) | (FLAG_RESUME if req.resume else 0))
    return [_head(Op.COMPACT, flags, req.request_id, 0, -1)]


_ENCODERS = {
    AddPackedRequest: enc_add_packed,
    AddMultiRequest: enc_add_multi,
    ReadPackedRequest: enc_read_packed,
    PingRequest: _enc_simple,
    InfoRequest: _enc_simple,
    CompactRequest: _enc_compact,
    AddRequest: _enc_add,
    ReadRequest: _enc_read,
    ReadLacRequest: _enc_read_lac,
    WaitLacRequest: _enc_wait_lac,
    WriteLacRequest: _enc_write_lac,
    WriteLacMultiRequest: _enc_write_lac_multi,
    WriteCloseRequest: _enc_write_close,
    AddBatchRequest: _enc_add_batch,
    ReadBatchRequest: _enc_read_batch,
}


# -- decoding (server side: BadRequestError for anything malformed) ----------
def decode_request(frames, limits: WireLimits = DEFAULT_LIMITS) -> Request:
    """Decode the frames of one request (without the ROUTER identity frame).

    ``frames`` is a list of buffers (bytes, memoryview, zmq.Frame).  Entry
    data comes back as ``memoryview``s over those frames (no copy).
    """
    if not frames:
        raise BadRequestError("empty message")
    if len(frames) > limits.frames_max:
        raise BadRequestError(f"message has {len(frames)} frames, over the limit "
                              f"({limits.frames_max})")
    head = memoryview(frames[0])
    _, op, flags, request_id, ledger_id, entry_id = read_head(head, REQUEST_HEAD)
    check_flags(op, flags)
    return _DECODERS[op](frames, head, flags, request_id, ledger_id, entry_id, limits)


def _dec_ping(frames, head, flags, rid, ledger_id, entry_id, limits):
    check_frame_count(frames, 1, Op.PING)
    check_size(head, REQUEST_HEAD.size, "header")
    return PingRequest(request_id=rid)


def _dec_info(frames, head, flags, rid, ledger_id, entry_id, limits):
    check_frame_count(frames, 1, Op.INFO)
    check_size(head, REQUEST_HEAD.size, "header")
    return InfoRequest(request_id=rid)


def _dec_compact(frames, head, flags, rid, ledger_id, entry_id, limits):
    check_frame_count(frames, 1, Op.COMPACT)
    check_size(head, REQUEST_HEAD.size, "header")
    if flags & FLAG_SUSPEND and flags & FLAG_RESUME:
        raise BadRequestError("a COMPACT request suspends or resumes, not both")
    return CompactRequest(bool(flags & FLAG_MAJOR), bool(flags & FLAG_GC), request_id=rid,
                          suspend=bool(flags & FLAG_SUSPEND), resume=bool(flags & FLAG_RESUME))


def _dec_add(frames, head, flags, rid, ledger_id, entry_id, limits):
    check_frame_count(frames, 2, Op.ADD)
    check_size(head, REQUEST_HEAD.size + MASTER_KEY_BYTES, "header with master key")
    check_ids(ledger_id, entry_id, 0)
    data = memoryview(frames[1])
    check_entry_bytes(data.nbytes, limits)
    key = MASTER_KEY.unpack_from(head, REQUEST_HEAD.size)[0]
    return AddRequest(ledger_id, entry_id, key, data, bool(flags & FLAG_RECOVERY), rid)


def _dec_read(frames, head, flags, rid, ledger_id, entry_id, limits):
    check_frame_count(frames, 1, Op.READ)
    check_ids(ledger_id, entry_id, 0)
    key = read_key(head, flags, REQUEST_HEAD.size)
    return ReadRequest(ledger_id, entry_id, bool(flags & FLAG_FENCE), key, rid)


def _dec_read_lac(frames, head, flags, rid, ledger_id, entry_id, limits):
    check_frame_count(frames, 1, Op.READ_LAC)
    check_ids(ledger_id, 0, 0)
    key = read_key(head, flags, REQUEST_HEAD.size)
    return ReadLacRequest(ledger_id, bool(flags & FLAG_FENCE), key, rid)


def _dec_write_lac(frames, head, flags, rid, ledger_id, entry_id, limits):
    check_frame_count(frames, 1, Op.WRITE_LAC)
    check_size(head, REQUEST_HEAD.size + MASTER_KEY_BYTES, "header with master key")
    check_ids(ledger_id, entry_id, -1)
    key = MASTER_KEY.unpack_from(head, REQUEST_HEAD.size)[0]
    return WriteLacRequest(ledger_id, entry_id, key, rid)


def _dec_write_lac_multi(frames, head, flags, rid, ledger_id, entry_id, limits):
    check_frame_count(frames, 2, Op.WRITE_LAC_MULTI)
    check_size(head, REQUEST_HEAD.size + U32.size, "header")
    (count,) = U32.unpack_from(head, REQUEST_HEAD.size)
    if not 1 <= count <= limits.batch_entries_max:
        raise BadRequestError(f"WRITE_LAC_MULTI count {count} not in "
                              f"1..{limits.batch_entries_max}")
    table = memoryview(frames[1])
    check_size(table, count * LAC_ROW.size, "WRITE_LAC_MULTI table")
    rows = list(LAC_ROW.iter_unpack(table))
    for row_ledger, row_lac, _key in rows:
        check_ids(row_ledger, row_lac, -1)
    return WriteLacMultiRequest(rows, rid)


def _dec_write_close(frames, head, flags, rid, ledger_id, entry_id, limits):
    check_frame_count(frames, 1, Op.WRITE_CLOSE)
    check_size(head, REQUEST_HEAD.size + MASTER_KEY_BYTES, "header with master key")
    check_ids(ledger_id, entry_id, -1)
    key = MASTER_KEY.unpack_from(head, REQUEST_HEAD.size)[0]
    return WriteCloseRequest(ledger_id, key, rid)


def _dec_wait_lac(frames, head, flags, rid, ledger_id, entry_id, limits):
    check_frame_count(frames, 1, Op.WAIT_LAC)
    check_ids(ledger_id, entry_id, -1)
    if len(head) < REQUEST_HEAD.size + U32.size:
        raise BadRequestError(f"header is {len(head)} bytes, needs at least "
                              f"{REQUEST_HEAD.size + U32.size}")
    key = read_key(head, flags, REQUEST_HEAD.size + U32.size)
    (timeout_ms,) = U32.unpack_from(head, REQUEST_HEAD.size)
    return WaitLacRequest(ledger_id, entry_id, timeout_ms, rid, key)


def _dec_add_batch(frames, head, flags, rid, ledger_id, entry_id, limits):
    check_size(head, REQUEST_HEAD.size + U32.size, "header")
    (count,) = U32.unpack_from(head, REQUEST_HEAD.size)
    if not 1 <= count <= limits.batch_entries_max:
        raise BadRequestError(f"ADD_BATCH count {count} not in 1..{limits.batch_entries_max}")
    check_frame_count(frames, count + 2, Op.ADD_BATCH)
    table = memoryview(frames[1])
    check_size(table, count * ADD_ROW.size, "ADD_BATCH table")
    items, total = [], 0
    for i, (row_ledger, row_entry, key) in enumerate(ADD_ROW.iter_unpack(table)):
        check_ids(row_ledger, row_entry, 0)
        data = memoryview(frames[i + 2])
        check_entry_bytes(data.nbytes, limits)
        total += data.nbytes
        items.append(AddItem(row_ledger, row_entry, key, data))
    if total > limits.batch_bytes_max:
        raise BadRequestError(f"ADD_BATCH holds {total} bytes, over batch_bytes_max "
                              f"({limits.batch_bytes_max})")
    return AddBatchRequest(items, bool(flags & FLAG_RECOVERY), rid)


_DECODERS = {
    Op.PING: _dec_ping,
    Op.INFO: _dec_info,
    Op.COMPACT: _dec_compact,
    Op.ADD: _dec_add,
    Op.READ: _dec_read,
    Op.READ_LAC: _dec_read_lac,
    Op.WAIT_LAC: _dec_wait_lac,
    Op.WRITE_LAC: _dec_write_lac,
    Op.WRITE_LAC_MULTI: _dec_write_lac_multi,
    Op.WRITE_CLOSE: _dec_write_close,
    Op.ADD_BATCH: _dec_add_batch,
    Op.READ_BATCH: partial(dec_read_range, kind=ReadBatchRequest),  # one range decoder
    Op.ADD_PACKED: dec_add_packed,
    Op.ADD_MULTI: dec_add_multi,
    Op.READ_PACKED: dec_read_range,
}
