"""Ledger key custody: where a bookie gets a ledger's master key without an
operator (BP-46 repair today, automatic re-replication next).

The answer, once for both:

* The appliance has one **cluster key pair** (X25519, libsodium through
  PyNaCl).  The private key lives in a file only the appliance's account can
  read (``server.cluster_key_file``, default ``<run dir>/cluster.key``, mode
  0600); the public key is published in the metadata store
  (``/custody/cluster-key``).  The first bookie that boots without either
  creates both.
* A client creating a ledger **seals** the master key to the public key
  (``crypto_box_seal``: anonymous sender, only the private key opens it) and
  stores the result in the ledger's metadata (``LedgerMetadata.sealed_key``,
  fixed for the ledger's life).  Clients never need the private key.
* A bookie repairing itself (or a replication worker) **opens** it with the
  private key and accepts the result only if it matches the ledger's stored
  password check (``password_hash``): a sealed key copied from another
  ledger, or forged by someone who can write metadata, is refused.
* A bookie that still holds a ledger's key in its own index uses that one
  (it was checked on the ledger's first add or fence); the sealed copy is
  needed after a lost disk.

Trust model: whoever can read the private key file can obtain every ledger's
key (the bookies and the appliance's administrator: the same account that
can read the bookies' data directories anyway).  Whoever can read the
metadata store learns nothing about keys.  Whoever can *write* the metadata
store can replace the published public key, so ledgers created afterwards
would be sealed to a key of theirs: metadata write access is already a trust
boundary (it can re-point ensembles and delete ledgers), and a bookie whose
private key no longer matches the published public key says so at boot.
Ledgers created before this release (no sealed key) are repaired with the
bookie's own stored key when it has one.

The public key is published through the one read / transform / CAS loop of
``update_loop.py`` (created when absent; a concurrent publisher's key wins
and is the one compared).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path

from appliance.errors import NoNodeError
from appliance.meta.update_loop import NO_CHANGE, MetadataUpdateLoop
from appliance.protocol import limits
from appliance.protocol.keys import MASTER_KEY_BYTES, check_password
from storage.aligned_io import make_dirs

log = logging.getLogger(__name__)

PUBLIC_KEY_PATH = "/custody/cluster-key"
KEY_FILE_FORMAT = 1


class CustodyError(Exception):
    """The cluster key cannot be used (file damaged, or not the published one)."""


def _nacl():
    from nacl.public import PrivateKey, PublicKey, SealedBox

    return PrivateKey, PublicKey, SealedBox


def read_public_key(store) -> bytes | None:
    """The published cluster public key (32 bytes), or None."""
    try:
        data, _ = store.get(PUBLIC_KEY_PATH)
    except NoNodeError:
        return None
    return _public_key_of(data)


def _public_key_of(data: bytes) -> bytes:
    return bytes.fromhex(json.loads(data)["public_key"])


def seal(public_key: bytes, master_key: bytes) -> bytes:
    """``master_key`` sealed to the cluster ``public_key``."""
    _, PublicKey, SealedBox = _nacl()
    return SealedBox(PublicKey(public_key)).encrypt(master_key)


class KeyCustody:
    """Opens sealed ledger keys with the cluster private key."""

    def __init__(self, private_key: bytes):
        PrivateKey, _, SealedBox = _nacl()
        self._private = PrivateKey(private_key)
        self._box = SealedBox(self._private)
        self.public_key = bytes(self._private.public_key)

    def unseal(self, md, *, checked: bool = True) -> bytes | None:
        """The master key of ledger ``md``, or None when its metadata carries
        no sealed key, the seal does not open, or the key does not match the
        ledger's password check.  ``checked=False`` skips that check (a
        scrypt, tens of ms): for a key only shown to bookies, which refuse a
        wrong one themselves (the auditor's probes)."""
        from nacl.exceptions import CryptoError

        if md.sealed_key is None:
            return None
        try:
            key = self._box.decrypt(md.sealed_key)
        except CryptoError:
            log.warning("ledger %d: its sealed key does not open with this cluster key",
                        md.ledger_id)
            return None
        if len(key) != MASTER_KEY_BYTES or (checked
                                             and not check_password(md.password_hash, key)):
            log.warning("ledger %d: its sealed key does not match its password check; "
                        "ignored", md.ledger_id)
            return None
        return key


def _encode_key_file(private_key: bytes) -> bytes:
    body = {"format": KEY_FILE_FORMAT, "private_key": private_key.hex()}
    check = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
    return json.dumps({**body, "sha256": check}, sort_keys=True).encode() + b"\n"


def _decode_key_file(path: Path) -> bytes:
    try:
        doc = json.loads(path.read_bytes())
        body = {"format": doc["format"], "private_key": doc["private_key"]}
        if hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest() != doc["sha256"]:
            raise ValueError("checksum mismatch")
        if doc["format"] != KEY_FILE_FORMAT:
            raise ValueError(f"unknown format {doc['format']!r}")
        key = bytes.fromhex(doc["private_key"])
        if len(key) != 32:
            raise ValueError("wrong key length")
        return key
    except (ValueError, KeyError, TypeError) as exc:
        raise CustodyError(f"cluster key file {path} is damaged ({exc}): restore it from a "
                           "backup or another host of this appliance") from exc


def _create_key_file(path: Path) -> None:
    """Create ``path`` with a new private key unless it exists (atomic: a
    concurrent creator's file wins and is kept)."""
    PrivateKey, _, _ = _nacl()
    make_dirs(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=".cluster-key-", dir=path.parent)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, _encode_key_file(bytes(PrivateKey.generate())))
        os.fsync(fd)
        os.close(fd)
        fd = -1
        try:
            os.link(tmp, path)  # fails if another process created it first
        except FileExistsError:
            return
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    finally:
        if fd >= 0:
            os.close(fd)
        os.unlink(tmp)


def open_custody(store, key_file: Path) -> KeyCustody | None:
    """The cluster key for a bookie: created (file and published public key)
    when neither exists; None, after one log line naming the fix, when the
    file is missing while another public key is published, or the file's key
    is not the published one (repair then uses only keys the bookie holds)."""
    key_file = Path(key_file)
    published = read_public_key(store)
    if not key_file.exists():
        if published is not None:
            log.error("cluster key file %s is missing, but the metadata store already has "
                      "a cluster key: copy the key file from the host that has it; until "
                      "then this bookie can repair only ledgers whose keys it still holds",
                      key_file)
            return None
        _create_key_file(key_file)
    custody = KeyCustody(_decode_key_file(key_file))
    if published is None:
        doc = json.dumps({"format": KEY_FILE_FORMAT, "public_key": custody.public_key.hex()})
        done = MetadataUpdateLoop(store).update(
            PUBLIC_KEY_PATH, lambda current: doc.encode() if current is None else NO_CHANGE,
            decode=lambda data: data, encode=lambda data: data,
            retries_max=limits.METADATA_CREATE_RACE_RETRIES_MAX, create_missing=True)
        if done.changed:
            log.info("published the cluster public key (private key in %s)", key_file)
            return custody
        published = _public_key_of(done.value)
    if published != custody.public_key:
        log.error("cluster key file %s does not hold the private key of the cluster key "
                  "published in the metadata store: it belongs to another appliance or was "
                  "replaced; restore the right file.  Until then this bookie can repair only "
                  "ledgers whose keys it still holds", key_file)
        return None
    return custody
