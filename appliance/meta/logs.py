"""Log metadata (seed 003) on any ``MetadataStore``: one node per log,
``/logs/<name>``, holding ``LogMetadata.to_bytes()`` in the checksummed
envelope of ``records.py``; every change goes through the one
read-transform-CAS-retry loop of ``update_loop.py`` (``update_log``), like
ledgers.

Guarantees: a damaged record is ``CorruptMetadataError`` naming its path; a
missing log is ``NoSuchLogError``; a transform that raises (e.g.
``LogFencedError`` from a superseded writer's epoch) writes nothing; a CAS
conflict is retried by re-reading and re-applying the pure transform, so a
decision is always taken on the current record.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from appliance.errors import (
    CorruptMetadataError,
    NodeExistsError,
    NoNodeError,
    NoSuchLogError,
)
from appliance.meta.records import decode_record, encode_record
from appliance.meta.update_loop import NO_CHANGE, MetadataUpdateLoop
from appliance.protocol import limits
from appliance.protocol.logs import LogMetadata, check_log_name, new_log
from storage.metadata.api import ANY_VERSION, MetadataStore

LOGS_ROOT = "/logs"

LogTransform = Callable[[LogMetadata], LogMetadata | None]


def log_path(name: str) -> str:
    return f"{LOGS_ROOT}/{check_log_name(name)}"


def _decode(name: str, path: str, data: bytes) -> LogMetadata:
    md = LogMetadata.from_bytes(decode_record(data, path), where=path)
    if md.name != name:
        raise CorruptMetadataError(f"{path}: holds log {md.name!r}")
    return md


class LogManager:
    def __init__(self, store: MetadataStore, *, sleep: Callable[[float], None] = time.sleep,
                 rng: random.Random | None = None,
                 clock_ms: Callable[[], int] = lambda: int(time.time() * 1000)):
        self.store = store
        self._loop = MetadataUpdateLoop(store, sleep=sleep, rng=rng)
        self.clock_ms = clock_ms

    def read_log(self, name: str) -> tuple[LogMetadata, int]:
        path = log_path(name)
        try:
            data, version = self.store.get(path)
        except NoNodeError as exc:
            raise NoSuchLogError(f"log {name!r} does not exist") from exc
        return _decode(name, path, data), version

    def log_exists(self, name: str) -> bool:
        return self.store.exists(log_path(name))

    def create_log(self, name: str) -> tuple[LogMetadata, int]:
        """Create the log if it does not exist; its (metadata, version) either way."""
        md = new_log(name, self.clock_ms())
        try:
            self.store.create(log_path(name), encode_record(md.to_bytes()), make_parents=True)
        except NodeExistsError:
            pass
        return self.read_log(name)

    def list_logs(self) -> list[str]:
        try:
            return sorted(self.store.children(LOGS_ROOT))
        except NoNodeError:
            return []

    def segment_ledgers(self) -> dict[int, tuple[str, int]]:
        """Ledger id -> (log name, segment number) of every segment of every
        log (truncated ones too, while their ledgers may remain): the
        ledgers that belong to logs.  One read per log; a log deleted while
        they are read is passed by."""
        out: dict[int, tuple[str, int]] = {}
        for name in self.list_logs():
            try:
                md, _ = self.read_log(name)
            except NoSuchLogError:
                continue
            out.update({s.ledger_id: (name, s.seq) for s in md.segments})
        return out

    def update_log(self, name: str, transform: LogTransform, *,
                   retries_max: int = limits.METADATA_LOG_UPDATE_RETRIES_MAX,
                   ) -> tuple[LogMetadata, int]:
        """Read, apply the pure ``transform``, CAS; a conflict re-reads and
        re-applies.  The transform may raise (nothing written) or return
        ``None`` / the same record (no change)."""
        path = log_path(name)

        def changed_or_not(current: LogMetadata) -> LogMetadata:
            updated = transform(current)
            return NO_CHANGE if updated is None or updated == current else updated

        def missing(exc: Exception) -> Exception:
            return NoSuchLogError(f"log {name!r} does not exist")

        try:
            done = self._loop.update(
                path, changed_or_not, decode=lambda data: _decode(name, path, data),
                encode=lambda md: encode_record(md.to_bytes()), retries_max=retries_max,
                missing_error=missing)
        except NoNodeError as exc:  # deleted between the read and the CAS
            raise NoSuchLogError(f"log {name!r} was deleted") from exc
        return done.value, done.version

    def wait_for_change(self, name: str, version: int,
                        timeout_s: float) -> tuple[LogMetadata, int] | None:
        """Block until the log's version is not ``version`` (None on timeout)."""
        path = log_path(name)
        try:
            changed = self.store.wait_for_change(path, version, timeout_s)
        except NoNodeError as exc:
            raise NoSuchLogError(f"log {name!r} does not exist") from exc
        if changed is None:
            return None
        return LogMetadata.from_bytes(decode_record(changed[0], path), where=path), changed[1]

    def wait_for_log(self, name: str, timeout_s: float) -> bool:
        """Block until log ``name`` exists (True) or ``timeout_s`` passed
        (False): a watch on the logs' folder, no metadata read per poll."""
        path = log_path(name)
        deadline = time.monotonic() + timeout_s
        try:
            self.store.create(LOGS_ROOT, make_parents=True)
        except NodeExistsError:
            pass
        while True:
            known = self.store.children(LOGS_ROOT)
            if path.rsplit("/", 1)[1] in known:
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.store.wait_for_children_change(
                    LOGS_ROOT, known, remaining) is None:
                return self.store.exists(path)

    def delete_log_record(self, name: str, expected_version: int = ANY_VERSION) -> None:
        try:
            self.store.delete(log_path(name), expected_version)
        except NoNodeError as exc:
            raise NoSuchLogError(f"log {name!r} does not exist") from exc
