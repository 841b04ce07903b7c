"""Key derivation from a ledger password: pure, deterministic, stdlib only.

* ``master_key(password)``: the 32 bytes every add (and every fencing request)
  carries.  A bookie stores the key of the first add/fence for a ledger and
  refuses requests with another key (``UnauthorizedError``).
* ``password_record(master_key, salt)``: what ledger metadata stores
  (``LedgerMetadata.password_hash``), so an open can refuse a wrong password
  before it fences anything: a salted scrypt of the key, versioned
  (``check_password`` accepts it and the v1 record, ``password_hash``: an
  unsalted SHA-256 that ledgers created before stay readable with).
* ``mac_key(master_key)``: the HMAC key of the ``hmac-sha256`` digest.

Each derivation uses its own domain prefix, so the three values are
unrelated even though they come from one password.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import struct

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


# v2 password record: b"\x02", u8 log2(N), u8 r, u8 p, 16-byte salt, 32-byte scrypt
RECORD_V2 = 2
SCRYPT_LOG2_N, SCRYPT_R, SCRYPT_P = 14, 8, 1  # ~16 MB and tens of ms per derivation
SALT_BYTES = 16
_V2 = struct.Struct("<BBBB16s32s")


def password_record(key: bytes, salt: bytes, log2_n: int = SCRYPT_LOG2_N, r: int = SCRYPT_R,
                    p: int = SCRYPT_P) -> bytes:
    """The v2 record of ``key``: scrypt with ``salt`` (random, chosen by the
    caller: this module has no randomness), its parameters beside it."""
    _check_key(key)
    if len(salt) != SALT_BYTES:
        raise ValueError(f"salt must be {SALT_BYTES} bytes")
    return _V2.pack(RECORD_V2, log2_n, r, p, salt, _scrypt(key, salt, log2_n, r, p))


def check_password(record: bytes | None, key: bytes) -> bool:
    """True if ``key`` matches a stored record (None: the ledger has none).
    v1 (32 bytes): ``password_hash``; v2: ``password_record``; anything else
    matches nothing.  Derivations are memoised (one per salt and key)."""
    if record is None:
        return True
    _check_key(key)
    if len(record) == 32:  # v1, before salted records
        return hmac.compare_digest(record, password_hash(key))
    if len(record) != _V2.size or record[0] != RECORD_V2:
        return False
    _v, log2_n, r, p, salt, digest = _V2.unpack(record)
    if not (10 <= log2_n <= 20 and 1 <= r <= 32 and 1 <= p <= 16):
        return False  # not ours, or a record made to burn our CPU or memory
    return hmac.compare_digest(digest, _scrypt(key, salt, log2_n, r, p))


@functools.lru_cache(maxsize=4096)
def _scrypt(key: bytes, salt: bytes, log2_n: int, r: int, p: int) -> bytes:
    n = 1 << log2_n
    return hashlib.scrypt(key, salt=salt, n=n, r=r, p=p, maxmem=256 * r * n, dklen=32)


def mac_key(key: bytes) -> bytes:
    """The HMAC key for entry digests of type ``hmac-sha256``."""
    _check_key(key)
    return hashlib.sha256(_MAC_PREFIX + key).digest()


def _check_key(key: bytes) -> None:
    if not isinstance(key, bytes) or len(key) != MASTER_KEY_BYTES:
        raise ValueError(f"master_key must be {MASTER_KEY_BYTES} bytes")
