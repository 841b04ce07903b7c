"""Vectorised verification of entry records lying back to back in one buffer
(a READ_PACKED reply's data frame): the shared fast path of the client's
catch-up reads (``appliance.protocol.reader`` via ``verify_run_fast``) and of
the Spark executors' bulk reads (``appliance.bulk_read``).

Guarantees: ``check_records`` counts a record as good only if its digest
(over header and payload) matches and its header names the ledger and entry
asked for; with ``strict`` also LAC below the entry id and a running length
that grew by exactly the payload since the record before.  It returns the
longest good prefix, so no byte of a bad record, nor of any record after
it, is ever handed out.  The answers equal ``appliance.protocol.entry``'s
``verify_run`` (the tests compare them); only the cost differs.

Cost per reply: the headers are gathered and compared with numpy.  With
CRC32C digests one C call per record computes the payload's CRC, and the
header's part of the digest is added with numpy (CRC32C is affine: the
CRC of header + payload is the header's CRC advanced over the payload's
length, XOR the payload's CRC; the header CRCs come from per-position byte
tables, the advance from per-length tables, both cached).  HMAC digests
cost one HMAC per record.  No sockets, files or clocks: it sits outside
``appliance.protocol`` only because it imports the ``crc32c`` C extension.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import crc32c
import numpy as np

from appliance.protocol.entry import HEADER_BYTES

_HEADER_DTYPE = np.dtype([("ledger", ">u8"), ("entry", ">i8"), ("lac", ">i8"), ("length", ">u8")])
_crc = crc32c.crc32c
# Distinct payload lengths in one reply up to which the digest takes the
# one-call path; past it (many lengths) two CRC calls per record are cheaper
# than building the advance tables.
FAST_LENGTHS_MAX = 8
_BYTE_BITS = ((np.arange(256)[:, None] >> np.arange(8)) & 1).astype(bool)


@dataclass(slots=True)
class RecordCheck:
    """``payloads[:good]`` are verified payloads of entries ``first..``;
    ``top_lac``: the highest LAC field among them (-1 if none); ``why``:
    what is wrong with record ``good`` (None if every record passed)."""

    good: int
    payloads: list
    top_lac: int
    why: str | None


# -- CRC32C arithmetic ------------------------------------------------------------------
def _advance_basis(nbytes: int) -> np.ndarray:
    """Images of the 32 one-bit CRC values advanced over ``nbytes`` zero bytes."""
    zeros = bytes(nbytes)
    base = _crc(zeros)  # the advance is linear; crc32c(zeros, v) is affine in v
    return np.array([_crc(zeros, 1 << k) ^ base for k in range(32)], np.uint32)


def _byte_tables(basis: np.ndarray) -> np.ndarray:
    """4 x 256 table: T[j][b] = the linear map applied to byte b at position j."""
    parts = basis.reshape(4, 8)  # bits 8j..8j+7
    return np.bitwise_xor.reduce(np.where(_BYTE_BITS[None, :, :], parts[:, None, :],
                                          np.uint32(0)), axis=2).astype(np.uint32)


@lru_cache(maxsize=64)
def _advance_tables(nbytes: int) -> np.ndarray:
    return _byte_tables(_advance_basis(nbytes))


@lru_cache(maxsize=1)
def _header_tables() -> tuple[np.ndarray, int]:
    """(32 x 256 table T, c0 = the CRC of a zero header): for any header h,
    crc(h) = c0 ^ XOR_j T[j][h[j]] (the XOR part is linear in h)."""
    c0 = _crc(bytes(HEADER_BYTES))
    table = np.zeros((HEADER_BYTES, 256), np.uint32)
    probe = bytearray(HEADER_BYTES)
    for j in range(HEADER_BYTES):
        for b in (1 << k for k in range(8)):  # linear: the 8 bits give every byte value
            probe[j] = b
            table[j, b] = _crc(probe) ^ c0
        probe[j] = 0
        table[j] = np.bitwise_xor.reduce(np.where(_BYTE_BITS, table[j, 1 << np.arange(8)],
                                                  np.uint32(0)), axis=1)
    return table, c0


def _apply(tables: np.ndarray, values: np.ndarray) -> np.ndarray:
    out = tables[0][values & 0xFF]
    for j in range(1, 4):
        out ^= tables[j][(values >> (8 * j)) & 0xFF]
    return out


def _crc_digests_ok(head: np.ndarray, payloads: list, sizes: np.ndarray) -> np.ndarray:
    """Per record: the stored CRC32C (big-endian, after the header) matches."""
    n = len(payloads)
    stored = head[:, HEADER_BYTES:HEADER_BYTES + 4].copy().view(">u4").ravel()
    distinct = np.unique(sizes)
    if len(distinct) > FAST_LENGTHS_MAX:
        heads = list(map(bytes, head[:, :HEADER_BYTES]))
        return np.fromiter(map(_crc, payloads, map(_crc, heads)), np.uint32, n) == stored
    table, _ = _header_tables()
    # crc(h_i) = crc(h_0) ^ L(h_i ^ h_0) with L linear: only the byte positions
    # that differ from the first header cost a pass (ids and lengths change
    # in their low bytes only)
    diff = head[:, :HEADER_BYTES] ^ head[0, :HEADER_BYTES]
    header_crc = np.full(n, _crc(head[0, :HEADER_BYTES].tobytes()), np.uint32)
    for j in np.flatnonzero(diff.any(axis=0)).tolist():
        header_crc ^= table[j][diff[:, j]]
    advanced = np.empty(n, np.uint32)
    for size in distinct.tolist():
        pick = sizes == size
        advanced[pick] = _apply(_advance_tables(size), header_crc[pick])
    return (advanced ^ np.fromiter(map(_crc, payloads), np.uint32, n)) == stored


# -- records --------------------------------------------------------------------------
def check_records(data, lengths: np.ndarray, ledger_id: int, first_entry_id: int, digest,
                  strict: bool = True) -> RecordCheck:
    """Verify the records in ``data`` (``lengths[i]`` bytes each, back to
    back) as entries ``first_entry_id..`` of ``ledger_id``; see the module
    docstring.  Payloads are slices of ``data`` (``bytes`` if it is bytes)."""
    start = HEADER_BYTES + digest.size
    lengths = np.asarray(lengths, np.int64)
    n = _prefix_len(lengths >= start)
    why = None if n == len(lengths) else \
        f"entry {first_entry_id + n} is {int(lengths[n])} bytes, shorter than header and digest"
    if n == 0:
        return RecordCheck(0, [], -1, why)
    ends = np.cumsum(lengths[:n])
    starts, sizes = ends - lengths[:n], lengths[:n] - start
    head = np.frombuffer(data, np.uint8)[starts[:, None] + np.arange(start)]
    fields = head[:, :HEADER_BYTES].copy().view(_HEADER_DTYPE).ravel()
    payloads = list(map(data.__getitem__, map(slice, (starts + start).tolist(), ends.tolist())))
    ok = _headers_ok(fields, ledger_id, first_entry_id, sizes, strict)
    if digest.name == "crc32c":
        ok &= _crc_digests_ok(head, payloads, sizes)
    else:
        ok &= _digests_ok(head, payloads, digest)
    good = _prefix_len(ok)
    if good < n:
        why = _why_bad(fields, good, first_entry_id + good, ledger_id, sizes)
    top_lac = int(fields["lac"][:good].max()) if good else -1
    return RecordCheck(good, payloads, max(top_lac, -1), why)


def _headers_ok(fields: np.ndarray, ledger_id: int, first_entry_id: int,
                sizes: np.ndarray, strict: bool) -> np.ndarray:
    """Per record: the ids asked for; if strict, LAC below the entry and the
    running length grown by exactly the payload since the record before."""
    expected = np.arange(first_entry_id, first_entry_id + len(fields), dtype=np.int64)
    ok = (fields["ledger"] == np.uint64(ledger_id)) & (fields["entry"] == expected)
    if strict:
        ok &= (fields["lac"] >= -1) & (fields["lac"] < fields["entry"])
        running = fields["length"].astype(np.int64)
        ok[1:] &= (running[1:] - running[:-1]) == sizes[1:]
    return ok


def _digests_ok(head: np.ndarray, payloads: list, digest) -> np.ndarray:
    """Per record, any digest: one ``compute`` each."""
    heads = list(map(bytes, head[:, :HEADER_BYTES]))
    stored = list(map(bytes, head[:, HEADER_BYTES:]))
    return np.fromiter(map(lambda h, p, d: digest.compute(h, p) == d, heads, payloads, stored),
                       bool, len(payloads))


def _prefix_len(ok: np.ndarray) -> int:
    """Length of the all-True prefix of a boolean array."""
    return len(ok) if ok.all() else int(np.argmin(ok))


def _why_bad(fields: np.ndarray, i: int, entry_id: int, ledger_id: int,
             sizes: np.ndarray) -> str:
    got_ledger, got_entry = int(fields["ledger"][i]), int(fields["entry"][i])
    if (got_ledger, got_entry) != (ledger_id, entry_id):
        return (f"asked for ledger {ledger_id} entry {entry_id}, got a record of ledger "
                f"{got_ledger} entry {got_entry}")
    running = fields["length"].astype(np.int64)
    if i > 0 and running[i] - running[i - 1] != sizes[i]:
        return f"entry {entry_id}: running length does not follow the entry before it"
    return f"entry {entry_id}: digest or header check failed"


def verify_run_fast(records, digest, ledger_id: int, first_entry_id: int) -> tuple[list, int]:
    """``appliance.protocol.entry.verify_run`` (same answers: the verified
    prefix's payloads and its highest LAC) through ``check_records``.
    ``records``: a sequence of records, or anything with ``data`` and
    ``lengths`` (``appliance.protocol.reader.PackedRecords``), checked in place."""
    if hasattr(records, "lengths"):
        data, lengths = records.data, records.lengths
    else:
        lengths = list(map(len, records))
        data = b"".join(records)
    if not len(lengths):
        return [], -1
    check = check_records(data, np.asarray(lengths, np.int64), ledger_id, first_entry_id,
                          digest, strict=False)
    return check.payloads[:check.good], check.top_lac
