"""Bulk reads of committed ledger ranges straight from the bookies, for
analytics (``appliance.spark``): READ_PACKED messages of many entries (one
data frame per reply), checks vectorised over each reply, failover between
the replicas of every entry.

    with BulkReader(endpoints) as reader:          # {bookie id: endpoint}
        for chunk in reader.read(metadata, 0, metadata.last_entry_id, master_key):
            chunk.first_entry_id, chunk.payloads, chunk.offsets

The caller fixes the range before reading (a CLOSED ledger's last entry, an
OPEN ledger's LAC): every entry asked for is committed, so its fragment and
write set in ``metadata`` can no longer change and any replica may serve it.
This reader does not fence, recover or touch the metadata store.

Guarantees:

* **Verified bytes only.**  An entry is handed out only if its digest (CRC32C
  or HMAC-SHA256 over header and payload) matches, its header names the
  ledger and entry asked for, its LAC is below its id, and its running
  length agrees with the entry before it in the same reply.  A reply is cut
  at its first bad record; the rest is asked of another replica.  A corrupt,
  misfiled or lying bookie costs time, never wrong bytes.
* **Order, exactly once**: chunks come out in entry order, without gaps or
  overlaps, covering exactly ``first..last``.
* **Failover**: a timeout, an error reply, an error row, an undecodable reply
  or a bad record moves the rest of the range to the next bookie of the
  entry's write set.  Each bookie is tried at most ``rounds_max`` times per
  entry, with ``retry_backoff_ms`` between rounds; then, once every entry
  before it was handed out, the read raises an ``appliance.errors`` error
  naming the ledger, the first entry no replica served and every answer.
  It is ``NoSuchEntryError`` only when every answer was an explicit negative.
* **Bounded**: at most ``inflight_per_bookie_max`` requests per bookie and
  ``window_chunks_max`` chunks (in flight or verified) ahead of the one being
  handed out; every wait has a deadline (``read_timeout_ms``).  A bookie that
  timed out gets a fresh socket, so its late replies are never read.

Faults survived: a bookie that is down, restarts, stalls, serves corrupt or
misfiled records, or answers garbage, as long as one replica of each entry
answers correctly within the rounds.  Decoding and verification, the pure
half, live in ``appliance.client.bulk_read.records``.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import zmq

from appliance.client.bulk_read.records import (
    ParsedReply,
    VerifiedChunk,
    parse_reply,
    verify_packed,
    verify_records,
)
from appliance.errors import (
    OK,
    BadRequestError,
    BKError,
    BKTimeoutError,
    BookieUnavailableError,
    DigestMismatchError,
    error_class,
    is_explicit_negative,
)
from appliance.protocol.invariant import invariant
from ipc.frames import DEFAULT_LIMITS
from ipc.packed import ReadPackedRequest
from ipc.requests import ReadBatchRequest, encode_request

__all__ = ["BulkReadConfig", "BulkReader", "ParsedReply", "VerifiedChunk", "parse_reply",
           "verify_packed", "verify_records"]

log = logging.getLogger(__name__)

_NOBLOCK = int(zmq.NOBLOCK)


@dataclass(frozen=True)
class BulkReadConfig:
    """Knobs of a bulk read, each a trade-off."""

    # Deadline of one batched read.  Shorter: a dead bookie is skipped sooner;
    # longer: fewer needless failovers from a merely busy bookie.
    read_timeout_ms: int = 5000
    # Entries asked per read (the bookie also cuts at its own limit).
    # More amortises the per-message cost; fewer bounds one reply's memory.
    batch_entries_max: int = 1024
    # Entry bytes asked per read: bounds one reply's memory.
    batch_bytes_max: int = 16 * 1024 * 1024
    # Requests outstanding per bookie.  More hides round trips; fewer keeps
    # one reader from crowding out other clients of the bookie.
    inflight_per_bookie_max: int = 2
    # Chunks in flight or verified ahead of the one handed out: bounds the
    # memory of out-of-order replies (about this many replies).
    window_chunks_max: int = 12
    # Tries of each replica per entry before the read fails.  More rides out
    # restarts; fewer fails a hopeless read sooner.
    rounds_max: int = 2
    # Pause before a new round over the replicas (a restarting bookie).
    retry_backoff_ms: int = 200
    # Largest entry accepted in a reply (header, digest and payload).
    entry_bytes_max: int = DEFAULT_LIMITS.entry_bytes_max
    # READ_PACKED (a reply's entries in one frame: the per-entry cost of a
    # ZeroMQ frame disappears on both ends) or READ_BATCH (one frame per
    # entry; for bookies that predate READ_PACKED).
    packed_replies: bool = True

    def __post_init__(self) -> None:
        for name in ("read_timeout_ms", "batch_entries_max", "batch_bytes_max",
                     "inflight_per_bookie_max", "window_chunks_max", "rounds_max",
                     "entry_bytes_max"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.retry_backoff_ms < 0:
            raise ValueError(f"retry_backoff_ms must be >= 0, got {self.retry_backoff_ms}")


def _recv_frames(sock, frames_max: int) -> list[bytes]:
    """One multipart message as bytes, or ``zmq.Again``.  Cheaper per frame
    than ``recv_multipart`` (``Frame.more`` instead of a RCVMORE getsockopt).
    Frames past ``frames_max`` are drained and dropped (the reply then fails
    to decode: a bad answer, not unbounded memory)."""
    frame = sock.recv(_NOBLOCK, copy=False)
    parts = [frame.bytes]
    while frame.more:
        frame = sock.recv(0, copy=False)  # the rest of a message is already here
        if len(parts) < frames_max:
            parts.append(frame.bytes)
    return parts


# -- the reader ------------------------------------------------------------------------------
class _Chunk:
    """A run of entries asked of one bookie at a time."""

    __slots__ = ("first", "last", "ordinal", "tries", "answers", "codes", "not_before_s",
                 "sent", "result", "error")

    def __init__(self, first: int, last: int, ordinal: int):
        self.first, self.last, self.ordinal = first, last, ordinal
        self.tries: dict[str, int] = {}  # bookie -> times asked for entry ``first``
        self.answers: list[str] = []  # what each try answered, for the error message
        self.codes: list[int] = []
        self.not_before_s = 0.0  # backoff before the next round
        self.sent: tuple[str, int, float] | None = None  # (bookie, request id, deadline)
        self.result: VerifiedChunk | None = None
        self.error: BKError | None = None  # every replica failed (raised once at the head)


class _ReadJob:
    """The state of one ``BulkReader.read`` call: a window of chunks in entry order."""

    def __init__(self, metadata, first: int, last: int, digest, config: BulkReadConfig):
        self.md, self.last, self.digest, self.config = metadata, last, digest, config
        self.next_first = first
        self.window: list[_Chunk] = []
        self.ordinals = itertools.count()

    def refill(self) -> None:
        cfg, md = self.config, self.md
        while len(self.window) < cfg.window_chunks_max and self.next_first <= self.last:
            s = self.next_first
            span = cfg.batch_entries_max
            if md.ensemble_size > md.write_quorum:  # striped: a bookie holds runs of Qw
                span = min(span, md.write_quorum)
            end = min(self.last, _fragment_end(md, s), s + span - 1)
            self.window.append(_Chunk(s, end, next(self.ordinals)))
            self.next_first = end + 1

    def split(self, chunk: _Chunk, last: int) -> _Chunk:
        """Cut ``chunk`` after ``last``; the rest becomes the next chunk."""
        rest = _Chunk(last + 1, chunk.last, next(self.ordinals))
        chunk.last = last
        self.window.insert(self.window.index(chunk) + 1, rest)
        return rest

    def candidates(self, chunk: _Chunk, suspects: set[str]) -> list[str]:
        """The write set of the chunk's first entry, best first: longest run
        held, then not suspect, then rotated by chunk for load spreading."""
        ws = list(self.md.write_set(chunk.first))
        k = chunk.ordinal % len(ws)
        ws = ws[k:] + ws[:k]
        return sorted(ws, key=lambda b: (-self.run_len(b, chunk.first), b in suspects))

    def run_len(self, bookie_id: str, entry_id: int) -> int:
        """How many entries from ``entry_id`` on ``bookie_id`` holds in a row."""
        md = self.md
        if md.ensemble_size == md.write_quorum:
            return 1 << 62
        index = md.fragment_for(entry_id)[1].index(bookie_id)
        return (index - entry_id) % md.ensemble_size + 1

    def failure(self, chunk: _Chunk) -> BKError:
        codes = chunk.codes
        if codes and all(is_explicit_negative(c) for c in codes):
            cls = error_class(codes[0])
        elif DigestMismatchError.code in codes:
            cls = DigestMismatchError
        elif codes and all(c == BKTimeoutError.code for c in codes):
            cls = BKTimeoutError
        else:
            cls = error_class(codes[-1]) if codes else BookieUnavailableError
        return cls(f"ledger {self.md.ledger_id} entry {chunk.first}: no replica served it "
                   f"({'; '.join(chunk.answers)})")


def _fragment_end(md, entry_id: int) -> int:
    """The last entry id of the fragment holding ``entry_id`` (unbounded: 2**63-1)."""
    for first, _ in md.ensembles:
        if first > entry_id:
            return first - 1
    return (1 << 63) - 1


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
                 context: zmq.Context | None = None, clock=time.monotonic):
        self.endpoints = dict(endpoints)
        self.config = config or BulkReadConfig()
        self.clock = clock
        self._own_context = context is None
        self._ctx = context or zmq.Context()
        self._poller = zmq.Poller()
        self._conns: dict[str, _Conn] = {}
        self._by_sock: dict[object, _Conn] = {}
        self._pending: dict[int, tuple[_ReadJob, _Chunk]] = {}
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
        job = _ReadJob(metadata, first_entry_id, last_entry_id,
                       make_digest(metadata.digest_type, master_key), self.config)
        return self._run(job)

    def _run(self, job: _ReadJob) -> Iterator[VerifiedChunk]:
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
    def _dispatch(self, job: _ReadJob) -> None:
        now = self.clock()
        suspects = {b for b, c in self._conns.items() if c.suspect_until_s > now}
        for chunk in list(job.window):
            if chunk.result is None and chunk.error is None and chunk.sent is None \
                    and chunk.not_before_s <= now:
                self._send_chunk(job, chunk, suspects, now)

    def _send_chunk(self, job: _ReadJob, chunk: _Chunk, suspects: set[str], now: float) -> None:
        cands = job.candidates(chunk, suspects)
        rounds = [chunk.tries.get(b, 0) for b in cands]
        if min(rounds) >= self.config.rounds_max:
            chunk.error = job.failure(chunk)
            return
        best = [b for b in cands if chunk.tries.get(b, 0) == min(rounds)]
        healthy = [b for b in best if b not in suspects]
        for bookie_id in healthy or best:  # a busy healthy replica beats a suspect one
            conn = self._conn(bookie_id)
            if conn is None:
                self._failed(job, chunk, bookie_id, BookieUnavailableError.code,
                             "no endpoint: not registered when the read was planned",
                             exhaust=True)
                return
            if conn.inflight >= self.config.inflight_per_bookie_max:
                continue
            end = min(chunk.last, chunk.first + job.run_len(bookie_id, chunk.first) - 1)
            if end < chunk.last:
                job.split(chunk, end)
            self._send(job, chunk, conn, now)
            return

    def _send(self, job: _ReadJob, chunk: _Chunk, conn: _Conn, now: float) -> None:
        cfg = self.config
        rid = next(self._rids)
        count = chunk.last - chunk.first + 1
        kind = ReadPackedRequest if conn.packed else ReadBatchRequest
        req = kind(job.md.ledger_id, chunk.first, chunk.last, min(count, cfg.batch_entries_max),
                   cfg.batch_bytes_max, request_id=rid)
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
    def _wait(self, job: _ReadJob) -> None:
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
            from ipc.frames import salvage_ids

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

    def _complete(self, job: _ReadJob, chunk: _Chunk, got: VerifiedChunk | None):
        """Record the verified prefix; returns the chunk still to read (the
        rest of this one, or itself if nothing verified), or None."""
        if got is None:
            return chunk
        rest = job.split(chunk, got.last_entry_id) if got.last_entry_id < chunk.last else None
        chunk.result = got
        return rest

    def _failed(self, job: _ReadJob, chunk: _Chunk, bookie_id: str, code: int, why: str,
                exhaust: bool = False) -> None:
        """A replica did not serve ``chunk.first``: count it, try the next."""
        self.counters["failovers"] += 1
        endpoint = self.endpoints.get(bookie_id, "no endpoint")
        chunk.answers.append(f"{bookie_id} at {endpoint}: {error_class(code).__name__}"
                             + (f" ({why})" if why else ""))
        chunk.codes.append(code)
        before = min(chunk.tries.get(b, 0) for b in job.md.write_set(chunk.first))
        chunk.tries[bookie_id] = (self.config.rounds_max if exhaust
                                  else chunk.tries.get(bookie_id, 0) + 1)
        after = min(chunk.tries.get(b, 0) for b in job.md.write_set(chunk.first))
        if after > before:  # a whole round failed: give restarting bookies a moment
            chunk.not_before_s = self.clock() + self.config.retry_backoff_ms / 1000.0

    def _expire(self) -> None:
        now = self.clock()
        late = {c.sent[0] for _, c in self._pending.values() if c.sent[2] <= now}
        for bookie_id in late:
            self.counters["timeouts"] += 1
            self._reset(self._conns[bookie_id], BKTimeoutError.code,
                        f"no reply within {self.config.read_timeout_ms} ms")

    def _abandon(self, job: _ReadJob) -> None:
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
