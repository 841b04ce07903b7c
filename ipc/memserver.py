"""An in-memory bookie on ``FrameServer``: the target of the wire fuzz test,
the transport tests and ``python -m ipc.bench``.  NOT the bookie server.

It keeps entries in a dict (nothing is durable), checks master keys on adds
and fences (not on plain reads: the bookies' read rule,
``appliance.protocol.read_access``, is not applied here), honours
fence and recovery flags, answers long polls, and can defer every add
acknowledgement to a later wakeup of an extra file descriptor
(``defer_acks``), exactly the path the real bookie takes with its storage's
durability ticket.  Because it treats entry bytes as opaque it cannot read
the LAC a client piggybacks in each entry: it reports its highest stored
entry id as the LAC (a test-double simplification, documented in INFO).

Limits: ``bytes_max`` of stored entry bytes (then adds fail with
``TooManyRequestsError``), ``pending_acks_max`` deferred acks (the bookies'
rule, ``appliance.protocol.durable_replies``), ``long_polls_max`` pending
WAIT_LACs, and
``wait_lac_timeout_ms_max`` clamps every long poll.

Run as ``python -m ipc.memserver --endpoint ipc:///tmp/x.sock``: it prints
``READY <endpoint>`` once bound and stops cleanly on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import uuid

from appliance.protocol import limits
from appliance.protocol.durable_replies import DurableReplies
from appliance.protocol.errors import (
    OK,
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    TooManyRequestsError,
    UnauthorizedError,
    code_of,
)
from appliance.protocol.read_batch import batch_rows, batch_window
from ipc.frames import VERSION, MiB
from ipc.replies import (
    AddBatchReply,
    AddReply,
    InfoReply,
    LacReply,
    PingReply,
    ReadBatchReply,
    ReadReply,
)
from ipc.requests import (
    AddBatchRequest,
    AddRequest,
    InfoRequest,
    PingRequest,
    ReadBatchRequest,
    ReadLacRequest,
    ReadRequest,
    WaitLacRequest,
)
from ipc.server import FrameServer


class _Ledger:
    __slots__ = ("master_key", "fenced", "entries", "last_entry_id", "waiters")

    def __init__(self, master_key: bytes):
        self.master_key = master_key
        self.fenced = False
        self.entries: dict[int, bytes] = {}
        self.last_entry_id = -1
        self.waiters: list = []  # (peer, request, timer)


class MemoryBookie:
    """A ``RequestHandler`` keeping ledgers in memory (see module docstring)."""

    def __init__(self, bookie_id: str = "mem-bookie", *, defer_acks: bool = False,
                 bytes_max: int = 256 * MiB, long_polls_max: int = limits.SERVER_LONG_POLLS_MAX,
                 wait_lac_timeout_ms_max: int = limits.SERVER_WAIT_LAC_TIMEOUT_MS_MAX,
                 pending_acks_max: int = limits.BOOKIE_PENDING_REPLIES_MAX):
        self.bookie_id = bookie_id
        self.instance_id = uuid.uuid4().hex
        self.defer_acks = defer_acks
        self.bytes_max = bytes_max
        self.long_polls_max = long_polls_max
        self.wait_lac_timeout_ms_max = wait_lac_timeout_ms_max
        self.server: FrameServer | None = None
        self.ledgers: dict[int, _Ledger] = {}
        self.bytes_stored = 0
        self.long_polls = 0
        # acks parked until the "durable" fd fires: the bookies' durable-reply rule,
        # with a ticket per stored add (``_written``) and the fd as the group commit
        self._pending_acks = DurableReplies(pending_acks_max)
        self._written = self._durable = 0
        self._ticket_r = self._ticket_w = -1
        self._ticket_requested = False

    def attach(self, server: FrameServer) -> None:
        self.server = server
        if self.defer_acks:
            self._ticket_r, self._ticket_w = os.pipe()
            os.set_blocking(self._ticket_r, False)
            server.watch_fd(self._ticket_r, self._on_durable)

    # -- dispatch ------------------------------------------------------------
    def handle(self, peer: bytes, req):
        if isinstance(req, AddRequest):
            self._add(req.ledger_id, req.entry_id, req.master_key, req.data, req.recovery)
            return self._ack(peer, AddReply(req.ledger_id, req.entry_id, req.request_id))
        if isinstance(req, AddBatchRequest):
            return self._ack(peer, self._add_batch(req))
        if isinstance(req, ReadRequest):
            return self._read(req)
        if isinstance(req, ReadBatchRequest):
            return self._read_batch(req)
        if isinstance(req, ReadLacRequest):
            ledger = self._ledger_for_read(req.ledger_id, req.fence, req.master_key)
            return self._lac_reply(req.ledger_id, ledger, req.request_id, req.OP)
        if isinstance(req, WaitLacRequest):
            return self._wait_lac(peer, req)
        if isinstance(req, PingRequest):
            return PingReply(req.request_id)
        if isinstance(req, InfoRequest):
            return InfoReply(self.info(), req.request_id)
        raise TypeError(f"unhandled request {type(req).__name__}")

    def info(self) -> dict:
        counters = dict(self.server.counters) if self.server else {}
        counters.update(ledgers=len(self.ledgers), bytes_stored=self.bytes_stored,
                        long_polls=self.long_polls)
        return {"bookie_id": self.bookie_id, "instance_id": self.instance_id,
                "wire_version": VERSION, "pid": os.getpid(), "kind": "memory-test-double",
                "lac_semantics": "highest stored entry id", "counters": counters}

    # -- adds ----------------------------------------------------------------
    def _add(self, ledger_id: int, entry_id: int, key: bytes, data, recovery: bool) -> None:
        ledger = self.ledgers.get(ledger_id)
        if ledger is None:
            ledger = self.ledgers[ledger_id] = _Ledger(key)
        elif ledger.master_key != key:
            raise UnauthorizedError(f"wrong master key for ledger {ledger_id}")
        if ledger.fenced and not recovery:
            raise LedgerFencedError(f"ledger {ledger_id} is fenced")
        if self.bytes_stored + len(data) > self.bytes_max:
            raise TooManyRequestsError("memory bookie is full")
        old = ledger.entries.get(entry_id)
        self.bytes_stored += len(data) - (len(old) if old is not None else 0)
        ledger.entries[entry_id] = bytes(data)
        if entry_id > ledger.last_entry_id:
            ledger.last_entry_id = entry_id
            self._wake_waiters(ledger_id, ledger)

    def _add_batch(self, req: AddBatchRequest) -> AddBatchReply:
        rows = []
        for item in req.items:
            try:
                self._add(item.ledger_id, item.entry_id, item.master_key, item.data,
                          req.recovery)
                status = OK
            except (UnauthorizedError, LedgerFencedError, TooManyRequestsError) as exc:
                status = code_of(exc)
            rows.append((item.ledger_id, item.entry_id, status))
        return AddBatchReply(rows, req.request_id)

    def _ack(self, peer: bytes, reply):
        if not self.defer_acks:
            return reply
        self._written += 1  # this ack's ticket; durable once the fd fires
        if self._pending_acks.hold(self._written, self._durable, (peer, reply)):
            return reply
        return None

    def after_drain(self) -> None:
        """Stand-in for "the journal batch was handed to fsync": ask for a ticket."""
        if self._pending_acks and not self._ticket_requested:
            self._ticket_requested = True
            os.write(self._ticket_w, b"\1")

    def _on_durable(self) -> None:
        os.read(self._ticket_r, 4096)
        self._ticket_requested = False
        self._durable = self._written  # everything stored so far is "durable" now
        for peer, reply in self._pending_acks.release(self._durable):
            self.server.send_reply(peer, reply)

    # -- reads ---------------------------------------------------------------
    def _ledger_for_read(self, ledger_id: int, fence: bool, key: bytes | None) -> _Ledger:
        ledger = self.ledgers.get(ledger_id)
        if fence:
            if ledger is None:
                ledger = self.ledgers[ledger_id] = _Ledger(key)
            elif ledger.master_key != key:
                raise UnauthorizedError(f"wrong master key for ledger {ledger_id}")
            ledger.fenced = True
        if ledger is None:
            raise NoSuchLedgerError(f"no ledger {ledger_id}")
        return ledger

    def _read(self, req: ReadRequest) -> ReadReply:
        ledger = self._ledger_for_read(req.ledger_id, req.fence, req.master_key)
        data = ledger.entries.get(req.entry_id)
        if data is None:
            raise NoSuchEntryError(f"no entry {req.entry_id} in ledger {req.ledger_id}")
        return ReadReply(req.ledger_id, req.entry_id, data, req.request_id)

    def _read_batch(self, req: ReadBatchRequest) -> ReadBatchReply:
        """Rows by the bookies' rule (``appliance.protocol.read_batch``)."""
        ledger = self._ledger_for_read(req.ledger_id, req.fence, req.master_key)
        wire = self.server.limits
        window = batch_window(req.first_entry_id, req.last_entry_id, req.max_entries,
                              req.max_bytes, wire.batch_entries_max, wire.batch_bytes_max)

        def read_one(entry_id: int):
            data = ledger.entries.get(entry_id)
            return (OK, data) if data is not None else (NoSuchEntryError.code, None)

        return ReadBatchReply(req.ledger_id, batch_rows(window, read_one), req.request_id)

    # -- LAC and long polls --------------------------------------------------
    def _lac_reply(self, ledger_id: int, ledger: _Ledger, request_id: int, op: int) -> LacReply:
        last = ledger.last_entry_id
        data = ledger.entries.get(last) if last >= 0 else None
        return LacReply(ledger_id, last, last, data, request_id, op)

    def _wait_lac(self, peer: bytes, req: WaitLacRequest):
        ledger = self._ledger_for_read(req.ledger_id, False, None)
        if ledger.last_entry_id > req.previous_lac or req.timeout_ms == 0:
            return self._lac_reply(req.ledger_id, ledger, req.request_id, req.OP)
        if self.long_polls >= self.long_polls_max:
            raise TooManyRequestsError(f"more than {self.long_polls_max} pending long polls")
        timeout_ms = min(req.timeout_ms, self.wait_lac_timeout_ms_max)
        waiter = [peer, req, None]
        waiter[2] = self.server.call_later_ms(timeout_ms, lambda: self._expire(ledger, waiter))
        ledger.waiters.append(waiter)
        self.long_polls += 1
        return None

    def _expire(self, ledger: _Ledger, waiter: list) -> None:
        ledger.waiters = [w for w in ledger.waiters if w is not waiter]
        self.long_polls -= 1
        peer, req, _ = waiter
        self.server.send_reply(peer, self._lac_reply(req.ledger_id, ledger, req.request_id,
                                                     req.OP))

    def _wake_waiters(self, ledger_id: int, ledger: _Ledger) -> None:
        still = []
        for waiter in ledger.waiters:
            peer, req, timer = waiter
            if ledger.last_entry_id > req.previous_lac:
                timer.cancel()
                self.long_polls -= 1
                self.server.send_reply(peer, self._lac_reply(ledger_id, ledger, req.request_id,
                                                             req.OP))
            else:
                still.append(waiter)
        ledger.waiters = still


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--bookie-id", default="mem-bookie")
    parser.add_argument("--defer-acks", action="store_true")
    parser.add_argument("--wait-lac-timeout-ms-max", type=int,
                        default=limits.SERVER_WAIT_LAC_TIMEOUT_MS_MAX)
    args = parser.parse_args(argv)
    handler = MemoryBookie(args.bookie_id, defer_acks=args.defer_acks,
                           wait_lac_timeout_ms_max=args.wait_lac_timeout_ms_max)
    with FrameServer(args.endpoint, handler) as server:
        handler.attach(server)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: server.stop())
        print(f"READY {server.endpoint}", flush=True)
        server.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
