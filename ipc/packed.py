"""Packed batch ops: many entries in ONE data frame.

``ADD_PACKED`` and ``READ_PACKED`` carry what ``ADD_BATCH`` / ``READ_BATCH``
carry for one ledger, and ``ADD_MULTI`` what ``ADD_BATCH`` carries for
several, but the entry bytes travel concatenated in a single frame described
by a table of (entry id, length) rows, instead of one ZeroMQ frame per
entry.  A frame costs a few microseconds of Python on each side whatever its
size, so this is what makes the add and read paths cost per batch rather
than per entry.  Tables are read and written with numpy (no per-row
``struct`` calls); entries come out as ``memoryview`` slices of the
received frame (no copy).

Guarantees: ``encode`` raises ``ValueError``/``TypeError`` naming the field
before anything is sent; the decoders raise only ``BadRequestError`` for
any input: a wrong frame count, a table whose size disagrees with its count,
lengths that do not add up to the data frame, negative entry ids, an entry
or a batch over its limit.  Layouts: ``ipc/PROTOCOL.md``.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from appliance.protocol.errors import OK, BadRequestError
from ipc.frames import (
    ENTRY_ID_MAX,
    FLAG_FENCE,
    FLAG_RECOVERY,
    LEDGER_ID_MAX,
    MASTER_KEY,
    MASTER_KEY_BYTES,
    READ_BATCH_EXT,
    REPLY_HEAD,
    REQUEST_HEAD,
    U32,
    VERSION,
    Op,
    WireLimits,
    check_frame_count,
    check_ids,
    check_size,
    read_key,
    read_key_part,
)

Buffer = bytes | bytearray | memoryview

# ADD_PACKED request table: entry id, length of its bytes in the data frame
ADD_PACKED_ROW = np.dtype([("entry", ">i8"), ("length", ">u4")])
# ADD_PACKED reply table: entry id, status
PACKED_STATUS_ROW = np.dtype([("entry", ">i8"), ("status", ">i4")])
# READ_PACKED reply table: entry id, status, length (0 unless status is OK)
READ_PACKED_ROW = np.dtype([("entry", ">i8"), ("status", ">i4"), ("length", ">u4")])
# ADD_MULTI groups table: ledger id, its entry count, its master key
MULTI_GROUP_ROW = struct.Struct(">QI32s")  # 44 bytes
# ADD_MULTI request header extension: entry count, group count
MULTI_EXT = struct.Struct(">II")


def _slices(data, lengths: Sequence[int]) -> list[memoryview]:
    view = memoryview(data)
    out, pos = [], 0
    for length in lengths:
        out.append(view[pos:pos + length])
        pos += length
    return out


@dataclass(slots=True)
class AddPackedRequest:
    """Entries of one ledger: ``data`` is their bytes concatenated in the
    order of ``entry_ids``, ``lengths[i]`` bytes each."""

    ledger_id: int
    master_key: bytes
    entry_ids: Sequence[int]
    lengths: Sequence[int]
    data: Buffer
    recovery: bool = False
    request_id: int = 0
    OP = Op.ADD_PACKED

    @classmethod
    def of(cls, ledger_id: int, master_key: bytes, entry_ids: Sequence[int],
           datas: Sequence[Buffer], recovery: bool = False) -> AddPackedRequest:
        """Pack ``datas`` (one copy of the bytes, into one frame)."""
        return cls(ledger_id, master_key, tuple(entry_ids), [len(d) for d in datas],
                   b"".join(datas), recovery)

    def entries(self) -> list[memoryview]:
        """Each entry's bytes, as views of ``data``."""
        return _slices(self.data, self.lengths)


@dataclass(slots=True)
class AddMultiRequest:
    """Entries of several ledgers: ``groups`` of (ledger id, master key,
    entry count) in data order; ``entry_ids`` and ``lengths`` of every entry
    in that order; ``data`` their bytes concatenated.  A ledger may appear
    in several groups (each is admitted and answered on its own)."""

    groups: Sequence[tuple[int, bytes, int]]
    entry_ids: Sequence[int]
    lengths: Sequence[int]
    data: Buffer
    recovery: bool = False
    request_id: int = 0
    OP = Op.ADD_MULTI

    def group_entries(self) -> list[tuple[int, bytes, Sequence[int], list[memoryview]]]:
        """(ledger id, master key, entry ids, entry bytes as views of
        ``data``), one per group."""
        views = _slices(self.data, self.lengths)
        out, pos = [], 0
        for ledger_id, key, n in self.groups:
            out.append((ledger_id, key, self.entry_ids[pos:pos + n], views[pos:pos + n]))
            pos += n
        return out


@dataclass(slots=True)
class ReadPackedRequest:
    """Like ``ReadBatchRequest`` (``master_key`` sent whenever set); the
    reply is a ``ReadPackedReply``."""

    ledger_id: int
    first_entry_id: int
    last_entry_id: int
    max_entries: int
    max_bytes: int
    fence: bool = False
    master_key: bytes | None = None
    request_id: int = 0
    OP = Op.READ_PACKED


@dataclass(slots=True)
class AddPackedReply:
    """One status per entry of the request, in order."""

    ledger_id: int
    entry_ids: Sequence[int]
    statuses: Sequence[int]
    request_id: int = 0
    OP = Op.ADD_PACKED
    status = OK


@dataclass(slots=True)
class AddMultiReply:
    """One (entry id, status) per entry of the request, in its order (the
    request's groups say which ledger each row is of)."""

    entry_ids: Sequence[int]
    statuses: Sequence[int]
    request_id: int = 0
    OP = Op.ADD_MULTI
    status = OK


@dataclass(slots=True)
class ReadPackedReply:
    """Rows in entry order from the first asked; ``data`` holds the bytes of
    the OK rows, concatenated (``lengths`` is 0 for the others)."""

    ledger_id: int
    entry_ids: Sequence[int]
    statuses: Sequence[int]
    lengths: Sequence[int]
    data: Buffer
    request_id: int = 0
    OP = Op.READ_PACKED
    status = OK

    @classmethod
    def from_rows(cls, ledger_id: int, rows, request_id: int = 0) -> ReadPackedReply:
        """From ``ReadBatchReply``-style rows ``(entry id, status, data or None)``."""
        datas = [d if s == OK and d is not None else b"" for _, s, d in rows]
        return cls(ledger_id, [r[0] for r in rows], [r[1] for r in rows],
                   [len(d) for d in datas], b"".join(datas), request_id)

    def entries(self) -> list[memoryview]:
        return _slices(self.data, self.lengths)


# -- encoding ----------------------------------------------------------------------
SMALL_ROWS = 32  # below this many rows a table goes through struct: numpy's per-call cost
_STRUCTS = {dtype: struct.Struct(">" + "".join(dtype[name].str[1:] for name in dtype.names)
                                 .replace("i8", "q").replace("u4", "I").replace("i4", "i"))
            for dtype in (ADD_PACKED_ROW, PACKED_STATUS_ROW, READ_PACKED_ROW)}


def _table(dtype: np.dtype, **columns) -> bytes:
    values = list(columns.values())
    n = len(values[0])
    if n < SMALL_ROWS:
        return b"".join(map(_STRUCTS[dtype].pack, *values))
    table = np.empty(n, dtype)
    for name, column in columns.items():
        table[name] = column
    return table.tobytes()


def _check_packed_entries(entries, lengths, data, limits: WireLimits) -> None:
    """Encoder side of ``_dec_packed_entries``: ValueError naming the field."""
    total = memoryview(data).nbytes
    if min(entries) < 0 or max(entries) > ENTRY_ID_MAX:
        raise ValueError(f"entry_ids must be in [0, {ENTRY_ID_MAX}]")
    if min(lengths) < 0 or max(lengths) > limits.entry_bytes_max:
        raise ValueError(f"every length must be in [0, entry_bytes_max={limits.entry_bytes_max}]")
    if sum(lengths) != total or total > limits.batch_bytes_max:
        raise ValueError(f"data is {total} bytes; lengths add up to {sum(lengths)} and "
                         f"batch_bytes_max is {limits.batch_bytes_max}")


def enc_add_packed(req: AddPackedRequest, limits: WireLimits) -> list[Buffer]:
    n = len(req.entry_ids)
    if not 1 <= n <= limits.batch_entries_max:
        raise ValueError(f"entry_ids must hold 1..{limits.batch_entries_max} entries, got {n}")
    if len(req.lengths) != n:
        raise ValueError(f"lengths has {len(req.lengths)} items for {n} entry_ids")
    if not isinstance(req.ledger_id, int) or not 0 <= req.ledger_id <= LEDGER_ID_MAX:
        raise ValueError(f"ledger_id must be an int in [0, {LEDGER_ID_MAX}]")
    if not isinstance(req.master_key, bytes | bytearray) or \
            len(req.master_key) != MASTER_KEY_BYTES:
        raise ValueError(f"master_key must be {MASTER_KEY_BYTES} bytes")
    entries, lengths = req.entry_ids, req.lengths
    _check_packed_entries(entries, lengths, req.data, limits)
    flags = FLAG_RECOVERY if req.recovery else 0
    head = REQUEST_HEAD.pack(VERSION, Op.ADD_PACKED, flags, req.request_id, req.ledger_id,
                             entries[0]) + U32.pack(n) + bytes(req.master_key)
    return [head, _table(ADD_PACKED_ROW, entry=entries, length=lengths), req.data]


def enc_add_multi(req: AddMultiRequest, limits: WireLimits) -> list[Buffer]:
    entries, lengths, groups = req.entry_ids, req.lengths, req.groups
    n = len(entries)
    if not 1 <= n <= limits.batch_entries_max:
        raise ValueError(f"entry_ids must hold 1..{limits.batch_entries_max} entries, got {n}")
    if len(lengths) != n:
        raise ValueError(f"lengths has {len(lengths)} items for {n} entry_ids")
    rows, counted = [], 0
    pack = MULTI_GROUP_ROW.pack
    for i, (ledger_id, key, count) in enumerate(groups):
        if not (type(ledger_id) is int and 0 <= ledger_id <= LEDGER_ID_MAX):
            raise ValueError(f"groups[{i}] ledger id must be an int in [0, {LEDGER_ID_MAX}]")
        if not isinstance(key, bytes | bytearray) or len(key) != MASTER_KEY_BYTES:
            raise ValueError(f"groups[{i}] master key must be {MASTER_KEY_BYTES} bytes")
        if not (type(count) is int and count >= 1):
            raise ValueError(f"groups[{i}] entry count must be an int >= 1, got {count!r}")
        counted += count
        rows.append(pack(ledger_id, count, bytes(key)))
    if counted != n:
        raise ValueError(f"groups count {counted} entries; entry_ids has {n}")
    _check_packed_entries(entries, lengths, req.data, limits)
    flags = FLAG_RECOVERY if req.recovery else 0
    head = REQUEST_HEAD.pack(VERSION, Op.ADD_MULTI, flags, req.request_id, 0, -1) + \
        MULTI_EXT.pack(n, len(rows))
    return [head, b"".join(rows), _table(ADD_PACKED_ROW, entry=entries, length=lengths),
            req.data]


def enc_read_packed(req: ReadPackedRequest, limits: WireLimits) -> list[Buffer]:
    for name in ("first_entry_id", "last_entry_id", "max_entries", "max_bytes"):
        value = getattr(req, name)
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not 0 <= req.first_entry_id <= req.last_entry_id:
        raise ValueError(f"need 0 <= first_entry_id <= last_entry_id, got "
                         f"{req.first_entry_id}..{req.last_entry_id}")
    if not (1 <= req.max_entries < 2**32 and 1 <= req.max_bytes < 2**32):
        raise ValueError("max_entries and max_bytes must be in [1, 2**32)")
    if not isinstance(req.ledger_id, int) or not 0 <= req.ledger_id <= LEDGER_ID_MAX:
        raise ValueError(f"ledger_id must be an int in [0, {LEDGER_ID_MAX}]")
    flags, key = read_key_part(req.fence, req.master_key)
    head = REQUEST_HEAD.pack(VERSION, Op.READ_PACKED, flags, req.request_id, req.ledger_id,
                             req.first_entry_id)
    ext = READ_BATCH_EXT.pack(req.last_entry_id, req.max_entries, req.max_bytes)
    return [head + ext + key]


def _reply_head(op: int, request_id: int, ledger_id: int, entry_id: int, count: int) -> bytes:
    return REPLY_HEAD.pack(VERSION, op, 0, request_id, ledger_id, entry_id, OK) + U32.pack(count)


def enc_add_packed_reply(r: AddPackedReply, limits: WireLimits) -> list[Buffer]:
    first = r.entry_ids[0] if len(r.entry_ids) else -1
    head = _reply_head(Op.ADD_PACKED, r.request_id, r.ledger_id, first, len(r.entry_ids))
    return [head, _table(PACKED_STATUS_ROW, entry=r.entry_ids, status=r.statuses)]


def enc_add_multi_reply(r: AddMultiReply, limits: WireLimits) -> list[Buffer]:
    first = r.entry_ids[0] if len(r.entry_ids) else -1
    head = _reply_head(Op.ADD_MULTI, r.request_id, 0, first, len(r.entry_ids))
    return [head, _table(PACKED_STATUS_ROW, entry=r.entry_ids, status=r.statuses)]


def enc_read_packed_reply(r: ReadPackedReply, limits: WireLimits) -> list[Buffer]:
    first = r.entry_ids[0] if len(r.entry_ids) else -1
    head = _reply_head(Op.READ_PACKED, r.request_id, r.ledger_id, first, len(r.entry_ids))
    table = _table(READ_PACKED_ROW, entry=r.entry_ids, status=r.statuses, length=r.lengths)
    return [head, table, r.data]


# -- decoding ------------------------------------------------------------------------
def _count(head, base: int, limits: WireLimits, what: str) -> int:
    (count,) = U32.unpack_from(head, base)
    if count > limits.batch_entries_max:
        raise BadRequestError(f"{what} count {count} over batch_entries_max "
                              f"({limits.batch_entries_max})")
    return count


def _rows(frame, count: int, dtype: np.dtype, what: str) -> list[list]:
    """The table's columns, as lists (in dtype field order)."""
    table = memoryview(frame)
    check_size(table, count * dtype.itemsize, f"{what} table")
    if count < SMALL_ROWS:
        rows = list(_STRUCTS[dtype].iter_unpack(table))
        return [[row[i] for row in rows] for i in range(len(dtype.names))]
    array = np.frombuffer(table, dtype, count)
    return [array[name].tolist() for name in dtype.names]


def _dec_packed_entries(table, data, count: int, limits: WireLimits, what: str):
    """(entry ids, lengths, data view) of an add's (entry id, length) table
    and data frame: ids >= 0, each entry and the frame within the limits,
    lengths adding up to the frame."""
    entries, lengths = _rows(table, count, ADD_PACKED_ROW, what)
    data = memoryview(data)
    if min(entries) < 0:
        raise BadRequestError(f"{what} entry id {min(entries)} is below 0")
    if max(lengths) > limits.entry_bytes_max:
        raise BadRequestError(f"entry of {max(lengths)} bytes exceeds entry_bytes_max "
                              f"({limits.entry_bytes_max})")
    if sum(lengths) != data.nbytes or data.nbytes > limits.batch_bytes_max:
        raise BadRequestError(f"{what} data frame is {data.nbytes} bytes; the table says "
                              f"{sum(lengths)} (batch_bytes_max {limits.batch_bytes_max})")
    return entries, lengths, data


def dec_add_packed(frames, head, flags, rid, ledger_id, entry_id, limits) -> AddPackedRequest:
    check_frame_count(frames, 3, Op.ADD_PACKED)
    check_size(head, REQUEST_HEAD.size + U32.size + MASTER_KEY_BYTES, "header")
    check_ids(ledger_id, 0, 0)
    count = _count(head, REQUEST_HEAD.size, limits, "ADD_PACKED")
    if count < 1:
        raise BadRequestError("ADD_PACKED count 0 (needs 1..batch_entries_max)")
    entries, lengths, data = _dec_packed_entries(frames[1], frames[2], count, limits,
                                                 "ADD_PACKED")
    key = MASTER_KEY.unpack_from(head, REQUEST_HEAD.size + U32.size)[0]
    return AddPackedRequest(ledger_id, key, entries, lengths, data,
                            bool(flags & FLAG_RECOVERY), rid)


def dec_add_multi(frames, head, flags, rid, ledger_id, entry_id, limits) -> AddMultiRequest:
    check_frame_count(frames, 4, Op.ADD_MULTI)
    check_size(head, REQUEST_HEAD.size + MULTI_EXT.size, "header")
    count, ngroups = MULTI_EXT.unpack_from(head, REQUEST_HEAD.size)
    if not 1 <= count <= limits.batch_entries_max:
        raise BadRequestError(f"ADD_MULTI count {count} not in 1..{limits.batch_entries_max}")
    if not 1 <= ngroups <= count:
        raise BadRequestError(f"ADD_MULTI group count {ngroups} not in 1..{count}")
    table = memoryview(frames[1])
    check_size(table, ngroups * MULTI_GROUP_ROW.size, "ADD_MULTI groups table")
    groups = list(MULTI_GROUP_ROW.iter_unpack(table))
    counted = 0
    for ledger, n, _key in groups:
        if ledger > LEDGER_ID_MAX or n < 1:
            raise BadRequestError(f"ADD_MULTI group of ledger {ledger} with {n} entries "
                                  f"(needs ledger id <= {LEDGER_ID_MAX}, entries >= 1)")
        counted += n
    if counted != count:
        raise BadRequestError(f"ADD_MULTI groups hold {counted} entries; the header says {count}")
    entries, lengths, data = _dec_packed_entries(frames[2], frames[3], count, limits,
                                                 "ADD_MULTI")
    return AddMultiRequest([(ledger, key, n) for ledger, n, key in groups], entries, lengths,
                           data, bool(flags & FLAG_RECOVERY), rid)


def dec_read_range(frames, head, flags, rid, ledger_id, entry_id, limits,
                   kind: type = ReadPackedRequest):
    """A READ_PACKED request, or with ``kind=ReadBatchRequest`` a READ_BATCH
    one: both ask for a range the same way (only their replies differ), so
    one decoder checks both."""
    op = kind.OP
    check_frame_count(frames, 1, op)
    check_ids(ledger_id, entry_id, 0)
    ext_end = REQUEST_HEAD.size + READ_BATCH_EXT.size
    if len(head) < ext_end:
        raise BadRequestError(f"header is {len(head)} bytes, needs at least {ext_end}")
    last, max_entries, max_bytes = READ_BATCH_EXT.unpack_from(head, REQUEST_HEAD.size)
    if last < entry_id:
        raise BadRequestError(f"{op.name} last entry {last} is before first {entry_id}")
    if max_entries < 1 or max_bytes < 1:
        raise BadRequestError(f"{op.name} max_entries and max_bytes must be >= 1")
    key = read_key(head, flags, ext_end)
    return kind(ledger_id, entry_id, last, max_entries, max_bytes, bool(flags & FLAG_FENCE),
                key, rid)


def dec_add_packed_reply(frames, head, rid, ledger_id, entry_id, limits) -> AddPackedReply:
    check_frame_count(frames, 2, Op.ADD_PACKED)
    check_size(head, REPLY_HEAD.size + U32.size, "header")
    count = _count(head, REPLY_HEAD.size, limits, "ADD_PACKED reply")
    entries, statuses = _rows(frames[1], count, PACKED_STATUS_ROW, "ADD_PACKED status")
    return AddPackedReply(ledger_id, entries, statuses, rid)


def dec_add_multi_reply(frames, head, rid, ledger_id, entry_id, limits) -> AddMultiReply:
    check_frame_count(frames, 2, Op.ADD_MULTI)
    check_size(head, REPLY_HEAD.size + U32.size, "header")
    count = _count(head, REPLY_HEAD.size, limits, "ADD_MULTI reply")
    entries, statuses = _rows(frames[1], count, PACKED_STATUS_ROW, "ADD_MULTI status")
    return AddMultiReply(entries, statuses, rid)


def dec_read_packed_reply(frames, head, rid, ledger_id, entry_id, limits) -> ReadPackedReply:
    check_frame_count(frames, 3, Op.READ_PACKED)
    check_size(head, REPLY_HEAD.size + U32.size, "header")
    count = _count(head, REPLY_HEAD.size, limits, "READ_PACKED reply")
    entries, statuses, lengths = _rows(frames[1], count, READ_PACKED_ROW, "READ_PACKED")
    data = memoryview(frames[2])
    if count and max(lengths) > limits.entry_bytes_max:
        raise BadRequestError(f"READ_PACKED entry of {max(lengths)} bytes exceeds "
                              f"entry_bytes_max ({limits.entry_bytes_max})")
    if any(s != OK and n for s, n in zip(statuses, lengths, strict=True)):
        raise BadRequestError("READ_PACKED row with a non-OK status has data")
    if sum(lengths) != data.nbytes:
        raise BadRequestError(f"READ_PACKED data frame is {data.nbytes} bytes; the table says "
                              f"{sum(lengths)}")
    return ReadPackedReply(ledger_id, entries, statuses, lengths, data, rid)
