"""Ledger metadata on any ``MetadataStore``: ids, records, and the one
read-transform-CAS-retry loop every change goes through.

Guarantees (checked on SQLite and ZooKeeper by ``tests/metadata``):

* Ledger ids are unique 64-bit integers (0 .. 2**63-1), never reused, even
  after a delete: they come from a persistent counter node advanced by CAS
  (an id whose ledger node was never written, because its creator crashed,
  is skipped, not reused).
* A ledger's record is ``LedgerMetadata.to_bytes()`` in the checksummed
  envelope of ``records.py``; a damaged record raises
  ``CorruptMetadataError`` naming its path, as does a record filed under
  another ledger's id.
* Every change is a compare-and-swap on the version that was read, through
  the one loop of ``update_loop.py``: ``update_ledger`` retries a conflict by
  re-reading and re-applying the pure transform (at most ``retries_max``
  times), and so does id allocation on the counter node; with
  ``expected_version`` it CASes exactly on that version, once, which is what
  ensemble changes and close conflicts need.  ``write_ledger`` is the single
  CAS the pure core's decisions are written with (the core re-reads itself).
* Transitions that would break the protocol (another ledger id, changed
  quorums, digest or password, a state going backwards, a closed ledger's
  last entry moving) are refused by ``invariant()``: they are bugs.
* A ``MetadataUnavailableError`` during a CAS is not retried here: its outcome
  is unknown, so the caller re-reads and decides.

Layout: ``/ledgers/idgen`` (next id), ``/ledgers/ids/<bucket>/<id>`` with
zero-padded names, 10,000 ledgers per bucket (ZooKeeper lists children in
one packet, so no node gets millions of them).
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable

from appliance.errors import (
    CorruptMetadataError,
    NoNodeError,
    NoSuchLedgerError,
    NotEmptyError,
)
from appliance.meta.records import decode_record, encode_record
from appliance.meta.update_loop import NO_CHANGE, MetadataUpdateLoop
from appliance.protocol import limits
from appliance.protocol.invariant import invariant
from appliance.protocol.metadata import CLOSED, IN_RECOVERY, OPEN, LedgerMetadata
from storage.metadata.api import ANY_VERSION, MetadataStore

LEDGERS_ROOT = "/ledgers"
IDGEN_PATH = "/ledgers/idgen"
IDS_ROOT = "/ledgers/ids"
LEDGERS_PER_BUCKET = 10_000
NEW_LEDGER_VERSION = 0  # the version of a ledger record just created

_STATE_ORDER = {OPEN: 0, IN_RECOVERY: 1, CLOSED: 2}

Transform = Callable[[LedgerMetadata], LedgerMetadata | None]


def check_ledger_id(ledger_id: object) -> int:
    if not isinstance(ledger_id, int) or isinstance(ledger_id, bool):
        raise TypeError(f"ledger_id must be an int, got {type(ledger_id).__name__}")
    if not 0 <= ledger_id <= limits.LEDGER_ID_MAX:
        raise ValueError(f"ledger_id must be in 0..2**63-1, got {ledger_id}")
    return ledger_id


def bucket_path(ledger_id: int) -> str:
    return f"{IDS_ROOT}/{ledger_id // LEDGERS_PER_BUCKET:015d}"


def ledger_path(ledger_id: int) -> str:
    return f"{bucket_path(check_ledger_id(ledger_id))}/{ledger_id:019d}"


def check_transition(old: LedgerMetadata, new: LedgerMetadata, where: str) -> None:
    """Refuse (as a bug) a change no protocol step makes."""
    invariant(new.ledger_id == old.ledger_id, f"{where}: ledger id changed to {new.ledger_id}")
    fixed = ("ensemble_size", "write_quorum", "ack_quorum", "digest_type", "password_hash",
             "sealed_key")
    for name in fixed:
        invariant(getattr(new, name) == getattr(old, name), f"{where}: {name} changed")
    invariant(_STATE_ORDER[new.state] >= _STATE_ORDER[old.state],
              f"{where}: state went back from {old.state} to {new.state}")
    if old.state == CLOSED:
        invariant(new.last_entry_id == old.last_entry_id,
                  f"{where}: closed ledger's last entry moved {old.last_entry_id} -> "
                  f"{new.last_entry_id}")


class LedgerManager:
    """Ledger metadata CRUD on a store.  ``sleep`` and ``rng`` (conflict
    back-off) and ``clock_ms`` (creation time) are injectable."""

    def __init__(self, store: MetadataStore, *, sleep: Callable[[float], None] = time.sleep,
                 rng: random.Random | None = None,
                 clock_ms: Callable[[], int] = lambda: int(time.time() * 1000)):
        self.store = store
        self._loop = MetadataUpdateLoop(store, sleep=sleep, rng=rng)
        self._clock_ms = clock_ms

    # -- create -----------------------------------------------------------------
    def create_ledger(self, ensemble_size: int, write_quorum: int, ack_quorum: int,
                      ensemble: list[str], digest_type: str = "crc32c",
                      password_hash: bytes | None = None, custom: dict[str, str] | None = None,
                      ctime_ms: int | None = None,
                      sealed_key: bytes | None = None) -> LedgerMetadata:
        """Allocate an id and store a new OPEN ledger (version
        ``NEW_LEDGER_VERSION``).  Arguments are checked before anything is
        written."""
        if password_hash is not None and not isinstance(password_hash, bytes):
            raise TypeError("password_hash must be bytes or None")
        custom = dict(custom or {})
        for key, value in custom.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise TypeError("custom metadata must map str to str")
        template = LedgerMetadata(
            ledger_id=0, ensemble_size=ensemble_size, write_quorum=write_quorum,
            ack_quorum=ack_quorum, ensembles=((0, tuple(ensemble)),), digest_type=digest_type,
            password_hash=password_hash, sealed_key=sealed_key,
            ctime_ms=self._clock_ms() if ctime_ms is None else int(ctime_ms),
            custom=tuple(sorted(custom.items())))
        metadata = dataclasses.replace(template, ledger_id=self._allocate_id())
        record = encode_record(metadata.to_bytes())
        path = ledger_path(metadata.ledger_id)
        for _ in range(limits.METADATA_BUCKET_RETRIES_MAX):
            try:
                self.store.create(path, record, make_parents=True)
                return metadata
            except NoNodeError:  # the bucket was deleted under us: make it again
                continue
        raise NoNodeError(f"{bucket_path(metadata.ledger_id)}: bucket vanished "
                          f"{limits.METADATA_BUCKET_RETRIES_MAX} times while creating {path}")

    def _allocate_id(self) -> int:
        """Advance the counter node by CAS (created on first use); the id taken."""
        taken = self._loop.update(
            IDGEN_PATH, lambda next_id: (next_id or 0) + 1, decode=self._decode_counter,
            encode=lambda next_id: encode_record(str(next_id).encode()),
            retries_max=limits.METADATA_LEDGER_ID_RETRIES_MAX, create_missing=True,
            action="allocating a ledger id")
        return taken.value - 1

    @staticmethod
    def _decode_counter(data: bytes) -> int:
        body = decode_record(data, IDGEN_PATH)
        if not body.isdigit() or int(body) > limits.LEDGER_ID_MAX:
            raise CorruptMetadataError(f"{IDGEN_PATH}: bad ledger id counter {body[:40]!r}")
        return int(body)

    # -- read -------------------------------------------------------------------
    def read_ledger(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        """(metadata, version); ``NoSuchLedgerError`` if there is none."""
        path = ledger_path(ledger_id)
        try:
            data, version = self.store.get(path)
        except NoNodeError as exc:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist") from exc
        return self._decode(ledger_id, path, data), version

    @staticmethod
    def _decode(ledger_id: int, path: str, data: bytes) -> LedgerMetadata:
        metadata = LedgerMetadata.from_bytes(decode_record(data, path), where=path)
        if metadata.ledger_id != ledger_id:
            raise CorruptMetadataError(f"{path}: holds ledger {metadata.ledger_id}, "
                                       f"not {ledger_id}")
        return metadata

    def ledger_exists(self, ledger_id: int) -> bool:
        return self.store.exists(ledger_path(ledger_id))

    def list_ledgers(self) -> list[int]:
        """Every ledger id, ascending."""
        ids: list[int] = []
        try:
            buckets = self.store.children(IDS_ROOT)
        except NoNodeError:
            return ids
        for bucket in buckets:
            try:
                names = self.store.children(f"{IDS_ROOT}/{bucket}")
            except NoNodeError:  # deleted since it was listed: it was empty
                continue
            for name in names:
                if not name.isdigit():
                    raise CorruptMetadataError(f"{IDS_ROOT}/{bucket}/{name}: not a ledger id")
                ids.append(int(name))
        return sorted(ids)

    def wait_for_change(self, ledger_id: int, version: int,
                        timeout_s: float) -> tuple[LedgerMetadata, int] | None:
        """Block until the ledger's version is not ``version``; the new
        (metadata, version), or ``None`` on timeout; ``NoSuchLedgerError`` if
        it does not exist or is deleted."""
        path = ledger_path(ledger_id)
        try:
            changed = self.store.wait_for_change(path, version, timeout_s)
        except NoNodeError as exc:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist") from exc
        if changed is None:
            return None
        return self._decode(ledger_id, path, changed[0]), changed[1]

    # -- change -----------------------------------------------------------------
    def write_ledger(self, metadata: LedgerMetadata, expected_version: int) -> int:
        """CAS ``metadata`` exactly on ``expected_version`` (no retry); the new
        version.  ``MetadataVersionError`` if the ledger changed since."""
        path = ledger_path(metadata.ledger_id)
        if expected_version == ANY_VERSION:
            raise ValueError("write_ledger needs the version the metadata was derived from")
        try:
            return self.store.set(path, encode_record(metadata.to_bytes()), expected_version)
        except NoNodeError as exc:
            raise NoSuchLedgerError(f"ledger {metadata.ledger_id} does not exist") from exc

    def update_ledger(self, ledger_id: int, transform: Transform, *,
                      retries_max: int = limits.METADATA_LEDGER_UPDATE_RETRIES_MAX,
                      expected_version: int | None = None) -> tuple[LedgerMetadata, int]:
        """Read, apply the pure ``transform``, CAS; on a conflict re-read and
        re-apply (at most ``retries_max`` conflicts).  The transform may raise
        to abort (nothing is written) or return ``None`` for "no change".
        With ``expected_version``: one attempt, and only if the ledger is still
        at that version.  Returns the (metadata, version) now stored."""
        path = ledger_path(ledger_id)

        def checked(current: LedgerMetadata) -> LedgerMetadata:
            updated = transform(current)
            if updated is None or updated == current:
                return NO_CHANGE
            check_transition(current, updated, path)
            return updated

        try:
            done = self._loop.update(
                path, checked, decode=lambda data: self._decode(ledger_id, path, data),
                encode=lambda md: encode_record(md.to_bytes()), retries_max=retries_max,
                expected_version=expected_version)
        except NoNodeError as exc:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist") from exc
        return done.value, done.version

    # -- delete -----------------------------------------------------------------
    def delete_ledger(self, ledger_id: int, expected_version: int = ANY_VERSION) -> None:
        """Delete the ledger's metadata (its id is never handed out again)."""
        path = ledger_path(ledger_id)
        try:
            self.store.delete(path, expected_version)
        except NoNodeError as exc:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist") from exc
        try:  # drop the bucket once empty; a concurrent create re-makes it
            self.store.delete(bucket_path(ledger_id))
        except (NotEmptyError, NoNodeError):
            pass
