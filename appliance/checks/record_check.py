"""Vectorised verification of entry records lying back to back in one buffer
(a READ_PACKED reply's data frame): the shared fast path of the client's
catch-up reads (``appliance.protocol.reader`` via ``verify_run_fast``) and of
the Spark executors' bulk reads (``appliance.client.bulk_read``).

Guarantees: ``check_records`` counts a record as good only if its digest
(over header and payload) matches and its header names the ledger and entry
asked for; with ``strict`` also LAC below the entry id and a running length
that grew by exactly the payload since the record before.  It returns the
longest good prefix, so no byte of a bad record, nor of any record after
it, is ever handed out.  The answers equal ``appliance.protocol.entry``'s
``verify_run`` (the tests compare them); only the cost differs.

Cost per reply: the headers are gathered and compared with numpy.  With
CRC32C digests and records of one length (the usual reply) there is no
per-record Python at all: the reply is viewed as a matrix, the payloads are
joined with one copy and checked with ONE ``crc32c`` call against the
combination of the CRCs the stored digests imply (payloads up to
``STRIPPED_PAYLOAD_MAX``: the CRC of every record's header and payload
copied side by side, against the stored CRCs combined; larger ones: the
CRC of the joined payloads, against the stored CRCs with the headers' part
taken out with numpy) (``storage.crc_vec``:
the strength of one CRC32C over the joined payloads: errors of up to 3 bits
and bursts up to 32 bits always caught, other damage missed with
probability 2^-32); if that fails, or lengths differ, each record costs one
C call (the header's part of the digest added with numpy) and the first bad
one is found.  HMAC
digests cost one HMAC per record.  No sockets, files or clocks: it sits
outside ``appliance.protocol`` only because it imports the ``crc32c`` C
extension.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import crc32c
import numpy as np

from appliance.protocol.entry import HEADER_BYTES
from storage import crc_vec

_HEADER_DTYPE = np.dtype([("ledger", ">u8"), ("entry", ">i8"), ("lac", ">i8"), ("length", ">u8")])
_crc = crc32c.crc32c
# Distinct payload lengths in one reply up to which the digest takes the
# one-call-per-record path; past it two CRC calls per record are cheaper
# than the per-length advance.
FAST_LENGTHS_MAX = 8
# Payloads up to this size take the header-and-payload path of the joined
# check (one more copy of the records, no per-header CRC arithmetic): below
# it the copy is cheaper than the ~8 table passes of ``_header_crcs``
# (measured 50 vs 120 ns per 100-byte record, 1,024 a reply).
STRIPPED_PAYLOAD_MAX = 512
_BYTE_BITS = ((np.arange(256)[:, None] >> np.arange(8)) & 1).astype(bool)


@dataclass(slots=True)
class RecordCheck:
    """Records ``0..good-1`` verified (entries ``first..``); ``top_lac``: the
    highest LAC field among them (-1 if none); ``why``: what is wrong with
    record ``good`` (None if every record passed).  The payloads are
    ``payloads`` (one per record) or, on the joined path, ``joined`` (all
    of them back to back, ``size`` bytes each)."""

    good: int
    top_lac: int
    why: str | None
    payloads: list | None = None
    joined: bytes | None = None
    size: int = 0

    def payload_list(self) -> list:
        """The verified payloads, one object each (bytes or views)."""
        if self.payloads is not None:
            return self.payloads[:self.good]
        size, joined = self.size, self.joined
        if size == 0:
            return [b""] * self.good
        return list(map(joined.__getitem__, map(slice, range(0, self.good * size, size),
                                                range(size, self.good * size + 1, size))))

    def payload_bytes(self) -> bytes:
        """The verified payloads joined."""
        if self.payloads is not None:
            return b"".join(self.payloads[:self.good])
        return self.joined[:self.good * self.size]


# -- CRC32C digests --------------------------------------------------------------------
@lru_cache(maxsize=1)
def _header_tables() -> np.ndarray:
    """32 x 256 table T: crc(h) ^ crc(zero header) = XOR_j T[j][h[j]] (linear)."""
    c0 = _crc(bytes(HEADER_BYTES))
    table = np.zeros((HEADER_BYTES, 256), np.uint32)
    probe = bytearray(HEADER_BYTES)
    for j in range(HEADER_BYTES):
        for k in range(8):
            probe[j] = 1 << k
            table[j, 1 << k] = _crc(probe) ^ c0
        probe[j] = 0
        table[j] = np.bitwise_xor.reduce(np.where(_BYTE_BITS, table[j, 1 << np.arange(8)],
                                                  np.uint32(0)), axis=1)
    return table


def _header_crcs(head: np.ndarray) -> np.ndarray:
    """CRC32C of each record's 32-byte header (rows of ``head``).  By
    linearity crc(h_i) = crc(h_0) ^ L(h_i ^ h_0): only the byte positions
    that differ from the first header cost a pass (ids, LAC and length
    change in their low bytes only)."""
    table = _header_tables()
    diff = head[:, :HEADER_BYTES] ^ head[0, :HEADER_BYTES]
    out = np.full(len(head), _crc(head[0, :HEADER_BYTES].tobytes()), np.uint32)
    for j in np.flatnonzero(diff.any(axis=0)).tolist():
        out ^= table[j][diff[:, j]]
    return out


def _stored_crcs(head: np.ndarray) -> np.ndarray:
    return head[:, HEADER_BYTES:HEADER_BYTES + 4].copy().view(">u4").ravel()


def _crc_digests_ok(head: np.ndarray, payloads: list, sizes: np.ndarray) -> np.ndarray:
    """Per record: the stored CRC32C (big-endian, after the header) matches;
    one C call per record."""
    n = len(payloads)
    stored = _stored_crcs(head)
    distinct = np.unique(sizes)
    if len(distinct) > FAST_LENGTHS_MAX:
        heads = list(map(bytes, head[:, :HEADER_BYTES]))
        return np.fromiter(map(_crc, payloads, map(_crc, heads)), np.uint32, n) == stored
    header_crc = _header_crcs(head)
    advanced = np.empty(n, np.uint32)
    for size in distinct.tolist():
        pick = sizes == size
        advanced[pick] = crc_vec.advance(header_crc[pick], size)
    return (advanced ^ np.fromiter(map(_crc, payloads), np.uint32, n)) == stored


def _stripped_digests_ok(rows: np.ndarray, start: int) -> bool:
    """All stored CRC32Cs match, for records of one length (the rows of
    ``rows``, header and digest in their first ``start`` bytes): each
    record's header and payload copied side by side without the digest is
    what its stored CRC covers, so the stored CRCs combined must be the CRC
    of that whole copy (one C call).  A mismatch means some record is bad."""
    n, record_bytes = rows.shape
    body = np.empty((n, record_bytes - (start - HEADER_BYTES)), np.uint8)
    body[:, :HEADER_BYTES] = rows[:, :HEADER_BYTES]
    body[:, HEADER_BYTES:] = rows[:, start:]
    return crc_vec.joined_crc(_stored_crcs(rows), body.shape[1]) == _crc(body)


def _joined_digests_ok(head: np.ndarray, joined: bytes, size: int) -> bool:
    """All stored CRC32Cs match, for records of one payload ``size`` whose
    payloads are ``joined``: the payload CRCs they imply, combined, must be
    the CRC of the joined payloads (one C call for the whole reply).  A
    mismatch means some record is bad (the caller then checks one by one)."""
    implied = _stored_crcs(head) ^ crc_vec.advance(_header_crcs(head), size)
    return crc_vec.joined_crc(implied, size) == _crc(joined)


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
        return RecordCheck(0, -1, why, payloads=[])
    if digest.name == "crc32c" and n > 1 and (lengths[:n] == lengths[0]).all():
        check = _check_uniform(data, int(lengths[0]), n, start, ledger_id, first_entry_id,
                               strict)
        if check is not None:
            check.why = why
            return check
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
    return RecordCheck(good, max(top_lac, -1), why, payloads=payloads)


def _check_uniform(data, record_bytes: int, n: int, start: int, ledger_id: int,
                   first_entry_id: int, strict: bool) -> RecordCheck | None:
    """``n`` CRC32C records of one length: the reply as an n x length matrix,
    no per-record Python.  None if any record fails (the caller then finds
    which, one by one)."""
    rows = np.frombuffer(data, np.uint8, n * record_bytes).reshape(n, record_bytes)
    head = rows[:, :start]
    fields = head[:, :HEADER_BYTES].copy().view(_HEADER_DTYPE).ravel()
    size = record_bytes - start
    if not _headers_ok(fields, ledger_id, first_entry_id, np.full(n, size, np.int64),
                       strict).all():
        return None
    joined = rows[:, start:].tobytes()
    if size <= STRIPPED_PAYLOAD_MAX:
        if not _stripped_digests_ok(rows, start):
            return None
    elif not _joined_digests_ok(head, joined, size):
        return None
    return RecordCheck(n, max(int(fields["lac"].max()), -1), None, joined=joined, size=size)


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
    ``lengths`` (``appliance.protocol.read_batch.PackedRecords``), checked in place."""
    if hasattr(records, "lengths"):
        data, lengths = records.data, records.lengths
    else:
        lengths = list(map(len, records))
        data = b"".join(records)
    if not len(lengths):
        return [], -1
    check = check_records(data, np.asarray(lengths, np.int64), ledger_id, first_entry_id,
                          digest, strict=False)
    return check.payload_list(), check.top_lac
