"""A reader of a log (``Log.reader()``): from a position or a txid, across
segments, tailing the in-progress one.

* Records come in DLSN order, each once; control entries are skipped.
* Completed segments are read to their last entry; the in-progress one up
  to its ledger's LAC, waiting for more with WAIT_LAC long polls
  (``ReadHandle.wait_for_lac``).  Between polls (every ``POLL_S``) the log's
  metadata is read again, so a segment completed by a rollover or by a new
  writer's recovery is read to its end and the reader moves on.
* ``read()`` returns what is there at once; only when nothing is, it waits up
  to ``timeout_s`` for the first new record.  A reader resumed at
  ``last.dlsn.next()`` sees every later record once, with no gap.
* Bookies out of reach (a retryable ``BKError``: a bookie killed, or
  restarted and not reconnected yet, leaving too few of a segment's
  ensemble to open or read it) are tried again from the same position
  until ``timeout_s``, and only then is the error raised.  An error never
  costs records: those read before it are returned first, and the reader
  stays usable, going on from its position at the next ``read()``.
* A cold segment (moved to cold storage, ``appliance.cold``) is read from
  its file, verified whole before any of its records is delivered, with the
  same DLSNs and txids; a reader whose hot segment moves and loses its
  ledger under it goes on from the file at the same position.
* Through the log service (``via_service``, docs/LOGS.md "Tailing
  readers"): while a log server owns the log, records the owner still holds
  in its read cache come from there (``appliance.logs.tail``), one long
  poll per read, so many tailing readers cost the bookies about what one
  costs; everything else (older records, no owner, a cache miss, an owner
  that stopped answering) from the bookies as above.  The reader's position
  decides both, so it never repeats or skips a record when it moves
  between them.  A record served by the owner may belong to a segment
  truncated a moment before (as a record already read would).
* Read your writes: at the bookies' LAC of the in-progress segment, a
  reader through the service asks the owner (also when ``read()`` does not
  wait).  An owner that cannot serve the position says how far its writer
  had entries acknowledged, and the reader reads the bookies that far
  (``ReadHandle.learn_lac``): the last entry's acknowledgement reaches the
  bookies only with the next entry, so without it a record whose write
  returned could stay unseen until the owner's next entry.
* A log that does not exist is ``NoSuchLogError`` when the reader is made,
  unless it is made with ``wait_for_log=True`` (``bkctl log read
  --follow``, like ``tail -F``): then ``read()`` returns ``[]`` after its
  ``timeout_s`` until the log is created, and reads from its first record
  (or ``start`` / ``start_txid``) once it is.
* ``DLSN.FIRST`` (the default) is before every record: a reader from it
  starts at the first record still there, also after a truncation made
  before its first record was delivered.  A
  position inside the truncated range is ``LogTruncatedError`` (also when a
  truncation overtakes a slow reader).
"""

from __future__ import annotations

import time
from itertools import repeat
from typing import NamedTuple

from appliance.errors import (
    BKError,
    ClientClosedError,
    LogTruncatedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    NoSuchLogError,
    UnauthorizedError,
)
from appliance.protocol import limits
from appliance.protocol.keys import check_password, master_key
from appliance.protocol.log_entry import unpack_entry
from appliance.protocol.logs import COLD, COMPLETED, DLSN, check_txid, dlsn_of

from .tail import ServiceTail

POLL_S = 0.2  # longest LAC wait before the log's metadata is looked at again


class LogRecord(NamedTuple):
    dlsn: DLSN
    txid: int
    payload: bytes


class LogReader:
    def __init__(self, client, logs, name: str, password: bytes, start: DLSN | None = None,
                 start_txid: int | None = None, via_service: bool = False,
                 wait_for_log: bool = False):
        if start is not None and start_txid is not None:
            raise ValueError("give start or start_txid, not both")
        self._client = client
        self._logs = logs
        self.name = name
        self._password = password
        self._start = (DLSN.parse(start) if start is not None else None, start_txid)
        if start_txid is not None:
            check_txid(start_txid)
        self._md = self._version = None  # None: waiting for the log to be created
        self._min_txid = None
        self._at_start = False
        self._pos = DLSN.FIRST if self._start[0] is None else self._start[0]
        try:
            self._begin(*logs.read_log(name))
        except NoSuchLogError:
            if not wait_for_log:
                raise
        self._seg = None
        self._rh = None
        self._next_entry = 0
        self._pending: list[LogRecord] = []  # decoded, not delivered yet
        self._taken = 0  # of _pending, delivered already
        self._cold_queued = False  # a cold segment's records were just queued
        self._closed = False
        self._tail = ServiceTail(client, name) if via_service else None

    def _begin(self, md, version) -> None:
        """The log exists: fix the start position from its metadata."""
        self._md, self._version = md, version
        start, start_txid = self._start
        if start_txid is not None:
            self._min_txid = start_txid
            self._pos = self._txid_start(start_txid)
            return
        self._pos = start if start is not None else DLSN.FIRST
        # from DLSN.FIRST, until a record is delivered: follow truncations
        self._at_start = self._pos.seq == 0
        self._md.check_readable(self._pos)  # DLSN.FIRST: the first record still there
        self._pos = max(self._pos, self._md.truncated_before)

    @property
    def waiting_for_log(self) -> bool:
        """True while the log does not exist yet (``wait_for_log``)."""
        return self._md is None

    def _await_log(self, deadline: float) -> bool:
        """``wait_for_log``: wait until the log exists or ``deadline``; True
        once it does (the start position is then fixed)."""
        while True:
            try:
                self._begin(*self._logs.read_log(self.name))
                return True
            except NoSuchLogError:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._logs.wait_for_log(self.name, min(remaining, POLL_S))

    @property
    def position(self) -> DLSN:
        """Where the next ``read()`` continues (after the last delivered record)."""
        if self._taken < len(self._pending):
            return self._pending[self._taken].dlsn
        return self._pos

    def _txid_start(self, txid: int) -> DLSN:
        """The first segment that may hold a record with a txid >= ``txid``."""
        for seg in self._md.live_segments:
            if seg.state != COMPLETED or (seg.records and seg.last_txid >= txid):
                return DLSN(seg.seq, 0, 0)
        return DLSN(self._md.next_seq, 0, 0)

    # -- reading -----------------------------------------------------------------------
    def read(self, max_records: int = 1000, timeout_s: float = 1.0) -> list[LogRecord]:
        """Up to ``max_records`` records, in order; waits up to ``timeout_s``
        only while there is none (``[]`` when none came).  An error met after
        some records were taken returns them (the next call meets it
        again); the position stays after the last record returned."""
        if not isinstance(max_records, int) or max_records < 1:
            raise ValueError(f"max_records must be an int >= 1, got {max_records!r}")
        if self._closed:
            raise ClientClosedError(f"reader of log {self.name!r} is closed")
        deadline = time.monotonic() + max(0.0, timeout_s)
        if self._md is None and not self._await_log(deadline):
            return []
        out: list[LogRecord] = []
        while len(out) < max_records:
            pending, taken = self._pending, self._taken
            if taken < len(pending):
                take = pending[taken:taken + max_records - len(out)]
                out += take
                self._at_start = False
                self._pos = take[-1].dlsn.next()
                self._taken = taken = taken + len(take)
                if taken >= len(pending):
                    self._pending, self._taken = [], 0
            if len(out) >= max_records:
                break
            try:
                if not self._fetch(not out, deadline, max_records - len(out)):
                    break
            except BKError:
                if not out:
                    raise
                break  # delivered first: the position is after them
        return out

    def __iter__(self):
        """Every record from the start position on, tailing forever."""
        while True:
            yield from self.read(timeout_s=POLL_S)

    def _refresh(self) -> None:
        self._md, self._version = self._logs.read_log(self.name)

    def _fetch(self, wait: bool, deadline: float, want: int = 1) -> bool:
        """Decode more records into the pending queue; False when there is
        nothing more now (after waiting until ``deadline`` if ``wait``).
        Bookies out of reach: the segment is opened again from the position
        until ``deadline``, then the error is raised."""
        while True:
            try:
                return self._fetch_now(wait, deadline, want)
            except BKError as exc:
                if not exc.retryable:
                    raise
                self._drop_segment()  # opened again from the position
                remaining = deadline - time.monotonic()
                if not wait or remaining <= 0:
                    raise
                # a pause, cut short by a change of the log (a segment completed)
                changed = self._logs.wait_for_change(self.name, self._version,
                                                     min(remaining, POLL_S))
                if changed is not None:
                    self._md, self._version = changed

    def _fetch_now(self, wait: bool, deadline: float, want: int) -> bool:
        """``_fetch`` without the retries."""
        if self._tail_due():
            got = self._fetch_service(wait, deadline, want)
            if got is not None:
                return got
        while True:
            seg = self._segment()
            if self._cold_queued:
                self._cold_queued = False
                return True
            if seg is None:  # past the last segment: wait for the writer to start one
                remaining = deadline - time.monotonic()
                if not wait or remaining <= 0:
                    return False
                if self._tail_due():
                    got = self._fetch_service(wait, deadline, want)
                    if got is not None:
                        return got
                    continue
                changed = self._logs.wait_for_change(self.name, self._version,
                                                     min(remaining, POLL_S))
                if changed is not None:
                    self._md, self._version = changed
                continue
            end = seg.last_entry_id if seg.state == COMPLETED \
                else self._rh.last_add_confirmed
            if self._next_entry <= end:
                last = min(end, self._next_entry + limits.LOG_READ_ENTRIES_MAX - 1)
                if self._read_entries(seg, last):
                    return True
                continue
            if seg.state == COMPLETED:
                self._leave_segment(seg.seq + 1)
                continue
            if self._tail is not None:
                # every record before the next entry is delivered or skipped
                self._pos = max(self._pos, DLSN(seg.seq, self._next_entry, 0))
                if self._learn_confirmed(seg.seq):
                    continue
            remaining = deadline - time.monotonic()
            if self._tail_due():
                got = self._fetch_service(wait and remaining > 0, deadline, want)
                if got is not None:
                    return got
                continue
            if not wait or remaining <= 0:
                return False
            lac = self._rh.wait_for_lac(self._next_entry - 1, min(remaining, POLL_S))
            if lac < self._next_entry:  # nothing new: has the segment been completed?
                self._refresh()
                self._check_position()
                current = self._md.segment(seg.seq)
                if current is not None and current.state == COMPLETED:
                    self._seg = current
                    self._reopen(closed=True)

    def _tail_due(self) -> bool:
        """At the bookies' tail: ask the log's owner now?"""
        return self._tail is not None and self._tail.due(self._pos)

    def _learn_confirmed(self, seq: int) -> bool:
        """At the bookies' LAC of in-progress segment ``seq``: if the owner
        said (in its last miss) that its writer had later entries of it
        acknowledged, read the bookies that far (True).  Read your writes:
        the bookies learn an entry's acknowledgement from the next entry
        only."""
        confirmed = self._tail.confirmed
        if confirmed is None or confirmed[0] != seq or confirmed[1] < self._next_entry:
            return False
        self._tail.confirmed = None  # once: the handle keeps it
        return self._rh.learn_lac(confirmed[1]) >= self._next_entry

    def _fetch_service(self, wait: bool, deadline: float, want: int) -> bool | None:
        """Records from the owner's read cache (``appliance.logs.tail``): True
        if some were queued, False if none came until ``deadline``, None if
        the owner does not have them (read the bookies: they go on from the
        position, their segment opened again)."""
        while True:
            remaining = deadline - time.monotonic() if wait else 0.0
            records = self._tail.fetch(self._pos, max(want, 1), remaining, LogRecord._make)
            if records is None:
                return None
            self._drop_segment()
            if records and self._min_txid is not None:  # from a txid: skip the earlier ones
                self._pos = records[-1].dlsn.next()
                records = [r for r in records if r.txid >= self._min_txid]
                if records:
                    self._min_txid = None  # txids increase: every later record qualifies
                else:
                    continue
            if records:
                self._pending.extend(records)
                return True
            if deadline - time.monotonic() <= 0 or not wait:
                return False

    def _drop_segment(self) -> None:
        """Forget the segment being read from the bookies (read from the
        position again when they are needed)."""
        if self._rh is not None:
            self._rh.close()
            self._rh = None
        self._seg = None

    def _check_position(self) -> None:
        """``LogTruncatedError`` if the position was truncated; a reader from
        ``DLSN.FIRST`` that has delivered nothing yet moves on to the first
        record still there instead."""
        if self._pos < self._md.truncated_before:
            if self._at_start:
                self._pos = self._md.truncated_before
                return
            raise LogTruncatedError(f"log {self.name!r}: position {self._pos} was truncated "
                                    f"while reading (records before "
                                    f"{self._md.truncated_before} are gone)")

    def _segment(self):
        """The segment being read (opened), or None past the last one."""
        if self._seg is not None:
            return self._seg
        self._check_position()
        live = self._md.segments_from(self._pos)
        if not live:
            return None
        seg = live[0]
        if seg.seq > self._pos.seq:
            self._pos = DLSN(seg.seq, 0, 0)
        self._seg = seg
        if seg.tier == COLD:
            self._read_cold(seg, self._pos)
            return seg
        try:
            self._reopen(closed=seg.state == COMPLETED)
        except NoSuchLedgerError:  # deleted under us: truncated, moved, or the log deleted
            self._seg = None
            self._refresh()
            before = self._pos
            self._check_position()
            current = self._md.segment(seg.seq)
            if self._pos == before and (current is None or current.tier != COLD):
                raise
            return self._segment()  # from the start: on to the first record kept
        self._next_entry = self._pos.entry_id
        return self._seg

    def _read_cold(self, seg, start: DLSN) -> None:
        """Queue the records of cold segment ``seg`` from ``start`` on."""
        # on use: the cold room needs pyarrow (the spark extra); a reader of
        # hot segments never loads it
        from appliance.cold.reading import segment_records

        if self._rh is not None:
            self._rh.close()
            self._rh = None
        if not check_password(seg.cold.password_hash, master_key(self._password)):
            raise UnauthorizedError(f"wrong password for log {self.name!r} (segment "
                                    f"{seg.seq}, in cold storage)")
        records = segment_records(self._client.cold_config, self.name, seg,
                                  LogRecord._make, start, self._min_txid)
        if records:
            self._min_txid = None
        self._pending.extend(records)
        self._cold_queued = bool(records)
        self._next_entry = seg.last_entry_id + 1

    def _reopen(self, closed: bool) -> None:
        """Open the segment's ledger (again); if that fails the segment is
        dropped too (found again from the position next time)."""
        seg = self._seg
        self._drop_segment()
        rh = self._client.open_ledger(seg.ledger_id, self._password, recovery=False)
        if closed and rh.last_add_confirmed < seg.last_entry_id:
            rh.close()
            raise NoSuchEntryError(f"log {self.name!r}: segment {seg.seq} should end at "
                                   f"entry {seg.last_entry_id}, its ledger {seg.ledger_id} "
                                   f"ends at {rh.last_add_confirmed}")
        self._seg, self._rh = seg, rh

    def _leave_segment(self, next_seq: int) -> None:
        if self._rh is not None:
            self._rh.close()
            self._rh = None
        self._seg = None
        self._pos = max(self._pos, DLSN(next_seq, 0, 0))
        if not self._md.segments_from(self._pos):
            self._refresh()

    def _read_entries(self, seg, last: int) -> bool:
        """Read entries ``next .. last`` of the segment; True if any record
        was queued."""
        first = self._next_entry
        try:
            entries = self._rh.read(first, last)
        except (NoSuchLedgerError, NoSuchEntryError):  # moved to cold, its ledger deleted?
            self._refresh()
            current = self._md.segment(seg.seq)
            if current is None or current.tier != COLD:
                raise
            self._seg = current
            had = len(self._pending)
            self._read_cold(current, max(self._pos, DLSN(seg.seq, first, 0)))
            self._cold_queued = False
            return len(self._pending) > had
        self._next_entry = last + 1
        queued = False
        pos, min_txid = self._pos, self._min_txid
        seq, pending = seg.seq, self._pending
        new, record, dlsn_type = tuple.__new__, LogRecord, DLSN
        for entry in entries:
            header, txids, payloads = unpack_entry(entry.payload)
            if header.control:
                continue
            entry_id = entry.entry_id
            if min_txid is None and (seq, entry_id, 0) >= pos:  # the common case: take all
                # built in C loops: two tuples per record, no Python frame
                dlsns = map(new, repeat(dlsn_type), zip(repeat(seq), repeat(entry_id),
                                                         range(len(txids))))
                pending.extend(map(new, repeat(record), zip(dlsns, txids, payloads,
                                                            strict=True)))
                queued = queued or bool(txids)
                continue
            for slot, (txid, payload) in enumerate(zip(txids, payloads, strict=True)):
                dlsn = dlsn_of(seq, entry_id, slot)
                if dlsn < pos or (min_txid is not None and txid < min_txid):
                    continue
                min_txid = None  # txids increase: every later record qualifies
                pending.append(LogRecord(dlsn, txid, payload))
                queued = True
        self._min_txid = min_txid
        return queued

    def close(self) -> None:
        self._closed = True
        if self._tail is not None:
            self._tail.close()
        if self._rh is not None:
            self._rh.close()
            self._rh = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
