"""Moving sealed log segments to cold storage, and collecting after it.

One segment moves in this order, so that a crash (``kill -9``) at any
point leaves every record readable exactly once, from one tier:

1. read the segment's ledger (closed: it is COMPLETED) into columns and
   check them against the segment's record (count, txids, last DLSN);
2. write one Parquet file under a new, unique name and make it durable
   (fsync of file and folder; an S3 upload completes on close);
3. read the file back and verify it (page checksums, identity, content
   checksum equal to the one computed from the ledger);
4. CAS the segment's metadata to ``tier = cold`` with the file's URI, size
   and checksum: from here readers read the file (until here, the ledger);
5. after ``delete_after_ms``, a later pass deletes the ledger, then records
   ``ledger_deleted`` (a crash between the two: the next pass finds no
   ledger and records it).

A crash before 4 leaves a file no segment names: ``collect`` removes such
orphans once older than ``orphan_grace_ms`` (never a file a live mover may
still be writing).  If the segment changed under the mover (truncated,
deleted, moved by another) the CAS refuses and the mover removes its file.

One mover per log at a time: an ephemeral node ``/cold/movers/<log>`` (gone
with the holder's metadata session: a killed mover's lease lapses with its
session); a second mover gets ``ColdMoverBusyError``.

``on_step`` (default: none): called with each step's name (``STEPS``:
``written``, ``verified``, ``cas``, ``delete``) as the move passes it, on
the mover's thread; the crash tests pass one that kills their own child
process there (``tests/cold/offload_proc.py``).  The product passes none.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

import crc32c

from appliance.cold.segment_file import (
    SegmentColumns,
    check_table,
    encode,
    read_segment,
    with_metadata,
)
from appliance.cold.store import ColdStore
from appliance.errors import BKError, NodeExistsError, NoNodeError, NoSuchLedgerError
from appliance.protocol.log_entry import unpack_entry
from appliance.protocol.logs import (
    COMPLETED,
    DLSN,
    HOT,
    ColdCopy,
    LogMetadata,
    Segment,
    forget_ledger,
    move_to_cold,
)

log = logging.getLogger("appliance.cold")

MOVERS_ROOT = "/cold/movers"
STEPS = ("written", "verified", "cas", "delete")


class ColdMoverBusyError(BKError):
    """Another mover holds the log's lease."""


@dataclass
class PassResult:
    moved: list[int] = field(default_factory=list)  # segment numbers moved now
    bytes_moved: int = 0
    ledgers_deleted: list[int] = field(default_factory=list)
    orphans_removed: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"moved": len(self.moved), "segments": self.moved,
                "bytes": self.bytes_moved, "ledgers_deleted": self.ledgers_deleted,
                "orphans_removed": self.orphans_removed}


def due_before(md: LogMetadata, before: DLSN | None) -> list[Segment]:
    """Sealed hot segments whose every record is before ``before`` (all of
    them when None)."""
    out = []
    for seg in md.live_segments:
        if seg.state != COMPLETED or seg.tier != HOT:
            continue
        end = seg.last_dlsn if seg.last_dlsn is not None else DLSN(seg.seq, 0, 0)
        if before is None or end < before:
            out.append(seg)
    return out


def due_by_age(md: LogMetadata, now_ms: int, after_ms: int) -> list[Segment]:
    """Sealed hot segments started ``after_ms`` or more ago (0: none)."""
    if after_ms <= 0:
        return []
    return [s for s in due_before(md, None) if now_ms - s.ctime_ms >= after_ms]


class Mover:
    """Moves one log's segments (see the module docstring).  ``open_ledger``
    (ledger id -> read handle, no recovery) and ``delete_ledger`` (ledger
    id) carry the caller's right to the ledgers: a password, or the key
    custody of the appliance's own processes."""

    def __init__(self, logs, store: ColdStore, config, *,
                 open_ledger: Callable, delete_ledger: Callable,
                 clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
                 on_step: Callable[[str], object] | None = None, owner: str = ""):
        self.logs = logs
        self.store = store
        self.config = config
        self._open_ledger = open_ledger
        self._delete_ledger = delete_ledger
        self._clock_ms = clock_ms
        self._on_step = on_step
        self._owner = owner or f"pid {os.getpid()}"

    def _step(self, name: str) -> None:
        if self._on_step is not None:
            self._on_step(name)

    @contextmanager
    def lease(self, name: str):
        path = f"{MOVERS_ROOT}/{name}"
        try:
            self.logs.store.create(path, self._owner.encode(), ephemeral=True,
                                   make_parents=True)
        except NodeExistsError:
            raise ColdMoverBusyError(f"log {name!r}: another mover is moving it now "
                                     f"({self._holder(path)}); try again later") from None
        try:
            yield
        finally:
            try:
                self.logs.store.delete(path)
            except NoNodeError:
                pass

    def _holder(self, path: str) -> str:
        try:
            return self.logs.store.get(path)[0].decode(errors="replace")
        except NoNodeError:
            return "gone now"

    # -- one pass ----------------------------------------------------------------------
    def offload(self, name: str, before: DLSN | None = None, *, by_age: bool = False,
                ) -> PassResult:
        """Move the due segments of log ``name`` now, then collect."""
        result = PassResult()
        with self.lease(name):
            md, _ = self.logs.read_log(name)
            due = (due_by_age(md, self._clock_ms(), self.config.offload_after_ms) if by_age
                   else due_before(md, before))
            for seg in due:
                moved = self.move(name, seg)
                if moved is not None:
                    result.moved.append(seg.seq)
                    result.bytes_moved += moved
            self.collect(name, result)
        return result

    def move(self, name: str, seg: Segment) -> int | None:
        """Steps 1-4 for one segment; the file's size, or None if the
        segment changed under the mover (its file removed)."""
        try:
            table, password_hash = self._read_ledger(seg)
        except NoSuchLedgerError:  # truncated or deleted since the pass read the log?
            current = self.logs.read_log(name)[0].segment(seg.seq)
            if current is None or current.state != COMPLETED or current.tier != HOT:
                return None
            raise
        crc = check_table(name, seg, table)
        data = encode(with_metadata(name, seg, table, crc))
        file_crc = crc32c.crc32c(data)
        path = self.store.new_path(name, seg.seq, seg.ledger_id)
        self.store.write(path, data)
        uri = self.store.uri_of(path)
        self._step("written")
        read_segment(self.store.fs, path, name, seg, crc, file_crc, uri)
        self._step("verified")
        copy = ColdCopy(uri=uri, bytes=len(data), crc32c=crc, file_crc32c=file_crc,
                        moved_ms=self._clock_ms(), password_hash=password_hash)
        try:
            self.logs.update_log(name, lambda m: move_to_cold(m, seg.seq, seg.ledger_id, copy))
        except ValueError as exc:
            self.store.delete(uri)
            log.info("cold mover: %s; file removed", exc)
            return None
        self._step("cas")
        log.info("log %s: segment %d (ledger %d, %d records) moved to %s", name, seg.seq,
                 seg.ledger_id, seg.records, ColdStore.public(uri))
        return len(data)

    def _read_ledger(self, seg: Segment):
        """(the segment's records as a table, its ledger's password record)."""
        columns = SegmentColumns(seg.seq)
        rh = self._open_ledger(seg.ledger_id)
        try:
            chunks = rh.read_chunks(0, seg.last_entry_id) if seg.last_entry_id >= 0 else ()
            for chunk in chunks:
                view = memoryview(chunk.payloads)
                offsets = chunk.offsets
                for i in range(chunk.count):
                    header, txids, payloads = unpack_entry(view[offsets[i]:offsets[i + 1]])
                    if not header.control:
                        columns.add_entry(chunk.first_entry_id + i, txids, payloads)
            password_hash = rh.metadata.password_hash
        finally:
            rh.close()
        return columns.table(), password_hash

    # -- after the move -----------------------------------------------------------------
    def collect(self, name: str, result: PassResult | None = None) -> PassResult:
        """Delete the ledgers of cold segments moved ``delete_after_ms`` ago,
        and the log's orphan files older than ``orphan_grace_ms``."""
        result = result if result is not None else PassResult()
        now = self._clock_ms()
        md, _ = self.logs.read_log(name)
        for seg in md.segments:
            if seg.cold is None or seg.ledger_deleted:
                continue
            if now - seg.cold.moved_ms < self.config.delete_after_ms:
                continue
            try:
                self._delete_ledger(seg.ledger_id)
            except NoSuchLedgerError:
                pass
            self._step("delete")
            self.logs.update_log(name, lambda m, seq=seg.seq: forget_ledger(m, seq))
            result.ledgers_deleted.append(seg.ledger_id)
        result.orphans_removed += self.remove_orphans(name, md, now)
        return result

    def collect_deleted_logs(self) -> list[str]:
        """Files of logs that no longer exist (a deletion cut short, or a
        mover that wrote while its log was deleted), once older than
        ``orphan_grace_ms``."""
        removed = []
        for name in sorted(set(self.store.log_folders()) - set(self.logs.list_logs())):
            try:
                with self.lease(name):
                    if self.logs.log_exists(name):  # created since the listing
                        continue
                    removed += self.remove_orphans(name, None, self._clock_ms())
            except ColdMoverBusyError:
                continue
        return removed

    def remove_orphans(self, name: str, md: LogMetadata | None, now_ms: int) -> list[str]:
        """Files of log ``name`` that no segment of ``md`` (None: the log is
        gone) names, once older than ``orphan_grace_ms``."""
        named = {s.cold.uri for s in md.segments if s.cold is not None} if md else set()
        removed = []
        for uri, mtime_s in self.store.files(name):
            if uri in named or now_ms - mtime_s * 1000 < self.config.orphan_grace_ms:
                continue
            # read again: a segment may have been moved since ``md`` was read
            if md is not None and uri in {s.cold.uri for s in self.logs.read_log(name)[0]
                                          .segments if s.cold is not None}:
                continue
            if self.store.delete(uri):
                log.info("log %s: orphan cold file %s removed", name, ColdStore.public(uri))
                removed.append(uri)
        return removed


def offloader(client, password: bytes, *,
              on_step: Callable[[str], object] | None = None) -> Mover:
    """A mover for a client's user, who proves the right to the log's
    ledgers with its ``password`` (``bkctl log offload``); ``on_step``: see
    the module docstring."""
    store = ColdStore.from_config(client.cold_config)
    return Mover(client.logs, store, client.cold_config,
                 open_ledger=lambda lid: client.open_ledger(lid, password, recovery=False),
                 delete_ledger=lambda lid: client.delete_ledger(lid, password),
                 on_step=on_step)
