"""A log server: a ZeroMQ endpoint where producers write records to the
logs this server owns (seed 003's write proxy).  It serves on
``ipc.server.FrameServer`` (the bookies' loop, with its guards: bounded
drains and queues, malformed messages answered; ``wire.WRITE_WIRE`` its
codec): on tcp beside tcp bookies (``[log] port_base``), and there with
``[security] curve`` as a CURVE server with the bookies' keys, refusing
clients whose keys are not authorized as the bookies do; its public key
is registered (``curve_public_key``) for producers and readers to verify.

    python -m appliance.logservice --config configs/local.toml --id logserver-1

Guarantees:

* It registers in the metadata store (``appliance.meta.logservice``: an
  ephemeral node, gone within the session timeout once the process dies).
* It owns a log only while it holds the log's lease and writes it only
  through a log writer that fenced the previous owner; the log it should
  own is decided by rendezvous hashing over the live servers
  (``appliance.protocol.log_service.owner_of``).  A request for a log owned
  elsewhere is answered ``not_owner`` with the owner's endpoint (the
  metadata reads that decide it run off the loop: ``routing.py``); a log whose
  hashing now names another live server is handed over (flushed, closed,
  lease released) and its producers are redirected.
* A log held by an exclusive writer (``Log.writer()``: its segment in
  progress and the log's owner not a log server) is not taken: requests are
  answered ``held`` until that writer closes.
* A log is handed over (``Close``: what it holds is sent, its entries
  acknowledged, its writer closed, its lease released) when the hashing
  names another live server or its lease's session ended; the server's
  stop hands every log over the same way (``LOG_SERVICE_HAND_OVER_MS`` at
  most).

Threads and what each owns (no other thread touches these):

* the loop thread (``run``: ``FrameServer.serve``, which calls ``handle``
  for each request and ``after_step`` after each turn): the socket, ``owned`` (every log's
  ``OwnedLog`` and its core: ``appliance.logservice.owned``), the reply
  queue, the timers (``_timers``: when each log's core wants a ``Tick``),
  ``stats`` and the retired logs' counters, ``_lease_sessions``, the
  ``Router`` (requests parked while a log's owner is looked up).  It
  serves requests, drives every owned log's core (group commit, control
  entries, hand-over) and carries out its actions: no thread per log.
* every other thread (the ledger client's completions, the pool of
  ``LOG_SERVICE_OPENS_MAX`` threads that open and close logs, the routing
  worker that reads the metadata for logs not owned here, the metrics
  HTTP thread) only hands the loop a function to run (``post``: a
  lock-guarded list, and a wake of the loop when it was empty) and, for
  the metrics, waits on a future (``call``).
* the read cache's thread (``readcache.py``) learns which writers this
  server's open logs have through a queue the loop thread feeds
  (``ReadService.publish``), never from ``owned``.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
import math
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

from appliance.errors import BadRequestError, BKError
from appliance.logservice.metrics import start_metrics
from appliance.logservice.owned import OwnedLog, now_ms, owner_config
from appliance.logservice.readcache import start_read_service
from appliance.logservice.routing import SERVICE_OWNER_PREFIX, Router
from appliance.logservice.wire import WRITE_WIRE, MuxRequest
from appliance.meta.logservice import LogServiceRegistry
from appliance.protocol import limits
from appliance.protocol.log_owner import OwnerState
from appliance.protocol.log_owner_events import Close, Hello, Tick, Write
from appliance.protocol.log_service import (
    BAD,
    RETRY,
    check_write,
    decode_mux,
    decode_request,
    encode_header,
    join_mux_reply,
    mux_groups,
    owner_of,
    route_answer,
    section_route,
)
from ipc.frames import WireLimits
from ipc.server import FrameServer

log = logging.getLogger("appliance.logservice")

class LogServer:
    def __init__(self, client, server_id: str, endpoint: str, *, stale_wait_ms: int,
                 metrics_address: str = "", curve=None):
        self.client = client
        self.id = server_id
        self.endpoint = endpoint
        self.registry = LogServiceRegistry(client.logs.store)
        self._stale_wait_ms = stale_wait_ms
        self._config = owner_config(client)  # every owned log's core's limits
        self.owned: dict[str, OwnedLog] = {}
        self._lease_sessions: dict[str, str] = {}  # log -> the session its lease is on
        self._retired: collections.Counter = collections.Counter()  # closed logs' counters
        # when each owned log's core wants a Tick: a heap of (due ms, n, log), the
        # latest due of each log in _timer_due (older heap rows are skipped)
        self._timers: list = []
        self._timer_due: dict[OwnedLog, float] = {}
        self._order = itertools.count()
        # functions other threads hand the loop (post): taken under the lock, and
        # the loop woken by the post that found the list empty
        self._inbox: list = []
        self._inbox_lock = threading.Lock()
        # opens and closes of owned logs, a few at a time (not a thread each)
        self.pool = ThreadPoolExecutor(limits.LOG_SERVICE_OPENS_MAX, "log-open")
        self._replies: collections.deque = collections.deque()
        self._stopping = False  # set by stop() (any thread, a signal): the loop hands over
        self._hand_over_until: float | None = None  # monotonic, once the hand-over began
        self._next_check = 0.0  # monotonic: the live servers read again
        self._wake_timer = None  # the FrameServer timer for the cores' next Tick
        self._wake_timer_ms = math.inf
        self._router = Router(self)  # requests for logs not owned here (routing.py)
        keys, authorized = curve if curve is not None else (None, None)
        self._frames = FrameServer(endpoint, self, codec=WRITE_WIRE, limits=_WIRE_LIMITS,
                                   drain_messages_max=limits.LOG_PRODUCER_BATCH_RECORDS_MAX,
                                   poll_ms_max=limits.LOG_SERVICE_CHECK_INTERVAL_MS,
                                   curve_keys=keys, authorized_keys=authorized)
        self.endpoint = self._frames.endpoint  # a tcp port 0 resolved
        self._curve = curve
        self.stats = {"requests": 0, "redirects": 0, "mux_requests": 0, "mux_sections": 0,
                      "mux_replies": 0}
        self._metrics_address = metrics_address
        self.metrics_url: str | None = None
        self._httpd = self._latency = None
        self.observe = None  # a write request's latency (s), once metrics are on
        self.reads = None  # the read cache for tailing readers (readcache.py)

    # -- life -------------------------------------------------------------------------
    def run(self) -> None:
        if self._metrics_address:
            self._httpd, self.metrics_url, self._latency = start_metrics(
                self._metrics_address, self)
            self.observe = self._latency.observe
        self.reads = start_read_service(self, self._curve)
        self.registry.register(self.id, self.endpoint, {
            "pid": os.getpid(), "metrics_url": self.metrics_url,
            "read_endpoint": self.reads.endpoint,
            "curve_public_key": self._frames.curve_public_key}, self._stale_wait_ms)
        log.info("log server %s serving at %s%s", self.id, self.endpoint,
                 " (CURVE)" if self._frames.curve_public_key else "")
        try:
            self._frames.serve()  # until the hand-over after stop() is over
        finally:
            self._shutdown()

    def stop(self) -> None:
        """Signal- and thread-safe: the loop hands every log over, then ends."""
        self._stopping = True
        self.wake()

    def wake(self) -> None:
        """Any thread: the loop takes a turn now."""
        self._frames.wake()

    def after_step(self) -> None:
        """The loop thread, at the end of every turn of ``FrameServer``'s
        loop (after this turn's requests): what other threads posted, the
        cores' due Ticks, the replies, the live servers every check
        interval, the hand-over once stopping; then the loop's next wake is
        aimed at the cores' next Tick."""
        self._run_posted()
        self._fire_timers()
        if self._stopping:
            self._hand_over_step()
        self._send_replies()
        if not self._stopping and time.monotonic() >= self._next_check:
            self._router.refresh_servers()  # then checked(servers)
            self._next_check = time.monotonic() + limits.LOG_SERVICE_CHECK_INTERVAL_MS / 1000
        self._aim_wake_timer()

    def _aim_wake_timer(self) -> None:
        """A turn of the loop when the cores' earliest Tick is due."""
        due = self._timers[0][0] if self._timers else math.inf
        if due == self._wake_timer_ms:
            return
        if self._wake_timer is not None:
            self._wake_timer.cancel()
            self._wake_timer = None
        self._wake_timer_ms = due
        if due != math.inf:
            self._wake_timer = self._frames.call_later_ms(max(0.0, due - now_ms()), _no_op)

    def _hand_over_step(self) -> None:
        """The loop thread, stopping: the first time, no new log is taken
        (the lookups under way end, their decisions run) and every owned
        log is handed over (``Close``); the loop ends once each let its
        lease go, or after ``LOG_SERVICE_HAND_OVER_MS``."""
        if self._hand_over_until is None:
            self._hand_over_until = time.monotonic() + limits.LOG_SERVICE_HAND_OVER_MS / 1000
            if self.reads is not None:
                self.reads.stop()
            self._router.shutdown()
            self._run_posted()  # the lookups' last decisions (a lease taken: handed over)
            for owned in list(self.owned.values()):
                try:
                    owned.step(Close(now_ms(), "the server stops"))
                except Exception:  # noqa: BLE001 - stopping: the others are still handed over
                    log.exception("log %s: hand-over failed", owned.name)
        if not self.owned or time.monotonic() >= self._hand_over_until:
            self._frames.stop()

    def _shutdown(self) -> None:
        """After the loop: the leases of logs not handed over in time are
        released, the registration removed, the sockets closed."""
        if self.reads is not None:
            self.reads.stop()
        self._router.shutdown()
        self.pool.shutdown(wait=True, cancel_futures=True)  # opens not begun never begin
        for name in list(self.owned):  # not handed over in time: the lease at least
            try:
                self.registry.release(name)
            except BKError as exc:
                log.warning("log %s: could not release its lease: %s", name, exc)
        self.registry.unregister(self.id)
        if self._httpd is not None:
            self._httpd.shutdown()
        self._frames.close()

    # -- the loop's inbox and timers -----------------------------------------------------
    def post(self, fn) -> None:
        """Any thread: run ``fn()`` on the loop thread, soon."""
        with self._inbox_lock:
            first = not self._inbox
            self._inbox.append(fn)
        if first:
            self._frames.wake()

    def call(self, fn) -> Future:
        """Any thread but the loop's: ``fn()`` run on the loop thread; its
        result in the future."""
        fut: Future = Future()

        def run() -> None:
            try:
                fut.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                fut.set_exception(exc)
        self.post(run)
        return fut

    def _run_posted(self) -> None:
        with self._inbox_lock:
            posted, self._inbox = self._inbox, []
        for fn in posted:
            fn()

    def schedule(self, owned: OwnedLog, due_ms: float) -> None:
        """The loop thread: ``owned``'s core wants a Tick at ``due_ms``."""
        if due_ms == math.inf:
            self._timer_due.pop(owned, None)
        elif self._timer_due.get(owned) != due_ms:
            self._timer_due[owned] = due_ms
            heapq.heappush(self._timers, (due_ms, next(self._order), owned))

    def _fire_timers(self) -> None:
        timers, due_of = self._timers, self._timer_due
        now = now_ms()
        while timers and timers[0][0] <= now:
            due, _, owned = heapq.heappop(timers)
            if due_of.get(owned) == due:  # else a row of an older due
                del due_of[owned]
                owned.step(Tick(now))

    def changed(self, owned: OwnedLog) -> None:
        """The loop thread: ``owned``'s state changed.  The read cache learns
        its writer (or that it has none now); a closed log is forgotten."""
        if self.reads is not None:
            self.reads.publish(owned.name, owned.writer if owned.state is OwnerState.OPEN
                               else None)
        if owned.state is OwnerState.CLOSED and self.owned.get(owned.name) is owned:
            del self.owned[owned.name]
            self._lease_sessions.pop(owned.name, None)
            self._timer_due.pop(owned, None)
            self._retired.update(owned.core.stats)

    # -- requests ----------------------------------------------------------------------------
    def handle(self, identity: bytes, request) -> None:
        """``FrameServer``'s call for each request (``WRITE_WIRE`` decoded
        it): a multi-log one is served section by section; every answer
        leaves at the end of the turn (``after_step``), or once its records
        are stored.  A ``BKError`` raised here is answered "bad" by the
        codec, echoing the request's route."""
        if type(request) is MuxRequest:
            self._serve_mux(identity, request)
            return None
        doc, payloads = request
        _check_size(payloads)
        answer = self._handle(identity, doc, payloads)
        if answer is not None:
            self.queue_reply(identity, {**_echo(doc), **answer})
        return None

    def _serve_mux(self, identity: bytes, frame: bytes) -> None:
        """A multi-log request: each section is served as if it came alone
        (``_handle``); its answer, now or once its records are stored, is
        routed back to its log and producer (``queue_reply`` of a
        ``MuxIdentity``).  A malformed message is answered "bad" as a whole,
        a malformed section in its own answer."""
        try:
            sections = decode_mux(frame, limits.LOG_SERVICE_MUX_SECTIONS_MAX,
                                  limits.LOG_SERVICE_MUX_BYTES_MAX)
        except BKError as exc:
            self.queue_reply(identity, {"op": "error", "code": BAD, "message": str(exc)})
            return
        self.stats["mux_requests"] += 1
        self.stats["mux_sections"] += len(sections)
        mux = MuxIdentity(identity)
        for section in sections:
            try:
                doc, payloads = decode_request([section])
                _check_size(payloads)
                answer = self._handle(mux, doc, payloads)
            except BKError as exc:
                route = section_route(section)
                if route is not None:
                    self._replies.append((mux, route_answer(*route, encode_header(
                        {"op": "error", "code": BAD, "message": str(exc)}))))
                continue
            if answer is not None:
                self.queue_reply(mux, {**_echo(doc), **answer})

    def queue_reply(self, identity: bytes, doc: dict) -> None:
        """The loop thread: a reply to send at the end of this turn."""
        frame = encode_header(doc)
        if type(identity) is MuxIdentity:  # a section of a multi-log request
            try:
                frame = route_answer(doc["log"].encode(), bytes.fromhex(doc["pid"]), frame)
            except (KeyError, ValueError, AttributeError):
                return  # no log or pid to route it by (checked when the request came)
        self._replies.append((identity, frame))

    def _send_replies(self) -> None:
        replies, send = self._replies, self._frames.send_reply
        muxed = None
        while replies:
            reply = replies.popleft()
            if type(reply[0]) is MuxIdentity:  # coalesced per connection below
                if muxed is None:
                    muxed = {}
                muxed.setdefault(reply[0], []).append(reply[1])
                continue
            send(reply[0], [reply[1]])  # dropped if the producer is gone or slow: it resends
        if muxed:
            self._send_muxed(muxed)

    def _send_muxed(self, muxed: dict) -> None:
        """The answers to multi-log requests ready this turn: one MUX_REPLY
        per connection (more if they exceed its bounds)."""
        sections_max = limits.LOG_SERVICE_MUX_SECTIONS_MAX
        bytes_max = limits.LOG_SERVICE_MUX_BYTES_MAX - 64
        for mux, routed in muxed.items():
            identity = bytes(mux)
            for group in mux_groups(routed, sections_max, bytes_max):
                self._frames.send_reply(identity, [join_mux_reply(group)])  # as a single one
                self.stats["mux_replies"] += 1

    def _handle(self, identity: bytes, doc: dict, payloads: list) -> dict | None:
        """One request (or section): an answer now, or None (its log's core
        answers, now or once its records are stored: ``OwnedLog``)."""
        op = doc["op"]
        self.stats["requests"] += 1
        if op == "ping":
            return {"op": "pong", "id": self.id, "pid": os.getpid(),
                    "metrics_url": self.metrics_url,
                    "read_endpoint": self.reads.endpoint if self.reads else None,
                    "logs": sorted(n for n, o in self.owned.items()
                                   if o.state is OwnerState.OPEN)}
        if op not in ("write", "hello"):
            return {"op": "error", "code": BAD, "message": f"unknown op {op!r}"}
        name, producer_id, seq, oldest = check_write(doc, len(payloads))
        owned = self.owned.get(name)
        if owned is None and self._stopping:
            return {"op": "error", "code": RETRY, "message": f"log server {self.id} stops"}
        if owned is None:
            return self._router.route(identity, _echo(doc), name)
        token = (identity, _echo(doc), time.perf_counter())
        if op == "hello":
            owned.step(Hello(token, producer_id, now_ms()))
        else:
            owned.step(Write(token, producer_id, seq, oldest, payloads, now_ms()))
        return None

    def own(self, name: str, session) -> dict:
        """The loop thread: this server took ``name``'s lease (on ``session``,
        ``routing.decide``): open the log; the answer to the requests that
        waited."""
        self._lease_sessions[name] = session
        self.owned[name] = OwnedLog(self, self.client, name, f"{SERVICE_OWNER_PREFIX}{self.id}:"
                                    f"{os.getpid()}", self._config)
        return {"op": "error", "code": RETRY, "message": f"log {name} is opening"}

    def totals(self) -> dict:
        """The loop thread: the server's counters with every owned log's,
        open and closed (``metrics_snapshot`` from another thread)."""
        counts = collections.Counter(self._retired)
        for owned in self.owned.values():
            counts.update(owned.core.stats)
        return {**self.stats, **{k: counts[k] for k in _LOG_COUNTERS}}

    def metrics_snapshot(self) -> dict | None:
        """Any thread but the loop's (the metrics' HTTP thread): the counters,
        the owned logs and producers, and the latency histogram, copied on
        the loop thread; None if it does not answer in time (stopping)."""
        def snap() -> dict:
            open_logs = [o for o in self.owned.values() if o.state is OwnerState.OPEN]
            latency = self._latency
            return {"totals": self.totals(), "owned_logs": len(open_logs),
                    "producers": sum(len(o.core.table) for o in open_logs),
                    "latency": (list(latency.counts), latency.sum) if latency else None}
        try:
            return self.call(snap).result(timeout=limits.CLIENT_CALL_TIMEOUT_S_MAX)
        except TimeoutError:
            return None

    # -- owned logs ------------------------------------------------------------------------------
    def checked(self, servers: dict) -> None:
        """The loop thread, with the live servers just read (``Router``): hand
        over the open logs the hashing gives to another live server, and
        those whose lease this session lost (``Close``).  A failed log closes
        by itself (its core); a closed one is forgotten (``changed``)."""
        session = self.registry.store.session_id
        for name, owned in list(self.owned.items()):
            if owned.state is not OwnerState.OPEN:
                continue
            target = owner_of(name, servers)
            moving = target is not None and target != self.id
            # the lease is an ephemeral node of the session that took it: it is
            # ours while that session lives (no metadata read per log)
            lost = self._lease_sessions.get(name) != session
            if moving or lost:
                reason = f"handed over to {target}" if moving else "lease lost"
                log.info("log %s: %s", name, reason)
                owned.step(Close(now_ms(), reason))


class MuxIdentity(bytes):
    """A connection's identity, for the sections of its multi-log requests:
    their answers are routed (log, pid) and coalesced into MUX_REPLYs."""
    __slots__ = ()


_WIRE_LIMITS = WireLimits(batch_bytes_max=limits.LOG_SERVICE_MUX_BYTES_MAX)  # one frame's size


def _check_size(payloads: list) -> None:
    if len(payloads) > limits.LOG_PRODUCER_BATCH_RECORDS_MAX:
        raise BadRequestError(f"log service: more than {limits.LOG_PRODUCER_BATCH_RECORDS_MAX} "
                              "records in one request")


def _no_op() -> None:
    """A timer's callback that only makes the loop take a turn."""
_LOG_COUNTERS = ("records", "duplicates", "entries", "control_entries", "takeovers", "busy")



def _echo(doc: dict) -> dict:
    """The fields of a request its reply repeats (the producer matches on them)."""
    return {k: doc[k] for k in ("log", "pid", "seq", "gen") if k in doc}

