"""Entry digests and the master key: the integrity half of the entry format.

* ``crc32c``: 4 bytes, hardware CRC32C (the ``crc32c`` C library) chained over
  header then payload.  Catches corruption; forgeable by anyone.
* ``hmac-sha256``: 32 bytes, HMAC-SHA256 keyed from the ledger's master key.
  Catches corruption and entries made without the password.

Both cover the entry header *and* payload, so a record cannot be moved to
another ledger/entry id or have its LAC or length altered unnoticed.  Digest
objects are deterministic and stateless, so the pure protocol core takes one
by constructor injection and the simulation passes these real ones.

This module sits outside ``appliance.protocol`` only because it imports the
``crc32c`` C extension; it does no I/O.
"""

from __future__ import annotations

import hashlib
import hmac
import struct

import crc32c as _crc32c

from appliance.protocol.keys import MASTER_KEY_BYTES, mac_key, master_key, password_hash

__all__ = ["DIGEST_TYPES", "Crc32cDigest", "HmacSha256Digest", "make_digest", "master_key",
           "password_hash", "MASTER_KEY_BYTES"]

DIGEST_TYPES = ("crc32c", "hmac-sha256")
_CRC = struct.Struct(">I")


class Crc32cDigest:
    """CRC32C over header then payload, as 4 big-endian bytes."""

    name = "crc32c"
    size = 4
    __slots__ = ()

    def compute(self, header, payload) -> bytes:
        return _CRC.pack(_crc32c.crc32c(payload, _crc32c.crc32c(header)))

    def __repr__(self) -> str:
        return "Crc32cDigest()"


class HmacSha256Digest:
    """HMAC-SHA256 over header then payload, keyed from the master key."""

    name = "hmac-sha256"
    size = 32
    __slots__ = ("_key",)

    def __init__(self, key: bytes):
        self._key = mac_key(key)

    def compute(self, header, payload) -> bytes:
        mac = hmac.new(self._key, header, hashlib.sha256)
        mac.update(payload)
        return mac.digest()

    def __repr__(self) -> str:  # never print key material
        return "HmacSha256Digest(<key>)"


def make_digest(digest_type: str, master_key: bytes):
    """The digest object for a ledger: ``digest_type`` is ``"crc32c"`` or
    ``"hmac-sha256"``; ``master_key`` is ``master_key(password)``."""
    if digest_type == "crc32c":
        return Crc32cDigest()
    if digest_type == "hmac-sha256":
        return HmacSha256Digest(master_key)
    raise ValueError(f"digest_type must be one of {DIGEST_TYPES}, got {digest_type!r}")
