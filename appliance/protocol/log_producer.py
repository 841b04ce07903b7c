"""The producer core: one producer of a log (``bk.log(name).producer()``),
without I/O.  Events in, actions out; time is passed in (``now_ms``).

Guarantees (``appliance.logs.producer`` carries them to the user):

* Numbering: writes are numbered 1, 2, 3 ... in the order they enter; a
  producer resuming a given id (``resume=True``) first asks the owner
  (``hello``) and continues after the last number it knows.  An explicit
  ``seq`` must be above the previous write's (else that write alone fails
  with ``ValueError``).
* The window: at most ``LOG_PRODUCER_INFLIGHT_RECORDS_MAX`` records and
  ``LOG_PRODUCER_INFLIGHT_BYTES_MAX`` bytes are unacknowledged (one record
  always fits); writes beyond it wait in the core, unnumbered and unsent,
  until room is freed.
* Sending: unsent writes leave as write requests of at most
  ``LOG_PRODUCER_BATCH_RECORDS_MAX`` records / ``_BATCH_BYTES_MAX`` bytes,
  ``LOG_PRODUCER_REQUESTS_INFLIGHT_MAX`` requests awaiting their reply at a
  time (the rest leave together once one is answered: adaptive batching).
* Settling: a ``written`` reply settles the pending writes it names with
  their DLSNs (whatever its generation: a record's position does not change
  with a resend); each write is settled once, and the DLSNs one producer
  settles increase with its sequence numbers.
* Riding over failures: no owner known -> ``FindOwner`` (the driver looks
  it up, ``OwnerFound`` answers; none: try again after a back-off);
  ``not_owner`` -> the endpoint it names (else find again); a request
  unanswered for ``LOG_PRODUCER_REQUEST_TIMEOUT_MS``, or the owner's
  process known gone (``ServerGone``: its registration went, the
  supervisor deletes a dead server's at once) -> find the owner again;
  ``retry``, ``held`` (4x longer) and a ``gap`` -> a pause with back-off
  (20 ms doubling to 500 ms, reset by a ``written``).  A gap below the
  oldest unacknowledged write is retried too: it comes from an owner whose
  view is older than what this producer was told was stored (a server
  paused past its session that has not yet seen its lease go: its entries
  are fenced, its log soon handed over; tests/sim/logservicesim found it);
  if no owner ever agrees, the deadline fails the writes, naming it.  Each
  of these starts a new generation and resends every unacknowledged write
  with its number; error and hello replies of older generations are
  ignored.
* Failing: a write not stored within ``LOG_PRODUCER_DEADLINE_MS`` of entering
  fails with ``LogServiceUnavailableError`` (naming the last refusal), and
  so do every pending and every later write (sticky); so do a refusal of
  the server's CURVE handshake (``Refused``: ``UnauthorizedError`` naming
  the log server), ``full`` (``TooManyProducersError``) and ``bad``
  (``BadRequestError``).  After ``close()`` a write
  fails with ``ClientClosedError``.

Threads: a core is driven by one thread (the process's producer I/O
thread, ``appliance.logs.producer_loop``), which owns every field below.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

from appliance.protocol import limits
from appliance.protocol.errors import (
    BadRequestError,
    BKError,
    ClientClosedError,
    LogServiceUnavailableError,
    TooManyProducersError,
)
from appliance.protocol.invariant import invariant
from appliance.protocol.log_service import (
    BAD,
    FORGOTTEN,
    HELD,
    NOT_OWNER,
    WRITTEN_KIND,
    decode_header,
    decode_written,
    encode_header,
    encode_write,
)
from appliance.protocol.logs import dlsn_of

BACKOFF_MIN_MS, BACKOFF_MAX_MS = 20, 500  # between tries while the log has no owner
HELD_BACKOFF_FACTOR = 4  # a log held by an exclusive writer: wait longer


# -- actions (core -> driver) -------------------------------------------------------------
@dataclass(slots=True)
class Send:
    """Send ``frame`` (one request) to the log server at ``endpoint``."""
    endpoint: str
    frame: bytes
    payload_bytes: int


@dataclass(slots=True)
class FindOwner:
    """Look the log's owner up; answer with ``OwnerFound``."""


@dataclass(slots=True)
class WakeAt:
    """Call ``tick`` at ``at_ms`` (a back-off ends); stale ones are harmless."""
    at_ms: int


@dataclass(slots=True)
class Settle:
    """These writes are stored: ``done`` is (DLSN or None: position
    forgotten, token) pairs, in order; ``payload_bytes`` leave the window."""
    done: list
    payload_bytes: int


@dataclass(slots=True)
class Fail:
    """These writes failed with ``error``: ``done`` is (None, token) pairs."""
    done: list
    error: BaseException
    payload_bytes: int


# -- events (driver -> core) --------------------------------------------------------------
@dataclass(slots=True)
class Reply:
    frame: bytes
    now_ms: int


@dataclass(slots=True)
class OwnerFound:
    endpoint: str | None  # None: no owner and no live server
    now_ms: int


@dataclass(slots=True)
class Tick:
    now_ms: int


@dataclass(slots=True)
class Refused:
    """The log server this producer writes to refused it (``error``: its
    CURVE handshake refused this client's key, or the server's key is not
    one this client may use): every write fails with it (sticky)."""
    error: BaseException
    now_ms: int


@dataclass(slots=True)
class ServerGone:
    """The log server at ``endpoint`` died or was replaced (its registration
    went: ``appliance.logs.server_watch``): what was sent there is lost."""
    endpoint: str
    now_ms: int


class _Write:
    __slots__ = ("seq", "payload", "token", "since_ms")

    def __init__(self, seq: int | None, payload: bytes, token, since_ms: int):
        self.seq, self.payload, self.token, self.since_ms = seq, payload, token, since_ms


class ProducerCore:
    """One producer's protocol state (see the module docstring)."""

    def __init__(self, name: str, pid: bytes, *, resume: bool = False):
        self.name, self.pid = name, pid
        self._name_bytes = name.encode()
        self._pid_hex = pid.hex()
        self.pending: OrderedDict[int, _Write] = OrderedDict()  # numbered, unacknowledged
        self.inflight_bytes = 0
        self.unsent: deque[_Write] = deque()  # pending writes of this generation not sent
        self.waiting: deque[_Write] = deque()  # entered, not yet in the window (unnumbered)
        self.next_seq: int | None = None if resume else 1
        self.numbered = False  # a write took a number (explicit seqs increase from it)
        self.gen = 0
        self.endpoint: str | None = None
        self.finding = False  # a FindOwner is out
        self.hello_gen = -1  # the generation whose hello was sent
        self.awaiting = 0  # requests of this generation awaiting their reply
        self._awaited: set[int] = set()  # the first seq of each write request of them
        self.last_reply_ms = 0
        self.resend_at_ms: int | None = None  # paused after a refusal
        self.connect_at_ms = 0  # no owner found: look again from then on
        self.backoff_ms = BACKOFF_MIN_MS
        self.error: BaseException | None = None
        self.closed = False
        self.last_refusal: str | None = None
        self._settled = (0, None)  # (seq, DLSN) of the last write settled with a position
        self.stats = {"requests": 0, "redirects": 0, "retries": 0, "timeouts": 0,
                      "stale_replies": 0, "servers_gone": 0}
        self._out: list = []
        self._handlers = {Reply: self._on_reply, OwnerFound: self._on_owner_found,
                          Tick: self._on_tick, ServerGone: self._on_server_gone,
                          Refused: self._on_refused}

    # -- driver entry points ----------------------------------------------------------
    def handle(self, event) -> list:
        """Apply one event; the actions it causes (and what ``pump`` sends)."""
        self._handlers[type(event)](event)
        return self.pump(event.now_ms)

    def take_actions(self) -> list:
        out, self._out = self._out, []
        return out

    def write(self, payload: bytes, token, seq: int | None, now_ms: int) -> None:
        """A write enters (``token``: what its ``Settle``/``Fail`` names)."""
        if self.error is not None or self.closed:
            error = self.error or ClientClosedError(f"producer of log {self.name!r} is closed")
            self._out.append(Fail([(None, token)], error, len(payload)))
            return
        self.waiting.append(_Write(seq, payload, token, now_ms))  # numbered by pump

    def close(self) -> None:
        """No write enters from now on; the pending ones go on."""
        self.closed = True

    def done(self) -> bool:
        """Nothing left to do: closed with nothing pending, or failed."""
        return self.error is not None or \
            (self.closed and not self.pending and not self.waiting)

    def has_room(self, size: int) -> bool:
        """Whether a write of ``size`` bytes may enter the window now."""
        return not self.pending or (
            len(self.pending) < limits.LOG_PRODUCER_INFLIGHT_RECORDS_MAX and
            self.inflight_bytes + size <= limits.LOG_PRODUCER_INFLIGHT_BYTES_MAX)

    def pump(self, now_ms: int) -> list:
        """What may leave now (a lookup, a hello, write requests); the actions."""
        if self.error is None:
            if self.waiting and self.next_seq is not None:
                self._admit()
            if self.endpoint is None:
                self._want_owner(now_ms)
            elif self.resend_at_ms is not None:
                if now_ms >= self.resend_at_ms:
                    self.resend_at_ms = None
                    self._restart(now_ms)
                    self._send(now_ms)
            else:
                self._send(now_ms)
        return self.take_actions()

    # -- the window and numbering --------------------------------------------------------
    def _admit(self) -> None:
        """Writes waiting enter the window while it has room: numbered, unsent."""
        waiting, pending, unsent = self.waiting, self.pending, self.unsent
        records_max = limits.LOG_PRODUCER_INFLIGHT_RECORDS_MAX
        bytes_max = limits.LOG_PRODUCER_INFLIGHT_BYTES_MAX
        count, nbytes, seq = len(pending), self.inflight_bytes, self.next_seq
        while waiting:
            write = waiting[0]
            size = len(write.payload)
            if count and (count >= records_max or nbytes + size > bytes_max):
                break  # the window is full: it waits for room
            waiting.popleft()
            if write.seq is not None:
                if write.seq < seq and self.numbered:
                    self._out.append(Fail([(None, write.token)], ValueError(
                        f"seq {write.seq} does not increase: the previous write was "
                        f"{seq - 1}"), size))
                    continue
                seq = write.seq
            write.seq = seq
            pending[seq] = write
            unsent.append(write)
            self.numbered = True
            seq += 1
            count += 1
            nbytes += size
        self.next_seq, self.inflight_bytes = seq, nbytes
        invariant(count == len(pending) and count <= records_max and
                  (count <= 1 or nbytes <= bytes_max),
                  "producer of %s: %d records, %d bytes in flight (over the window)",
                  self.name, count, nbytes)

    # -- sending -------------------------------------------------------------------------
    def _want_owner(self, now_ms: int) -> None:
        if not self.finding and now_ms >= self.connect_at_ms:
            self.finding = True
            self._out.append(FindOwner())

    def _send(self, now_ms: int) -> None:
        if self.next_seq is None:
            if self.hello_gen != self.gen:
                self.hello_gen = self.gen
                self._count_request(now_ms)
                self._out.append(Send(self.endpoint, encode_header(
                    {"op": "hello", "log": self.name, "pid": self._pid_hex, "gen": self.gen}),
                    0))
            return
        unsent = self.unsent
        while unsent and self.awaiting < limits.LOG_PRODUCER_REQUESTS_INFLIGHT_MAX:
            batch, size = [], 0
            first = unsent[0].seq
            while unsent and len(batch) < limits.LOG_PRODUCER_BATCH_RECORDS_MAX:
                n = len(unsent[0].payload)
                if batch and size + n > limits.LOG_PRODUCER_BATCH_BYTES_MAX:
                    break
                batch.append(unsent.popleft().payload)
                size += n
            oldest = next(iter(self.pending))
            self._count_request(now_ms)
            self._awaited.add(first)
            self._out.append(Send(self.endpoint, encode_write(
                self._name_bytes, self.pid, self.gen, first, oldest, batch), size))

    def _count_request(self, now_ms: int) -> None:
        if not self.awaiting:  # the request timeout counts from here, not from
            self.last_reply_ms = now_ms  # the last reply before an idle spell
        self.awaiting += 1
        self.stats["requests"] += 1

    def _restart(self, now_ms: int) -> None:
        """A new generation: everything unacknowledged is sent again."""
        self.gen += 1
        self.unsent = deque(self.pending.values())
        self._forget_requests()
        self.last_reply_ms = now_ms

    def _forget_requests(self) -> None:
        """No request of this generation is awaited any more (their late
        replies still settle what they name, but free no room)."""
        self.awaiting = 0
        self._awaited.clear()

    # -- events --------------------------------------------------------------------------
    def _on_owner_found(self, event: OwnerFound) -> None:
        self.finding = False
        if self.error is not None:
            return
        if event.endpoint is None:
            self.connect_at_ms = event.now_ms + self._next_backoff()
            self._out.append(WakeAt(self.connect_at_ms))
            return
        self.endpoint = event.endpoint
        self._restart(event.now_ms)

    def _on_tick(self, event: Tick) -> None:
        now_ms = event.now_ms
        if self.error is not None:
            return
        oldest = next(iter(self.pending.values()), None) or \
            (self.waiting[0] if self.waiting else None)
        if oldest is not None and now_ms - oldest.since_ms > limits.LOG_PRODUCER_DEADLINE_MS:
            why = f"the last refusal: {self.last_refusal}" if self.last_refusal \
                else "no log server took it"
            self._fail(LogServiceUnavailableError(
                f"log {self.name!r}: write {oldest.seq or 'not numbered'} not stored within "
                f"{limits.LOG_PRODUCER_DEADLINE_MS} ms ({why})"))
            return
        if self.endpoint is not None and self.resend_at_ms is None and \
                (self.awaiting or self.pending) and \
                now_ms - self.last_reply_ms > limits.LOG_PRODUCER_REQUEST_TIMEOUT_MS:
            self.stats["timeouts"] += 1
            self.endpoint = None  # find the owner again (pump asks)
            self._forget_requests()

    def _on_refused(self, event: Refused) -> None:
        if self.error is None:
            self._fail(event.error)

    def _on_server_gone(self, event: ServerGone) -> None:
        """The owner's process is gone: find the owner again now (every
        unacknowledged write is resent there) rather than after the request
        timeout."""
        if self.error is not None or self.endpoint != event.endpoint:
            return
        self.stats["servers_gone"] += 1
        self.endpoint = None  # pump asks for the owner
        self._forget_requests()

    def _on_reply(self, event: Reply) -> None:
        frame = event.frame
        try:
            if frame[:1] == b"\x02":  # WRITTEN_KIND
                gen, first, runs = decode_written(frame)
                doc = None
            else:
                doc = decode_header(frame)
                gen = doc.get("gen")
        except (BKError, IndexError, TypeError):
            self.stats["stale_replies"] += 1
            return
        if gen == self.gen:
            self.last_reply_ms = event.now_ms
        if doc is None:
            if gen == self.gen and first in self._awaited:  # not for a duplicated reply
                self._awaited.discard(first)
                self.awaiting -= 1
            self._settle(first, runs)
        elif gen != self.gen or self.error is not None:
            self.stats["stale_replies"] += 1
        elif doc["op"] == "hello" and self.next_seq is None:
            self.awaiting = max(0, self.awaiting - 1)
            next_seq = doc.get("next_seq")
            self.next_seq = next_seq if isinstance(next_seq, int) and next_seq > 0 else 1
            self._admit()
        elif doc["op"] == "error":
            self.awaiting = max(0, self.awaiting - 1)
            self._awaited.discard(doc.get("seq"))
            self._on_error(doc, event.now_ms)
        else:
            self.stats["stale_replies"] += 1

    def _settle(self, first: int, runs) -> None:
        """The writes from ``first`` on are stored at ``runs`` ((seg, entry,
        first slot, n); seg ``FORGOTTEN``: the position is forgotten)."""
        pending, done, freed = self.pending, [], 0
        last_seq, last_dlsn = self._settled
        for seg, entry, slot, n in runs:
            for k in range(n):
                write = pending.pop(first, None)
                if write is not None:
                    freed += len(write.payload)
                    dlsn = None
                    if seg != FORGOTTEN:
                        dlsn = dlsn_of(seg, entry, slot + k)
                        if first > last_seq:  # (a lower one, late: its own position)
                            invariant(last_dlsn is None or dlsn > last_dlsn,
                                      "producer of %s: write %d settled at %s, not after %s",
                                      self.name, first, dlsn, last_dlsn)
                            last_seq, last_dlsn = first, dlsn
                    done.append((dlsn, write.token))
                first += 1
        if not done:
            self.stats["stale_replies"] += 1
            return
        self._settled = (last_seq, last_dlsn)
        self.inflight_bytes -= freed
        self.backoff_ms = BACKOFF_MIN_MS
        self._out.append(Settle(done, freed))
        if self.waiting:
            self._admit()

    def _on_error(self, doc: dict, now_ms: int) -> None:
        code = doc.get("code")
        oldest = next(iter(self.pending), 0)
        if code == NOT_OWNER:
            self.stats["redirects"] += 1
            endpoint = doc.get("endpoint")
            self.endpoint = endpoint if isinstance(endpoint, str) else None
            if self.endpoint is not None:
                self._restart(now_ms)
        elif code == "full":
            self._fail(TooManyProducersError(doc.get("message", "too many producers")))
        elif code == BAD:
            self._fail(BadRequestError(doc.get("message", "bad request")))
        else:  # retry, held, gap: resend from the oldest after a pause
            self.stats["retries"] += 1
            message = doc.get("message")
            self.last_refusal = message if isinstance(message, str) else str(code)
            if code == "gap" and doc.get("expected", 0) < oldest:  # a stale owner's view
                self.last_refusal = (f"the owner expects sequence number {doc.get('expected')}"
                                     ", below this producer's oldest unacknowledged write")
            pause = self._next_backoff() * (HELD_BACKOFF_FACTOR if code == HELD else 1)
            self.resend_at_ms = now_ms + pause
            self._out.append(WakeAt(self.resend_at_ms))  # nothing leaves until then

    def _next_backoff(self) -> int:
        backoff, self.backoff_ms = self.backoff_ms, min(self.backoff_ms * 2, BACKOFF_MAX_MS)
        return backoff

    def _fail(self, error: BaseException) -> None:
        """Sticky: every pending and waiting write fails, and every later one."""
        self.error = error
        failed = [(None, w.token) for w in (*self.pending.values(), *self.waiting)]
        freed = self.inflight_bytes + sum(len(w.payload) for w in self.waiting)
        self.pending.clear()
        self.unsent.clear()
        self.waiting.clear()
        self.inflight_bytes = 0
        if failed:
            self._out.append(Fail(failed, error, freed))


__all__ = ["ProducerCore", "Send", "FindOwner", "WakeAt", "Settle", "Fail", "Reply",
           "OwnerFound", "Tick", "BACKOFF_MIN_MS", "BACKOFF_MAX_MS", "WRITTEN_KIND"]
