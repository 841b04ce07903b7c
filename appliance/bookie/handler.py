"""The bookie's request handler: wire requests -> pure bookie core -> storage.

``BookieHandler`` sits between ``ipc.server.FrameServer`` (the ROUTER loop)
and ``appliance.protocol.bookie.BookieCore`` (the pure rules: master keys,
fencing, limbo, LAC) over ``storage.LedgerStorage``.

Guarantees:

* **An add is acknowledged only once durable**: the core returns the
  storage ticket a reply must wait for; replies whose ticket is not yet
  durable are parked (bounded by ``pending_replies_max``) and sent from the
  loop when the storage's ``durable_fd`` reports progress.  The rule is
  ``appliance.protocol.durable_replies``, the one the simulation checks.  Fence replies
  (reads and LAC reads with the fence flag) wait the same way, so a
  recovering client never counts a fence that a crash could undo.
* Replies leave in ticket order per wakeup; a reply whose client went away
  is dropped by the server and counted there.
* When the storage fails (a write error; a full disk), what was durable
  before is acknowledged and every other parked reply is answered with an
  error, never acknowledged (``storage_failed``); so is any reply that would
  park on it afterwards, until the storage is reopened (``detach_storage``
  / ``attach_storage``: the reopened journal's tickets start again).
* Long polls (WAIT_LAC) are bounded (``long_polls_max``) and expire with a
  timer; they are answered as soon as a durable add moves the LAC past the
  caller's.
* A request the core refuses gets its error code (the wire carries codes).
* Reads (every read op, long polls included) are served only as
  ``appliance.protocol.read_access`` allows (the core asks it): a read
  with a wrong key, or none while ``server.reads_need_key``, is answered
  ``UnauthorizedError`` and never sees data; a long poll is checked again
  when it is answered.  Refusals are counted and logged at most once per
  ledger per minute (``appliance.bookie.read_refusals``).

Everything runs on the loop thread; nothing here blocks on the disk except
reads (served from the entry-log write buffer or the page cache).
"""

from __future__ import annotations

import logging
import os
from collections import defaultdict

import numpy as np

from appliance.bookie.add_check import multi_records_match, packed_records_match
from appliance.bookie.durable_watch import DurableWatch
from appliance.bookie.read_refusals import ReadRefusals
from appliance.errors import (
    OK,
    BadRequestError,
    BKError,
    TooManyRequestsError,
    UnauthorizedError,
    error_for_code,
)
from appliance.protocol import limits
from appliance.protocol.bookie import BookieCore
from appliance.protocol.durable_replies import DurableReplies
from appliance.protocol.read_batch import batch_rows, batch_window
from ipc.frames import VERSION
from ipc.packed import (
    AddMultiReply,
    AddMultiRequest,
    AddPackedReply,
    AddPackedRequest,
    ReadPackedReply,
    ReadPackedRequest,
)
from ipc.replies import (
    AddBatchReply,
    AddReply,
    CompactReply,
    ErrorReply,
    InfoReply,
    LacReply,
    PingReply,
    ReadBatchReply,
    ReadReply,
    WriteCloseReply,
    WriteLacMultiReply,
)
from ipc.requests import (
    AddBatchRequest,
    AddRequest,
    CompactRequest,
    InfoRequest,
    PingRequest,
    ReadBatchRequest,
    ReadLacRequest,
    ReadRequest,
    WaitLacRequest,
    WriteCloseRequest,
    WriteLacMultiRequest,
    WriteLacRequest,
)
from ipc.server import failure_reply
from storage.read_path import split_parts

log = logging.getLogger(__name__)



def _multi_vouched(req: AddMultiRequest) -> bool:
    """Every record of the ADD_MULTI names its group's ledger and its entry
    id (one vectorised check; False: the core checks each record)."""
    return multi_records_match(req.groups, req.entry_ids, req.lengths, req.data)


class BookieHandler(DurableWatch):
    """See the module docstring.  Call ``attach(server)`` before serving."""

    def __init__(self, bookie_id: str, storage, core: BookieCore | None = None, *,
                 pending_replies_max: int = limits.BOOKIE_PENDING_REPLIES_MAX,
                 long_polls_max: int = limits.SERVER_LONG_POLLS_MAX,
                 wait_lac_timeout_ms_max: int = limits.SERVER_WAIT_LAC_TIMEOUT_MS_MAX):
        self.bookie_id = bookie_id
        self.storage = storage
        self.core = core or BookieCore(storage)
        self.pending_replies_max = pending_replies_max
        self.long_polls_max = long_polls_max
        self.wait_lac_timeout_ms_max = wait_lac_timeout_ms_max
        self.server = None
        # replies (peer, reply, touched ledgers) parked until their add is durable
        self._pending = DurableReplies(pending_replies_max)
        self._waiters: dict[int, list] = defaultdict(list)  # ledger -> [peer, req, timer]
        self._long_polls = 0
        self.counters = {"adds": 0, "reads": 0, "fences": 0, "errors": 0, "write_closes": 0,
                         "reads_refused": 0, "write_lacs": 0, "write_lac_multis": 0}
        self.refusals = ReadRefusals(bookie_id)
        self._held_adds: list = []  # (peer, small ADD_PACKED or ADD_MULTI) until the drain ends
        self.extra_info = None  # () -> dict merged into INFO (boot reasons, repair progress)
        self.on_storage_failure = None  # (exc) -> None; None: a storage failure raises
        self.on_gc_request = None  # () -> {"ticket", "gc"}: bkctl bookie gc
        self._durable_fd: int | None = None
        self._storage_failure: BaseException | None = None  # seen by storage_failed

    def attach(self, server) -> None:
        self.server = server
        self.attach_storage()

    # -- dispatch -------------------------------------------------------------
    def handle(self, peer: bytes, req):
        if isinstance(req, AddPackedRequest):
            if len(req.lengths) < limits.BOOKIE_COALESCE_ENTRIES_MAX and not req.recovery:
                self._held_adds.append((peer, req))  # stored at the end of the drain
                return None
            self._flush_adds()
            return self._add_packed(peer, req)
        if isinstance(req, AddMultiRequest):
            if not req.recovery:
                self._held_adds.append((peer, req))
                return None
            self._flush_adds()
            return self._add_multi(peer, req)
        if self._held_adds:  # requests are handled in the order they came
            self._flush_adds()
        if isinstance(req, ReadPackedRequest):
            return self._read_packed(peer, req)
        if isinstance(req, AddBatchRequest):
            return self._add_batch(peer, req)
        if isinstance(req, AddRequest):
            reply = self.core.add(req.ledger_id, req.entry_id, req.data, req.master_key,
                                  req.recovery)
            self.counters["adds"] += 1
            if reply.code != OK:
                return self._error(req, reply.code)
            return self._after(peer, reply.ticket,
                               AddReply(req.ledger_id, req.entry_id, req.request_id),
                               (req.ledger_id,))
        if isinstance(req, ReadRequest):
            return self._read(peer, req)
        if isinstance(req, ReadBatchRequest):
            return self._read_batch(peer, req)
        if isinstance(req, ReadLacRequest):
            return self._read_lac(peer, req)
        if isinstance(req, WriteLacRequest):
            return self._write_lac(req)
        if isinstance(req, WriteLacMultiRequest):
            return self._write_lac_multi(req)
        if isinstance(req, WaitLacRequest):
            return self._wait_lac(peer, req)
        if isinstance(req, WriteCloseRequest):
            return self._write_close(req)
        if isinstance(req, PingRequest):
            return PingReply(req.request_id)
        if isinstance(req, InfoRequest):
            return InfoReply(self.info(), req.request_id)
        if isinstance(req, CompactRequest) and req.gc:  # the pass goes on in the gc thread
            if self.on_gc_request is None:
                raise BadRequestError("this bookie has no garbage collector")
            return CompactReply(_jsonable(self.on_gc_request()), req.request_id)
        if isinstance(req, CompactRequest):
            return self._compact(req)
        raise BadRequestError(f"unhandled request {type(req).__name__}")

    def _compact(self, req: CompactRequest) -> CompactReply:
        """COMPACT: suspend or resume automatic compaction, or start a run
        (it goes on in the storage's compactor thread; ticket 0: no run)."""
        ticket = 0
        if req.suspend:
            self.storage.suspend_compaction()
        elif req.resume:
            self.storage.resume_compaction()
        else:
            ticket = self.storage.request_compaction(req.major)
        return CompactReply({"ticket": ticket,
                             "compaction": _jsonable(self.storage.compaction_status())},
                            req.request_id)

    def info(self) -> dict:
        counters = dict(self.server.counters) if self.server is not None else {}
        counters.update(self.counters, pending_replies=len(self._pending),
                        long_polls=self._long_polls)
        return {"bookie_id": self.bookie_id, "instance_id": self.storage.instance_id,
                "wire_version": VERSION, "pid": os.getpid(), "kind": "bookie",
                "counters": counters, "storage": _jsonable(self.storage.stats()),
                **(self.extra_info() if self.extra_info is not None else {})}

    # -- adds -----------------------------------------------------------------
    def _add_batch(self, peer: bytes, req: AddBatchRequest):
        """Any ledgers: grouped by (ledger, key), one core call and one
        storage block for them all, one reply."""
        by_ledger: dict[tuple[int, bytes], list[int]] = defaultdict(list)
        for i, item in enumerate(req.items):
            by_ledger[(item.ledger_id, bytes(item.master_key))].append(i)
        groups = [(ledger_id, key, [req.items[i].entry_id for i in positions],
                   [req.items[i].data for i in positions])
                  for (ledger_id, key), positions in by_ledger.items()]
        codes, ticket = self.core.add_groups(groups, req.recovery)
        statuses = [OK] * len(req.items)
        for positions, group_codes in zip(by_ledger.values(), codes, strict=True):
            for i, code in zip(positions, group_codes, strict=True):
                statuses[i] = code
        self.counters["adds"] += len(req.items)
        rows = [(it.ledger_id, it.entry_id, st) for it, st in zip(req.items, statuses,
                                                                    strict=True)]
        touched = tuple({ledger_id for ledger_id, _ in by_ledger})
        return self._after(peer, ticket, AddBatchReply(rows, req.request_id), touched)

    def after_drain(self) -> None:
        """End of the loop's drained batch: store the held small adds."""
        if self._held_adds:
            self._flush_adds()

    def after_step(self) -> None:
        """End of a loop turn: the journal records this turn queued are
        written and synced here, on the loop's thread, if the journal thread
        is idle, and the replies they hold are sent at once (no hop to the
        journal thread and back through ``durable_fd``); otherwise the busy
        journal thread takes them after its current group."""
        if self.storage.write_journal_inline():
            self._on_durable(clear_fd=False)

    def _flush_adds(self) -> None:
        """The small ADD_PACKED and the ADD_MULTI requests held since the
        last flush, in one core call (``add_groups``: each ledger's group
        admitted and checked on its own, one storage block and journal
        record for all), each answered as ``_add_packed`` / ``_add_multi``
        would (codes per entry; sent once the block is durable).  Under load
        a drain holds several messages and they cost one storage call; a
        lone message takes its own op's path."""
        held, self._held_adds = self._held_adds, []
        if len(held) == 1:
            peer, req = held[0]
            self._answer(peer, req, self._add_multi if type(req) is AddMultiRequest
                         else self._add_packed)
            return
        groups, spans, vouched = [], [], []
        for _, req in held:
            start = len(groups)
            if type(req) is AddMultiRequest:
                groups += req.group_entries()
                vouched += [_multi_vouched(req)] * len(req.groups)
            else:
                groups.append((req.ledger_id, req.master_key, req.entry_ids, req.entries()))
                vouched.append(False)
            spans.append((start, len(groups)))
        try:
            codes, ticket = self.core.add_groups(groups, vouched=vouched)
        except Exception as exc:  # noqa: BLE001 - each request gets the error
            for peer, req in held:
                self.server.send_reply(peer, self._failed(req, exc))
            return
        for (peer, req), (lo, hi) in zip(held, spans, strict=True):
            if type(req) is AddMultiRequest:
                statuses = [c for group_codes in codes[lo:hi] for c in group_codes]
                reply = AddMultiReply(req.entry_ids, statuses, req.request_id)
                touched = tuple({g[0] for g in groups[lo:hi]})
            else:
                statuses = codes[lo]
                reply = AddPackedReply(req.ledger_id, req.entry_ids, statuses, req.request_id)
                touched = (req.ledger_id,)
            self.counters["adds"] += len(statuses)
            try:
                reply = self._after(peer, ticket, reply, touched)
            except BKError as exc:  # too many replies parked
                reply = self._failed(req, exc)
            if reply is not None:
                self.server.send_reply(peer, reply)

    def _answer(self, peer: bytes, req, handle) -> None:
        """``handle(peer, req)`` outside the server's dispatch: its reply (or
        its error) is sent here."""
        try:
            reply = handle(peer, req)
        except Exception as exc:  # noqa: BLE001 - answered as the server's dispatch does
            reply = self._failed(req, exc)
        if reply is not None:
            self.server.send_reply(peer, reply)

    def _failed(self, req, exc: Exception) -> ErrorReply:
        """The error reply (and count, and log line) the server's dispatch
        gives a request whose handling raised ``exc``."""
        return failure_reply(req, exc, getattr(self.server, "counters", None))

    def _add_multi(self, peer: bytes, req: AddMultiRequest):
        """Several ledgers' entries in one data frame: one core call (each
        group admitted and checked on its own), one storage block, one
        reply with a code per entry in the request's order."""
        groups = req.group_entries()
        codes, ticket = self.core.add_groups(groups, req.recovery,
                                             [_multi_vouched(req)] * len(groups))
        statuses = [c for group_codes in codes for c in group_codes]
        self.counters["adds"] += len(statuses)
        touched = tuple({group[0] for group in groups})
        return self._after(peer, ticket, AddMultiReply(req.entry_ids, statuses, req.request_id),
                           touched)

    def _add_packed(self, peer: bytes, req: AddPackedRequest):
        """One ledger, one core call, one storage block, one reply."""
        codes, ticket = self.core.add_packed(req.ledger_id, req.entry_ids, req.lengths,
                                             req.data, req.master_key, req.recovery,
                                             records_match=packed_records_match)
        self.counters["adds"] += len(codes)
        return self._after(peer, ticket, AddPackedReply(req.ledger_id, req.entry_ids, codes,
                                                        req.request_id), (req.ledger_id,))

    def _after(self, peer: bytes, ticket: int, reply, touched: tuple[int, ...] = ()):
        """Send now if ``ticket`` is durable, else park the reply until it is.
        ``touched``: ledgers whose long polls wake now: the LAC an add carries
        is the writer's, about entries already acknowledged (durable on an ack
        quorum), so it may be shown before this add itself is durable."""
        for ledger_id in touched:
            self._wake_waiters(ledger_id)
        if not self._pending.hold(ticket, self.storage.durable_ticket, (peer, reply, touched)):
            if self._storage_failure is not None:  # nothing becomes durable any more
                self._fail_parked(self._pending.clear(), "not durable: the storage failed "
                                  f"({self._storage_failure})")
            return None
        return reply

    # -- reads ----------------------------------------------------------------
    def _read(self, peer: bytes, req: ReadRequest):
        self.counters["reads"] += 1
        r = self.core.read(req.ledger_id, req.entry_id, req.fence, req.master_key)
        self._note_refusal(peer, req, r.code)
        if req.fence:
            self.counters["fences"] += 1
        reply = (ReadReply(req.ledger_id, req.entry_id, r.data, req.request_id)
                 if r.code == OK else self._error(req, r.code))
        return self._after(peer, r.ticket, reply)

    def _read_batch(self, peer: bytes, req: ReadBatchRequest):
        parts, lengths, bad, ticket = self._batch_parts(peer, req)
        datas = split_parts(parts, lengths)
        rows = [(req.first_entry_id + i, OK, d) for i, d in enumerate(datas)]
        if bad is not None:
            rows.append(bad)
        return self._after(peer, ticket, ReadBatchReply(req.ledger_id, rows, req.request_id))

    def _read_packed(self, peer: bytes, req: ReadPackedRequest):
        """The READ_BATCH rows, packed: the storage's verified buffers are the
        data frame (joined only if there are several), the table is numpy."""
        parts, lengths, bad, ticket = self._batch_parts(peer, req)
        n = len(lengths)
        count = n + (bad is not None)
        statuses = np.zeros(count, np.int32)
        lengths = np.concatenate([lengths, np.zeros(count - n, np.int64)])
        if bad is not None:
            statuses[n] = bad[1]
        entry_ids = np.arange(req.first_entry_id, req.first_entry_id + count, dtype=np.int64)
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        reply = ReadPackedReply(req.ledger_id, entry_ids, statuses, lengths, data,
                                req.request_id)
        return self._after(peer, ticket, reply)

    def _batch_parts(self, peer: bytes, req) -> tuple[list, np.ndarray, tuple | None, int]:
        """The rows of a READ_BATCH or READ_PACKED request: buffers whose
        concatenation is the data of the OK rows from the first asked, in
        order; each OK row's length; the ``(entry id, status, None)`` row
        that ended the batch early (or None); the ticket the reply waits for.

        Which rows: ``appliance.protocol.read_batch`` (the rule the
        simulation runs).  The first entry goes through the core (fence flag
        first, then the negative / limbo rules); then it and the rest are
        read in runs with the storage's batched read (every record verified),
        cut at the bytes allowed (``fit_bytes``: the rule, vectorised).  A run
        the storage refuses (a missing or corrupt entry) is re-read entry by
        entry through the core, so every row gets exactly the per-entry
        status."""
        wire = self.server.limits
        window = batch_window(req.first_entry_id, req.last_entry_id, req.max_entries,
                              req.max_bytes, wire.batch_entries_max, wire.batch_bytes_max)
        first, last, max_bytes = window.first_entry_id, window.last_entry_id, window.bytes_max
        r = self.core.read(req.ledger_id, first, req.fence, req.master_key)
        if r.code != OK:
            self._note_refusal(peer, req, r.code)
            self.counters["reads"] += 1
            return [], np.zeros(0, np.int64), (first, r.code, None), r.ticket
        parts, lengths, bad = [r.data], [np.array([len(r.data)], np.int64)], None
        size, entry_id = len(r.data), first + 1
        if size <= max_bytes and last > first:  # re-read with the run: one buffer for all
            try:
                got, got_lengths = self.storage.read_entries_packed(
                    req.ledger_id, first,
                    min(last, first + limits.STORAGE_READ_RUN_ENTRIES_MAX - 1), max_bytes)
                if len(got_lengths):
                    parts, lengths = got, [got_lengths]
                    size, entry_id = int(got_lengths.sum()), first + len(got_lengths)
            except BKError:
                pass  # the loop below finds the bad entry
        while bad is None and entry_id <= last and size <= max_bytes:
            run_last = min(last, entry_id + limits.STORAGE_READ_RUN_ENTRIES_MAX - 1)
            try:
                got, got_lengths = self.storage.read_entries_packed(
                    req.ledger_id, entry_id, run_last, max_bytes - size)
            except BKError:  # per entry, through the core: exact status of the bad one
                got, bad = self._one_by_one(req, window, entry_id, run_last, size)
                got_lengths = np.fromiter(map(len, got), np.int64, len(got))
            parts += got
            lengths.append(got_lengths)
            size += int(got_lengths.sum())
            entry_id += len(got_lengths)
            if bad is None and entry_id <= run_last:  # cut by max_bytes
                break
        lengths = np.concatenate(lengths)
        self.counters["reads"] += len(lengths) + (bad is not None)
        return parts, lengths, bad, r.ticket

    def _one_by_one(self, req, window, first: int, last: int, size: int):
        """Entries first..last through the core, by the batch rule: until one
        is refused (its row is returned) or the next does not fit."""
        def read_one(entry_id: int):
            one = self.core.read(req.ledger_id, entry_id, False, req.master_key)
            return one.code, one.data

        rows = batch_rows(window, read_one, start=first, size=size, last=last)
        if rows and rows[-1][1] != OK:
            return [data for _, _, data in rows[:-1]], rows[-1]
        return [data for _, _, data in rows], None

    def _read_lac(self, peer: bytes, req: ReadLacRequest):
        r = self.core.read_lac(req.ledger_id, req.fence, req.master_key)
        self._note_refusal(peer, req, r.code)
        if req.fence:
            self.counters["fences"] += 1
        if r.code != OK:
            return self._after(peer, r.ticket, self._error(req, r.code))
        return self._after(peer, r.ticket,
                           self._lac_reply(req.ledger_id, r.lac, req.request_id, req.OP))

    def _write_lac(self, req: WriteLacRequest):
        """Explicit LAC from an idle writer: kept (the highest), and long polls
        waiting on the ledger wake up with it."""
        r = self.core.write_lac(req.ledger_id, req.lac, req.master_key)
        if r.code != OK:
            return self._error(req, r.code)
        self.counters["write_lacs"] += 1
        self._wake_waiters(req.ledger_id)
        return LacReply(req.ledger_id, self.storage.get_explicit_lac(req.ledger_id), -1, None,
                        req.request_id, req.OP)

    def _write_lac_multi(self, req: WriteLacMultiRequest) -> WriteLacMultiReply:
        """WRITE_LAC of several ledgers (the idle writers of many ledgers,
        one message per client turn): each row checked and kept on its own,
        as ``_write_lac`` does; a refused row (unknown ledger, wrong key)
        leaves the others kept."""
        core, storage, rows, kept = self.core, self.storage, [], 0
        for ledger_id, lac, key in req.rows:
            code = core.write_lac(ledger_id, lac, key).code
            if code == OK:
                kept += 1
                self._wake_waiters(ledger_id)
                rows.append((ledger_id, storage.get_explicit_lac(ledger_id), OK))
            else:
                rows.append((ledger_id, -1, code))
        self.counters["write_lac_multis"] += 1
        self.counters["write_lacs"] += kept
        return WriteLacMultiReply(rows, req.request_id)

    def _write_close(self, req: WriteCloseRequest):
        """BP-32 advisory write close: key checked by the core, then the
        storage rotates the ledger's log (per-ledger mode).  Not journaled,
        so the reply waits for nothing."""
        r = self.core.write_close(req.ledger_id, req.master_key)
        if r.code != OK:
            return self._error(req, r.code)
        self.counters["write_closes"] += 1
        return WriteCloseReply(req.ledger_id, req.request_id)

    def _lac_reply(self, ledger_id: int, lac: int, request_id: int, op: int) -> LacReply:
        last = self.storage.last_entry_id(ledger_id)
        data = self.storage.read_entry(ledger_id, last) if last >= 0 else None
        return LacReply(ledger_id, lac, last, data, request_id, op)

    # -- long polls -----------------------------------------------------------
    def _wait_lac(self, peer: bytes, req: WaitLacRequest):
        r = self.core.read_lac(req.ledger_id, master_key=req.master_key)
        if r.code != OK:
            self._note_refusal(peer, req, r.code)
            return self._error(req, r.code)
        if r.lac > req.previous_lac or req.timeout_ms <= 0:
            return self._lac_reply(req.ledger_id, r.lac, req.request_id, req.OP)
        if self._long_polls >= self.long_polls_max:
            raise TooManyRequestsError(f"more than {self.long_polls_max} pending long polls")
        waiter = [peer, req, None]
        timeout_ms = min(req.timeout_ms, self.wait_lac_timeout_ms_max)
        waiter[2] = self.server.call_later_ms(timeout_ms, lambda: self._expire(waiter))
        self._waiters[req.ledger_id].append(waiter)
        self._long_polls += 1
        return None

    def _expire(self, waiter: list) -> None:
        peer, req, _ = waiter
        waiters = self._waiters.get(req.ledger_id, [])
        if waiter in waiters:
            waiters.remove(waiter)
            self._long_polls -= 1
        if not waiters:
            self._waiters.pop(req.ledger_id, None)
        self._send_lac(peer, req)

    def _wake_waiters(self, ledger_id: int) -> None:
        waiters = self._waiters.get(ledger_id)
        if not waiters:
            return
        lac = self.core.lac(ledger_id)
        still = []
        for waiter in waiters:
            peer, req, timer = waiter
            if lac > req.previous_lac:
                timer.cancel()
                self._long_polls -= 1
                self._send_lac(peer, req, lac)
            else:
                still.append(waiter)
        if still:
            self._waiters[ledger_id] = still
        else:
            del self._waiters[ledger_id]

    def _send_lac(self, peer: bytes, req: WaitLacRequest, lac: int | None = None) -> None:
        """Answer a parked long poll; the ledger's key may have become known
        while it waited, so the read rule is asked again."""
        code = self.core.read_access(req.ledger_id, req.master_key)
        if code != OK:
            self._note_refusal(peer, req, code)
            self.server.send_reply(peer, self._error(req, code))
            return
        try:
            lac = self.core.lac(req.ledger_id) if lac is None else lac
            reply = self._lac_reply(req.ledger_id, lac, req.request_id, req.OP)
        except BKError as exc:
            reply = self._error(req, exc.code)
        self.server.send_reply(peer, reply)

    # -- helpers --------------------------------------------------------------
    def _note_refusal(self, peer: bytes, req, code: int) -> None:
        """Count (and maybe log) a read refused for its key."""
        if code == UnauthorizedError.code:
            self.counters["reads_refused"] += 1
            self.refusals.refused(req.ledger_id, req.OP.name, req.master_key is not None, peer)

    def _error(self, req, code: int) -> ErrorReply:
        self.counters["errors"] += 1
        return ErrorReply(op=int(req.OP), request_id=req.request_id, status=code,
                          ledger_id=getattr(req, "ledger_id", 0),
                          entry_id=getattr(req, "entry_id", -1),
                          message=str(error_for_code(code)))


def _jsonable(doc):
    if isinstance(doc, dict):
        return {str(k): _jsonable(v) for k, v in doc.items()}
    if isinstance(doc, list | tuple):
        return [_jsonable(v) for v in doc]
    if isinstance(doc, int | float | str | bool) or doc is None:
        return doc
    return str(doc)
