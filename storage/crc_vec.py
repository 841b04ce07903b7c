"""CRC32C arithmetic over many pieces at once, with numpy: the CRC of a header
advanced over a payload, and the CRC of a concatenation from the CRCs of its
pieces.  This is what lets a reader check a thousand records' checksums with
one ``crc32c`` call over their joined data instead of one call per record.

CRC32C (init and final XOR 0xFFFFFFFF) is affine in its input, so
``crc(A + B) == advance(crc(A), len(B)) ^ crc(B)``, where ``advance(c, n)``
(c times x^(8n) modulo the polynomial) is linear in ``c``: it is applied as
four 256-entry byte tables, derived once per length and cached.  For ``n``
pieces of one length the joined CRC is a tree of ``log2(n)`` such levels.

Guarantees: exact CRC32C values (the tests compare with ``crc32c.crc32c``);
pure functions, no I/O; tables bounded by ``limits.STORAGE_CRC_TABLES_MAX`` cached lengths.
"""

from __future__ import annotations

from functools import lru_cache

import crc32c
import numpy as np

from appliance.protocol import limits

_crc = crc32c.crc32c
_BYTE_BITS = ((np.arange(256)[:, None] >> np.arange(8)) & 1).astype(bool)


def _tables_from_basis(basis: np.ndarray) -> np.ndarray:
    """4 x 256 table of a linear map given by the images of the 32 bits."""
    parts = basis.reshape(4, 8)
    return np.bitwise_xor.reduce(np.where(_BYTE_BITS[None, :, :], parts[:, None, :],
                                          np.uint32(0)), axis=2).astype(np.uint32)


def apply(tables: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The linear map of ``tables`` applied to each uint32 of ``values``."""
    values = values.astype(np.uint32, copy=False)
    out = tables[0][values & 0xFF]
    for j in range(1, 4):
        out ^= tables[j][(values >> (8 * j)) & 0xFF]
    return out


_ONE_BITS = np.uint32(1) << np.arange(32, dtype=np.uint32)


@lru_cache(maxsize=limits.STORAGE_CRC_TABLES_MAX)
def advance_tables(nbytes: int) -> np.ndarray:
    """Tables of ``advance(., nbytes)``.  Small lengths are measured with the
    CRC library over zero bytes; big ones are squared from half the length."""
    if nbytes <= 4096:
        zeros = bytes(nbytes)
        base = _crc(zeros)
        basis = np.array([_crc(zeros, 1 << k) ^ base for k in range(32)], np.uint32)
        return _tables_from_basis(basis)
    half = advance_tables(nbytes // 2)
    basis = apply(half, apply(half, _ONE_BITS))
    if nbytes % 2:
        basis = apply(advance_tables(1), basis)
    return _tables_from_basis(basis)


def advance(values: np.ndarray, nbytes: int) -> np.ndarray:
    """``advance(c, nbytes)`` of each CRC in ``values``."""
    return apply(advance_tables(nbytes), values)


GROUP = 32  # pieces combined per gather: log32(n) levels of a few numpy calls each
# flat index of table (position i, byte j) in group_tables(...).reshape(-1)
_TABLE_BASE = (np.arange(GROUP)[:, None] * 1024 + np.arange(4)[None, :] * 256).astype(np.intp)


@lru_cache(maxsize=limits.STORAGE_CRC_TABLES_MAX)
def group_tables(span: int) -> np.ndarray:
    """Flat (GROUP x 4 x 256) tables: position i of a group is advanced over
    the (GROUP - 1 - i) pieces of ``span`` bytes after it."""
    step = advance_tables(span)
    bases = [_ONE_BITS]
    for _ in range(GROUP - 1):
        bases.append(apply(step, bases[-1]))
    return np.stack([_tables_from_basis(b) for b in reversed(bases)]).reshape(-1)


def joined_crc(crcs: np.ndarray, length: int) -> int:
    """CRC32C of the concatenation of ``len(crcs)`` pieces of ``length``
    bytes each whose own CRC32Cs are ``crcs``."""
    level = np.asarray(crcs, np.uint32)
    span = length
    while len(level) > 1:
        n = len(level)
        groups = np.zeros(-(-n // GROUP) * GROUP, "<u4")
        groups[len(groups) - n:] = level  # leading empty pieces: CRC 0, no effect
        parts = groups.view(np.uint8).reshape(-1, GROUP, 4)  # little-endian bytes
        picked = group_tables(span).take(_TABLE_BASE + parts)
        level = np.bitwise_xor.reduce(picked.reshape(len(parts), -1), axis=1)
        span *= GROUP
    return int(level[0]) if len(level) else 0
