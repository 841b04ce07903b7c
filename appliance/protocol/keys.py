"""Key derivation from a ledger password: pure, deterministic, stdlib only.

* ``master_key(password)``: the 32 bytes every add (and every fencing request)
  carries.  A bookie stores the key of the first add/fence for a ledger and
  refuses requests with another key (``UnauthorizedError``).
* ``password_hash(master_key)``: what ledger metadata stores
  (``LedgerMetadata.password_hash``), so an open can refuse a wrong password
  before it fences anything.  It is a hash of the key, never the key itself.
* ``mac_key(master_key)``: the HMAC key of the ``hmac-sha256`` digest.

Each derivation uses its own domain prefix, so the three values are
unrelated even though they come from one password.
"""

from __future__ import annotations

import hashlib

MASTER_KEY_BYTES = 32

_MASTER_PREFIX = b"bk-appliance/master-key/v1\0"
_HASH_PREFIX = b"bk-appliance/password-hash/v1\0"
_MAC_PREFIX = b"bk-appliance/mac-key/v1\0"


def master_key(password: bytes) -> bytes:
    """The 32-byte master key for ``password`` (``b""`` for no password)."""
    if not isinstance(password, bytes | bytearray | memoryview):
        raise TypeError(f"password must be bytes, got {type(password).__name__}")
    return hashlib.sha256(_MASTER_PREFIX + bytes(password)).digest()


def password_hash(key: bytes) -> bytes:
    """The value ledger metadata stores to check a master key on open."""
    _check_key(key)
    return hashlib.sha256(_HASH_PREFIX + key).digest()


def mac_key(key: bytes) -> bytes:
    """The HMAC key for entry digests of type ``hmac-sha256``."""
    _check_key(key)
    return hashlib.sha256(_MAC_PREFIX + key).digest()


def _check_key(key: bytes) -> None:
    if not isinstance(key, bytes) or len(key) != MASTER_KEY_BYTES:
        raise ValueError(f"master_key must be {MASTER_KEY_BYTES} bytes")
