"""The bulk reader: the client transport's I/O over the pure planning
(``plan``), failover (``failover``) and verification (``records``) of a
bulk read.

``BulkReader`` talks to the bookies through one ``ipc.client.Transport``
without an I/O thread (the thread iterating a read runs it, so a reply
costs no thread hand-off) and with ``raw_replies``: the transport matches a
reply to its request but does not decode it, so the READ_PACKED data frame
stays ZeroMQ's buffer, never copied into Python bytes, and its records are
verified in batch here.  Deadlines, CURVE, reconnects and late replies are
the transport's: every request ends in exactly one event (its reply, a
timeout at ``read_timeout_ms``, or a failure such as a bookie that
disconnected, was never reached or refused our key), and a reply after
that is dropped there.  Not thread-safe: one reader per thread.

It guarantees what the package docstring lists: verified bytes only,
entries in order and exactly once, failover between replicas, and bounds on
requests in flight per bookie (a request counts until its event arrived,
also after its read was abandoned), chunks ahead, and the wait for every
reply.  A bookie that timed out or could not be reached is suspect (asked
last) for ``SUSPECT_S``.  ``close()`` closes every socket (``linger=0``).

Speculative reads (``speculative_read_timeout_ms``, 0 = off): a chunk
unanswered that long is also asked, once, of another replica that holds
the whole chunk and has room for a request (so the duplicates are bounded
by ``inflight_per_bookie_max``), and the slow bookie becomes suspect.  The
first reply wins and the other copy's event is dropped; a copy that fails
(timeout, unreachable) while the other is still out leaves the chunk to
it and costs no try.  A negative still needs every replica's answer
(``failover``): a copy's answer counts for its own replica only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping

import zmq

from appliance.checks.digest import make_digest
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
    BKError,
    BKTimeoutError,
    BookieUnavailableError,
    DigestMismatchError,
    error_class,
)
from appliance.protocol.invariant import invariant
from ipc.client import Event, Transport
from ipc.frames import WireLimits
from ipc.packed import ReadPackedRequest
from ipc.requests import ReadBatchRequest

log = logging.getLogger(__name__)

_SUSPECT_CODES = (BKTimeoutError.code, BookieUnavailableError.code)


def _frames(event: Event) -> list:
    """A raw reply's frames as ``parse_reply`` takes them: the header as
    bytes, the others as read-only views of ZeroMQ's buffers (no copy of a
    reply's data; a view keeps its frame alive)."""
    frames = event.frames
    return [frames[0].bytes, *map(memoryview, frames[1:])]


class _Bookie:
    """What the reader knows of one bookie."""

    __slots__ = ("bookie_id", "endpoint", "inflight", "suspect_until_s", "packed")

    def __init__(self, bookie_id: str, endpoint: str, packed: bool):
        self.bookie_id, self.endpoint = bookie_id, endpoint
        self.inflight = 0  # requests sent whose event has not been handled yet
        self.suspect_until_s = 0.0
        self.packed = packed  # False once the bookie refused READ_PACKED (an older bookie)


class BulkReader:
    """Reads committed ranges of ledgers from their bookies (module docstring).
    Not thread-safe: use one per thread (a Spark task makes its own)."""

    SUSPECT_S = 30.0  # a bookie that timed out or was unreachable is asked last this long

    def __init__(self, endpoints: Mapping[str, str], config: BulkReadConfig | None = None, *,
                 context: zmq.Context | None = None, clock=time.monotonic,
                 curve_keys=None, server_keys: Mapping[str, bytes] | None = None):
        self.endpoints = dict(endpoints)
        # CURVE (ipc.curve): our key pair, and each tcp bookie's server key
        self.curve_keys = curve_keys
        self.server_keys = dict(server_keys or {})
        self.config = cfg = config or BulkReadConfig()
        self.clock = clock
        self._inbox: list[Event] = []  # events the transport delivered, not yet handled
        self._transport = Transport(
            on_events=self._inbox.extend, io_thread=False, raw_replies=True,
            inflight_per_bookie_max=cfg.inflight_per_bookie_max, context=context, clock=clock,
            curve_keys=curve_keys, limits=WireLimits(  # also ZMQ_MAXMSGSIZE of a reply
                entry_bytes_max=cfg.entry_bytes_max, batch_entries_max=cfg.batch_entries_max,
                batch_bytes_max=cfg.batch_bytes_max))
        self._bookies: dict[str, _Bookie] = {}
        self._pending: dict[int, tuple[ReadJob | None, Chunk]] = {}  # job None: abandoned
        self._closed = False
        self.counters = dict.fromkeys(("requests", "entries", "failovers", "timeouts",
                                       "bad_records", "bad_replies", "late_replies",
                                       "speculative"), 0)

    def read(self, metadata, first_entry_id: int, last_entry_id: int,
             master_key: bytes) -> Iterator[VerifiedChunk]:
        """Verified entries ``first..last`` of the ledger, in order (see module doc)."""
        if self._closed:
            raise BookieUnavailableError("this bulk reader is closed")
        if not 0 <= first_entry_id <= last_entry_id:
            raise ValueError(f"need 0 <= first_entry_id <= last_entry_id, got "
                             f"{first_entry_id}..{last_entry_id}")
        job = ReadJob(metadata, first_entry_id, last_entry_id,
                      make_digest(metadata.digest_type, master_key), self.config, master_key)
        return self._run(job)

    def _run(self, job: ReadJob) -> Iterator[VerifiedChunk]:
        self._transport.bind_owner()  # the thread iterating runs the sockets
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
        suspects = {b for b, c in self._bookies.items() if c.suspect_until_s > now}
        cap = self.config.inflight_per_bookie_max
        full = {b for b, c in self._bookies.items() if c.inflight >= cap}
        for chunk in list(job.window):
            if chunk.result is None and chunk.error is None and chunk.sent is None \
                    and chunk.not_before_s <= now:
                if not chunk.tries and full.issuperset(job.md.write_set(chunk.first)):
                    continue  # every replica busy: a reply or a timeout frees one
                self._send_chunk(job, chunk, suspects)
                if chunk.sent is not None and self._bookies[chunk.sent[0]].inflight >= cap:
                    full.add(chunk.sent[0])
        self._speculate(job, now)

    def _speculate(self, job: ReadJob, now: float) -> None:
        """Chunks out for the speculative timeout: a copy to another replica
        holding the whole chunk with room for a request (module docstring)."""
        spec_s = self.config.speculative_read_timeout_ms / 1000.0
        if spec_s <= 0:
            return
        for chunk in job.window:
            if chunk.sent is None or chunk.hedge is not None or chunk.result is not None \
                    or now - chunk.sent_at_s < spec_s:
                continue
            slow = self._bookies[chunk.sent[0]]
            slow.suspect_until_s = max(slow.suspect_until_s, now + self.SUSPECT_S)
            need = chunk.last - chunk.first + 1
            run_lens = job.run_lens(chunk)
            for bookie_id in job.md.write_set(chunk.first):
                bookie = self._bookie(bookie_id)
                if bookie is None or bookie is slow or run_lens[bookie_id] < need \
                        or bookie.inflight >= self.config.inflight_per_bookie_max:
                    continue
                primary = chunk.sent
                self._send(job, chunk, bookie)
                if chunk.sent is not primary:  # sent: keep the first as ``sent``
                    chunk.sent, chunk.hedge = primary, chunk.sent
                    self.counters["speculative"] += 1
                break

    def _send_chunk(self, job: ReadJob, chunk: Chunk, suspects: set[str]) -> None:
        run_lens = job.run_lens(chunk)
        order = replicas_to_ask(job.md.write_set(chunk.first), chunk.ordinal, run_lens,
                                chunk.tries, suspects, self.config.rounds_max)
        if order is None:
            chunk.error = no_replica_error(job.md.ledger_id, chunk.first, chunk.codes,
                                           chunk.answers)
            return
        for bookie_id in order:  # the first with room for a request
            bookie = self._bookie(bookie_id)
            if bookie is None:
                self._failed(job, chunk, bookie_id, BookieUnavailableError.code,
                             "no endpoint: not registered when the read was planned",
                             exhaust=True)
                return
            if bookie.inflight >= self.config.inflight_per_bookie_max:
                continue
            end = min(chunk.last, chunk.first + run_lens[bookie_id] - 1)
            if end < chunk.last:
                job.split(chunk, end)
            self._send(job, chunk, bookie)
            return

    def _send(self, job: ReadJob, chunk: Chunk, bookie: _Bookie) -> None:
        cfg = self.config
        count = chunk.last - chunk.first + 1
        kind = ReadPackedRequest if bookie.packed else ReadBatchRequest
        req = kind(job.md.ledger_id, chunk.first, chunk.last, min(count, cfg.batch_entries_max),
                   cfg.batch_bytes_max, master_key=job.master_key)
        try:  # a failure past this point comes back as the request's event
            rid = self._transport.send(bookie.bookie_id, req, cfg.read_timeout_ms)
        except BKError as exc:
            self._failed(job, chunk, bookie.bookie_id, exc.code, str(exc))
            return
        bookie.inflight += 1
        chunk.sent = (bookie.bookie_id, rid, bookie.packed)
        chunk.sent_at_s = self.clock()
        self._pending[rid] = (job, chunk)
        self.counters["requests"] += 1

    def _bookie(self, bookie_id: str) -> _Bookie | None:
        bookie = self._bookies.get(bookie_id)
        if bookie is None:
            endpoint = self.endpoints.get(bookie_id)
            if endpoint is None:
                return None
            self._transport.add_bookie(bookie_id, endpoint,
                                       self.server_keys.get(bookie_id) or None)
            bookie = self._bookies[bookie_id] = _Bookie(bookie_id, endpoint,
                                                        self.config.packed_replies)
        return bookie

    # -- receiving ------------------------------------------------------------------
    def _wait(self, job: ReadJob) -> None:
        """Step the transport once (until an event, the nearest deadline or
        the nearest backoff), then handle what it delivered."""
        now = self.clock()
        wake_s = [c.not_before_s for c in job.window if c.not_before_s > now
                  and c.sent is None and c.result is None and c.error is None]
        if self._pending:  # the transport ends the wait by the nearest deadline
            wake_s.append(now + self.config.read_timeout_ms / 1000.0)
        spec_s = self.config.speculative_read_timeout_ms / 1000.0
        if spec_s > 0:  # ... or by the next chunk to speculate on
            wake_s += [c.sent_at_s + spec_s for c in job.window
                       if c.sent is not None and c.hedge is None and c.result is None]
        wait_ms = max(0, min(int((min(wake_s, default=now) - now) * 1000) + 1,
                             self.config.read_timeout_ms))
        self._transport.step(wait_ms)
        events = self._inbox[:]
        self._inbox.clear()
        for event in events:
            self._on_event(event)

    def _on_event(self, event: Event) -> None:
        bookie = self._bookies[event.bookie_id]
        bookie.inflight -= 1
        job, chunk = self._pending.pop(event.request_id, (None, None))
        if job is None:  # its read was abandoned
            self.counters["late_replies"] += event.frames is not None
            return
        mine, other = (chunk.sent, chunk.hedge) if chunk.sent[1] == event.request_id \
            else (chunk.hedge, chunk.sent)
        if other is not None and event.frames is None:  # the other copy may still answer
            if event.status in _SUSPECT_CODES:
                bookie.suspect_until_s = self.clock() + self.SUSPECT_S
            chunk.sent, chunk.hedge = other, None
            return
        if other is not None:  # first answer wins: the other copy's event is dropped
            self._pending[other[1]] = (None, chunk)
        packed, chunk.sent, chunk.hedge = mine[2], None, None
        if event.frames is not None:
            self._on_reply(bookie, job, chunk, packed, _frames(event))
            return
        # no reply: a timeout, or the transport's failure (CURVE: why it was refused)
        why = self._transport.refused_bookies().get(bookie.bookie_id, "")
        if event.status == BKTimeoutError.code:
            self.counters["timeouts"] += 1
            why = f"no reply within {self.config.read_timeout_ms} ms"
        if event.status in _SUSPECT_CODES:
            bookie.suspect_until_s = self.clock() + self.SUSPECT_S
        self._failed(job, chunk, bookie.bookie_id, event.status, why)

    def _on_reply(self, bookie: _Bookie, job: ReadJob, chunk: Chunk, packed: bool,
                  frames: list) -> None:
        try:
            reply = parse_reply(frames, self.config.entry_bytes_max)
        except BadRequestError as exc:
            self.counters["bad_replies"] += 1
            self._failed(job, chunk, bookie.bookie_id, exc.code, f"undecodable reply: {exc}")
            return
        if reply.status == BadRequestError.code and packed:
            if bookie.packed:  # a bookie older than READ_PACKED: READ_BATCH from now on
                log.info("bookie %s refused READ_PACKED; using READ_BATCH", bookie.bookie_id)
            bookie.packed = False
            return  # not a failure: the chunk is sent again, the other way
        if reply.status != OK:
            self._failed(job, chunk, bookie.bookie_id, reply.status, "")
            return
        if reply.first_entry_id != chunk.first:
            self._failed(job, chunk, bookie.bookie_id, BadRequestError.code,
                         f"answered from entry {reply.first_entry_id}")
            return
        got, why = verify_packed(reply.data, reply.lengths, job.md.ledger_id, chunk.first,
                                 job.digest)
        if why is not None:
            self.counters["bad_records"] += 1
            log.warning("bookie %s: ledger %d: %s", bookie.bookie_id, job.md.ledger_id, why)
        rest = self._complete(job, chunk, got)
        if rest is None:
            return
        if why is not None:
            self._failed(job, rest, bookie.bookie_id, DigestMismatchError.code, why)
        elif reply.stop_status != OK:
            self._failed(job, rest, bookie.bookie_id, reply.stop_status, "")

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

    def _abandon(self, job: ReadJob) -> None:
        """Forget the job's requests in flight: their events, when they come,
        are dropped (they still count against their bookie's limit)."""
        for rid, (owner, chunk) in list(self._pending.items()):
            if owner is job:
                self._pending[rid] = (None, chunk)
                chunk.sent = chunk.hedge = None

    # -- lifecycle ------------------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._transport.close()
        self._pending.clear()
        self._inbox.clear()

    def __enter__(self) -> BulkReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
