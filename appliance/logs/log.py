"""A handle on one named log: its writer, readers, truncation, deletion."""

from __future__ import annotations

import logging
import os
import socket

from appliance.errors import NoSuchLedgerError, NoSuchLogError, UnauthorizedError
from appliance.logs.producer import Producer
from appliance.logs.reader import LogReader
from appliance.logs.writer import LogWriter, segment_end
from appliance.meta.logservice import LogServiceRegistry
from appliance.protocol.keys import check_password, master_key
from appliance.protocol.log_entry import read_header
from appliance.protocol.logs import (
    DLSN,
    TRUNCATED,
    LogMetadata,
    check_log_name,
    drop_truncated,
    take_ownership,
    truncate,
)

log = logging.getLogger("appliance.logs")


class Log:
    def __init__(self, client, logs, name: str, password: bytes, config):
        self._client = client
        self._logs = logs
        self.name = check_log_name(name)
        self._password = password
        self._config = config

    def writer(self) -> LogWriter:
        """The log's one writer (the log is created if it does not exist):
        any earlier writer is fenced (``LogFencedError`` on its next write)."""
        owner = f"{socket.gethostname()}:{os.getpid()}"
        return LogWriter(self._client, self._logs, self.name, self._password, self._config,
                         owner)

    def producer(self, producer_id=None, *, resume: bool | None = None) -> Producer:
        """One of any number of writers of the log through the log service
        (``appliance.logs.producer``): ``write`` -> DLSN, ``write_async``,
        ``flush``, ``close``.  ``producer_id``: 16 bytes or 32 hex digits
        (default: random); a producer given its id resumes after the last
        sequence number the log's owner knows for it."""
        if self._password:
            raise ValueError("the log service writes logs without a password")
        return Producer(self._client, self.name, producer_id, resume=resume)

    def log_server(self) -> str | None:
        """The id of the log server that owns the log now, or None."""
        lease = LogServiceRegistry(self._logs.store).owner(self.name)
        return None if lease is None else lease.get("server")

    def service_running(self) -> bool:
        """Is a log server registered (the log service runs)?"""
        return bool(LogServiceRegistry(self._logs.store).servers())

    def reader(self, start: DLSN | str | None = None, start_txid: int | None = None, *,
               via_service: bool | None = None, wait_for_log: bool = False) -> LogReader:
        """A reader from ``start`` (a DLSN, default ``DLSN.FIRST``) or from the
        first record whose txid is >= ``start_txid``.  ``NoSuchLogError`` if
        the log does not exist, unless ``wait_for_log``: then the reader
        waits for the log to be created (``read()`` returns ``[]`` after its
        ``timeout_s`` meanwhile; ``reader.waiting_for_log`` says so) and
        reads it from its start.  ``via_service``: read the records a log
        server owning the log still holds from its read cache (default:
        ``[log] read_via_service``, true); the bookies otherwise."""
        if isinstance(start, str):
            start = DLSN.parse(start)
        elif start is not None and not isinstance(start, DLSN):
            raise TypeError(f"start must be a DLSN or 'seq/entry/slot', got "
                            f"{type(start).__name__}")
        if via_service is None:
            via_service = self._config.read_via_service
        return LogReader(self._client, self._logs, self.name, self._password, start, start_txid,
                         via_service=bool(via_service) and not self._password,
                         wait_for_log=wait_for_log)

    def metadata(self) -> LogMetadata:
        return self._logs.read_log(self.name)[0]

    def confirmed_tail(self, seg) -> dict:
        """What readers can see of an IN_PROGRESS segment now (its metadata
        says nothing until it completes): records, last txid and last DLSN
        up to the ledger's last add confirmed.  One LAC read and one entry
        read; the writer is not disturbed."""
        handle = self._client.open_ledger(seg.ledger_id, password=self._password,
                                          recovery=False)
        try:
            lac = handle.read_lac()
            if lac < 0:
                return {"records": 0, "last_txid": None, "last_dlsn": None}
            head = read_header(handle.read(lac, lac)[0].payload)
        finally:
            handle.close()
        if head.records == 0:
            return {"records": 0, "last_txid": None, "last_dlsn": None}
        return {"records": head.records, "last_txid": head.last_txid,
                "last_dlsn": str(DLSN(seg.seq, head.last_entry, head.last_slot))}

    def exists(self) -> bool:
        return self._logs.log_exists(self.name)

    def truncate(self, before: DLSN | str) -> list[int]:
        """Drop the whole segments entirely before ``before`` (the segment
        holding it stays) and delete their ledgers; returns the segment
        numbers dropped.  Finishes an earlier truncation cut short."""
        before = DLSN.parse(before)
        md, _ = self._logs.update_log(self.name, lambda m: truncate(m, before))
        return self._drop_truncated(md)

    def _drop_truncated(self, md: LogMetadata) -> list[int]:
        doomed = [s for s in md.segments if s.state == TRUNCATED]
        for seg in doomed:
            self._delete_segment(seg)
        seqs = {s.seq for s in doomed}
        if seqs:
            self._logs.update_log(self.name, lambda m: drop_truncated(m, seqs))
        return sorted(seqs)

    def delete(self) -> None:
        """Fence any writer, delete every segment's ledger, then the log.  The
        password is checked against a segment's ledger first: a wrong one
        (``UnauthorizedError``) leaves the log and its writer untouched."""
        self._check_password(self._logs.read_log(self.name)[0])
        md, _ = self._logs.update_log(self.name, lambda m: take_ownership(m, "deleting"))
        seg = md.in_progress
        if seg is not None:  # fence its writer: no add after this is acknowledged
            segment_end(self._client, seg.seq, seg.ledger_id, self._password)
        for seg in md.segments:
            self._delete_segment(seg)
        try:
            self._logs.delete_log_record(self.name)
        except NoSuchLogError:
            pass
        log.info("log %s deleted (%d segments)", self.name, len(md.segments))


    def _delete_segment(self, seg) -> None:
        """Delete a segment's ledger and, if it is cold, its file."""
        if not seg.ledger_deleted:
            try:
                self._client.delete_ledger(seg.ledger_id, self._password)
            except NoSuchLedgerError:
                pass
        if seg.cold is not None:
            # on use: the cold room needs pyarrow (the spark extra); logs that
            # never went cold never load it
            from appliance.cold.reading import delete_file

            delete_file(self._client.cold_config, seg.cold.uri)

    def _check_password(self, md: LogMetadata) -> None:
        for seg in md.segments:
            try:
                record = self._client.ledgers.read_ledger(seg.ledger_id)[0].password_hash
            except NoSuchLedgerError:
                if seg.cold is None:
                    continue
                record = seg.cold.password_hash  # moved: the ledger's record kept
            if not check_password(record, master_key(self._password)):
                raise UnauthorizedError(f"wrong password for log {self.name}: not deleted")
            return


def describe(md: LogMetadata) -> dict:
    doc = md.describe()
    doc["in_progress"] = md.in_progress.seq if md.in_progress is not None else None
    doc["records"] = md.records
    return doc

