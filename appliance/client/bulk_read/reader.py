"""The bulk reader: ZeroMQ I/O over the pure planning (``plan``), failover
(``failover``) and verification (``records``) of a bulk read.

``BulkReader`` owns one DEALER socket per bookie and one poller, on the
caller's thread (not thread-safe: one reader per thread).  It guarantees
what the package docstring lists: verified bytes only, entries in order and
exactly once, failover between replicas, and bounds on requests in flight
per bookie, chunks ahead, frames per reply and the wait for every reply
(``read_timeout_ms``).  A bookie that timed out gets a fresh socket, so its
late replies are never read, and is suspect (asked last) for ``SUSPECT_S``.
Every socket is closed with ``linger=0`` by ``close()``.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Iterator, Mapping

import zmq

from appliance.client.bulk_read.config import BulkReadConfig
from appliance.client.bulk_read.failover import (
    no_replica_error,
    replicas_to_ask,
    tries_after_failure,
)
from appliance.client.bulk_read.plan import Chunk, ReadJob
from appliance.client.bulk_read.records import VerifiedChunk, parse_reply, verify_packed
from appliance.errors import (
    OK,
    BadRequestError,
    BKTimeoutError,
    BookieUnavailableError,
    DigestMismatchError,
    error_class,
)
from appliance.protocol.invariant import invariant
from ipc.curve import configure_client, is_tcp
from ipc.frames import salvage_ids
from ipc.packed import ReadPackedRequest
from ipc.requests import ReadBatchRequest, encode_request

log = logging.getLogger(__name__)

_NOBLOCK = int(zmq.NOBLOCK)


def _recv_frames(sock, frames_max: int) -> list:
    """One multipart message, or ``zmq.Again``: the first frame (the reply
    header) as bytes, the others as read-only views of ZeroMQ's buffers (no
    copy of a reply's data; a view keeps its frame alive).  Cheaper per frame
    than ``recv_multipart`` (``Frame.more`` instead of a RCVMORE getsockopt).
    Frames past ``frames_max`` are drained and dropped (the reply then fails
    to decode: a bad answer, not unbounded memory)."""
    frame = sock.recv(_NOBLOCK, copy=False)
    parts = [frame.bytes]
    while frame.more:
        frame = sock.recv(0, copy=False)  # the rest of a message is already here
        if len(parts) < frames_max:
            parts.append(memoryview(frame))
    return parts


class _Conn:
    """One DEALER socket to one bookie."""

    __slots__ = ("bookie_id", "endpoint", "sock", "inflight", "suspect_until_s", "packed")

    def __init__(self, bookie_id: str, endpoint: str, packed: bool):
        self.bookie_id, self.endpoint = bookie_id, endpoint
        self.sock = None
        self.inflight = 0
        self.suspect_until_s = 0.0
        self.packed = packed  # False once the bookie refused READ_PACKED (an older bookie)


class BulkReader:
    """Reads committed ranges of ledgers from their bookies (module docstring).
    Not thread-safe: use one per thread (a Spark task makes its own)."""

    SUSPECT_S = 30.0  # a bookie that timed out is asked last for this long

    def __init__(self, endpoints: Mapping[str, str], config: BulkReadConfig | None = None, *,
                 context: zmq.Context | None = None, clock=time.monotonic,
                 curve_keys=None, server_keys: Mapping[str, bytes] | None = None):
        self.endpoints = dict(endpoints)
        # CURVE (ipc.curve): our key pair, and each tcp bookie's server key
        self.curve_keys = curve_keys
        self.server_keys = dict(server_keys or {})
        self.config = config or BulkReadConfig()
        self.clock = clock
        self._own_context = context is None
        self._ctx = context or zmq.Context()
        self._poller = zmq.Poller()
        self._conns: dict[str, _Conn] = {}
        self._by_sock: dict[object, _Conn] = {}
        self._pending: dict[int, tuple[ReadJob, Chunk]] = {}
        self._rids = itertools.count(1)
        self._closed = False
        self.counters = dict.fromkeys(("requests", "entries", "failovers", "timeouts",
                                       "bad_records", "bad_replies", "late_replies"), 0)

    def read(self, metadata, first_entry_id: int, last_entry_id: int,
             master_key: bytes) -> Iterator[VerifiedChunk]:
        """Verified entries ``first..last`` of the ledger, in order (see module doc)."""
        from appliance.checks.digest import make_digest

        if self._closed:
            raise BookieUnavailableError("this bulk reader is closed")
        if not 0 <= first_entry_id <= last_entry_id:
            raise ValueError(f"need 0 <= first_entry_id <= last_entry_id, got "
                             f"{first_entry_id}..{last_entry_id}")
        job = ReadJob(metadata, first_entry_id, last_entry_id,
                      make_digest(metadata.digest_type, master_key), self.config, master_key)
        return self._run(job)

    def _run(self, job: ReadJob) -> Iterator[VerifiedChunk]:
        next_entry = job.next_first
        try:
            while next_entry <= job.last:
                job.refill()
                head = job.window[0]
                if head.result is None and head.error is None:
                    self._dispatch(job)
                    if head.error is None:
                        self._wait(job)
                    continue
                if head.error is not None:  # every entry before it was handed out
                    raise head.error
                job.window.pop(0)
                invariant(head.result.first_entry_id == next_entry, "bulk read out of order")
                next_entry = head.result.last_entry_id + 1
                self.counters["entries"] += head.result.count
                yield head.result
        finally:
            self._abandon(job)

    # -- sending --------------------------------------------------------------------
    def _dispatch(self, job: ReadJob) -> None:
        now = self.clock()
        suspects = {b for b, c in self._conns.items() if c.suspect_until_s > now}
        cap = self.config.inflight_per_bookie_max
        full = {b for b, c in self._conns.items() if c.inflight >= cap}
        for chunk in list(job.window):
            if chunk.result is None and chunk.error is None and chunk.sent is None \
                    and chunk.not_before_s <= now:
                if not chunk.tries and full.issuperset(job.md.write_set(chunk.first)):
                    continue  # every replica busy: a reply or a timeout frees one
                self._send_chunk(job, chunk, suspects, now)
                if chunk.sent is not None and self._conns[chunk.sent[0]].inflight >= cap:
                    full.add(chunk.sent[0])

    def _send_chunk(self, job: ReadJob, chunk: Chunk, suspects: set[str], now: float) -> None:
        run_lens = job.run_lens(chunk)
        order = replicas_to_ask(job.md.write_set(chunk.first), chunk.ordinal, run_lens,
                                chunk.tries, suspects, self.config.rounds_max)
        if order is None:
            chunk.error = no_replica_error(job.md.ledger_id, chunk.first, chunk.codes,
                                           chunk.answers)
            return
        for bookie_id in order:  # the first with room for a request
            conn = self._conn(bookie_id)
            if conn is None:
                self._failed(job, chunk, bookie_id, BookieUnavailableError.code,
                             "no endpoint: not registered when the read was planned",
                             exhaust=True)
                return
            if conn.inflight >= self.config.inflight_per_bookie_max:
                continue
            end = min(chunk.last, chunk.first + run_lens[bookie_id] - 1)
            if end < chunk.last:
                job.split(chunk, end)
            self._send(job, chunk, conn, now)
            return

    def _send(self, job: ReadJob, chunk: Chunk, conn: _Conn, now: float) -> None:
        cfg = self.config
        rid = next(self._rids)
        count = chunk.last - chunk.first + 1
        kind = ReadPackedRequest if conn.packed else ReadBatchRequest
        req = kind(job.md.ledger_id, chunk.first, chunk.last, min(count, cfg.batch_entries_max),
                   cfg.batch_bytes_max, master_key=job.master_key, request_id=rid)
        try:
            conn.sock.send_multipart(encode_request(req), _NOBLOCK)
        except zmq.Again:
            self._failed(job, chunk, conn.bookie_id, BookieUnavailableError.code,
                         f"{conn.endpoint} is not accepting requests")
            return
        conn.inflight += 1
        chunk.sent = (conn.bookie_id, rid, now + cfg.read_timeout_ms / 1000.0, conn.packed)
        self._pending[rid] = (job, chunk)
        self.counters["requests"] += 1

    def _conn(self, bookie_id: str) -> _Conn | None:
        conn = self._conns.get(bookie_id)
        if conn is None:
            endpoint = self.endpoints.get(bookie_id)
            if endpoint is None:
                return None
            conn = self._conns[bookie_id] = _Conn(bookie_id, endpoint,
                                                  self.config.packed_replies)
            self._open_socket(conn)
        return conn

    def _open_socket(self, conn: _Conn) -> None:
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, 0)  # replies are bounded by requests in flight
        sock.setsockopt(zmq.MAXMSGSIZE, self.config.batch_bytes_max
                        + self.config.entry_bytes_max + 65536)
        server_key = self.server_keys.get(conn.bookie_id)
        if self.curve_keys is not None and server_key and is_tcp(conn.endpoint):
            configure_client(sock, self.curve_keys, server_key)
        sock.connect(conn.endpoint)
        conn.sock = sock
        self._by_sock[sock] = conn
        self._poller.register(sock, zmq.POLLIN)

    def _reset(self, conn: _Conn, code: int, why: str) -> None:
        """Replace the bookie's socket: its queued requests and late replies
        are dropped, and every request it had in flight fails with ``code``."""
        self._poller.unregister(conn.sock)
        del self._by_sock[conn.sock]
        conn.sock.close(linger=0)
        conn.suspect_until_s = self.clock() + self.SUSPECT_S
        for rid, (job, chunk) in list(self._pending.items()):
            if chunk.sent is not None and chunk.sent[0] == conn.bookie_id:
                del self._pending[rid]
                chunk.sent = None
                self._failed(job, chunk, conn.bookie_id, code, why)
        conn.inflight = 0
        self._open_socket(conn)

    # -- receiving ------------------------------------------------------------------
    def _wait(self, job: ReadJob) -> None:
        """Poll once (up to the nearest deadline), handle replies and timeouts."""
        now = self.clock()
        wake_s = [c.sent[2] for _, c in self._pending.values()]
        wake_s += [c.not_before_s for c in job.window if c.not_before_s > now
                   and c.sent is None and c.result is None and c.error is None]
        wait_ms = max(0, min(int((min(wake_s, default=now) - now) * 1000) + 1,
                             self.config.read_timeout_ms))
        for sock, _ in self._poller.poll(wait_ms):
            conn = self._by_sock.get(sock)
            for _ in range(self.config.inflight_per_bookie_max + 8):  # bounded drain
                if conn is None or conn.sock is not sock:
                    break
                try:
                    frames = _recv_frames(sock, self.config.batch_entries_max + 2)
                except zmq.Again:
                    break
                self._on_reply(conn, frames)
        self._expire()

    def _on_reply(self, conn: _Conn, frames: list) -> None:
        try:
            reply = parse_reply(frames, self.config.entry_bytes_max)
        except BadRequestError as exc:
            self.counters["bad_replies"] += 1
            rid = salvage_ids(frames[0])[1] if frames else 0
            self._answer_failed(conn, rid, exc.code, f"undecodable reply: {exc}")
            return
        job, chunk, packed = self._take(conn, reply.request_id)
        if chunk is None:
            return
        if reply.status == BadRequestError.code and packed:
            if conn.packed:  # a bookie older than READ_PACKED: READ_BATCH from now on
                log.info("bookie %s refused READ_PACKED; using READ_BATCH", conn.bookie_id)
            conn.packed = False
            return  # not a failure: the chunk is sent again, the other way
        if reply.status != OK:
            self._failed(job, chunk, conn.bookie_id, reply.status, "")
            return
        if reply.first_entry_id != chunk.first:
            self._failed(job, chunk, conn.bookie_id, BadRequestError.code,
                         f"answered from entry {reply.first_entry_id}")
            return
        got, why = verify_packed(reply.data, reply.lengths, job.md.ledger_id, chunk.first,
                                 job.digest)
        if why is not None:
            self.counters["bad_records"] += 1
            log.warning("bookie %s: ledger %d: %s", conn.bookie_id, job.md.ledger_id, why)
        rest = self._complete(job, chunk, got)
        if rest is None:
            return
        if why is not None:
            self._failed(job, rest, conn.bookie_id, DigestMismatchError.code, why)
        elif reply.stop_status != OK:
            self._failed(job, rest, conn.bookie_id, reply.stop_status, "")

    def _take(self, conn: _Conn, rid: int):
        pending = self._pending.get(rid)
        if pending is None or pending[1].sent is None or pending[1].sent[0] != conn.bookie_id:
            self.counters["late_replies"] += 1
            return None, None, False
        del self._pending[rid]
        conn.inflight -= 1
        job, chunk = pending
        packed, chunk.sent = chunk.sent[3], None
        return job, chunk, packed

    def _answer_failed(self, conn: _Conn, rid: int, code: int, why: str) -> None:
        job, chunk, _ = self._take(conn, rid)
        if chunk is not None:
            self._failed(job, chunk, conn.bookie_id, code, why)

    def _complete(self, job: ReadJob, chunk: Chunk, got: VerifiedChunk | None):
        """Record the verified prefix; returns the chunk still to read (the
        rest of this one, or itself if nothing verified), or None."""
        if got is None:
            return chunk
        rest = job.split(chunk, got.last_entry_id) if got.last_entry_id < chunk.last else None
        chunk.result = got
        return rest

    def _failed(self, job: ReadJob, chunk: Chunk, bookie_id: str, code: int, why: str,
                exhaust: bool = False) -> None:
        """A replica did not serve ``chunk.first``: count it, try the next."""
        self.counters["failovers"] += 1
        endpoint = self.endpoints.get(bookie_id, "no endpoint")
        chunk.answers.append(f"{bookie_id} at {endpoint}: {error_class(code).__name__}"
                             + (f" ({why})" if why else ""))
        chunk.codes.append(code)
        chunk.tries, round_done = tries_after_failure(
            job.md.write_set(chunk.first), chunk.tries, bookie_id, self.config.rounds_max,
            exhaust)
        if round_done:  # a whole round failed: give restarting bookies a moment
            chunk.not_before_s = self.clock() + self.config.retry_backoff_ms / 1000.0

    def _expire(self) -> None:
        now = self.clock()
        late = {c.sent[0] for _, c in self._pending.values() if c.sent[2] <= now}
        for bookie_id in late:
            self.counters["timeouts"] += 1
            self._reset(self._conns[bookie_id], BKTimeoutError.code,
                        f"no reply within {self.config.read_timeout_ms} ms")

    def _abandon(self, job: ReadJob) -> None:
        """Forget the job's requests in flight (their replies will be dropped)."""
        for rid, (owner, chunk) in list(self._pending.items()):
            if owner is job:
                del self._pending[rid]
                self._conns[chunk.sent[0]].inflight -= 1
                chunk.sent = None

    # -- lifecycle ------------------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for conn in self._conns.values():
            if conn.sock is not None:
                self._poller.unregister(conn.sock)
                conn.sock.close(linger=0)
                conn.sock = None
        self._pending.clear()
        if self._own_context:
            self._ctx.term()

    def __enter__(self) -> BulkReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
