"""A log server: a ZeroMQ ROUTER endpoint where producers write records to
the logs this server owns (seed 003's write proxy).

    python -m appliance.logservice --config configs/local.toml --id logserver-1

Guarantees:

* It registers in the metadata store (``appliance.meta.logservice``: an
  ephemeral node, gone within the session timeout once the process dies).
* It owns a log only while it holds the log's lease and writes it only
  through a log writer that fenced the previous owner; the log it should
  own is decided by rendezvous hashing over the live servers
  (``appliance.protocol.log_service.owner_of``).  A request for a log owned
  elsewhere is answered ``not_owner`` with the owner's endpoint; a log whose
  hashing now names another live server is handed over (flushed, closed,
  lease released) and its producers are redirected.
* A log held by an exclusive writer (``Log.writer()``: its segment in
  progress and the log's owner not a log server) is not taken: requests are
  answered ``held`` until that writer closes.
* One thread serves the socket; replies computed on other threads (a write
  made durable) are queued and the socket thread is woken through a pipe.
  That thread also drives the time-based work of every owned log (group
  commit lingers, control entries): no thread per log.  Logs are opened
  and closed on a pool of ``LOG_SERVICE_OPENS_MAX`` threads, so a server
  asked for a thousand logs at once keeps answering (pings included).
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
from concurrent.futures import ThreadPoolExecutor

import zmq

from appliance.errors import BadRequestError, BKError, NoSuchLogError
from appliance.logservice.metrics import start_metrics
from appliance.logservice.owned import CLOSED, CLOSING, FAILED, OPEN, OPENING, OwnedLog
from appliance.logservice.readcache import start_read_service
from appliance.meta.logservice import LogServiceRegistry
from appliance.protocol import limits
from appliance.protocol.log_service import (
    BAD,
    HELD,
    MUX_KIND,
    NOT_OWNER,
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
from ipc.wake import WakePipe
from ipc.zmq_frames import recv_frames, send_frames

log = logging.getLogger("appliance.logservice")

SERVICE_OWNER_PREFIX = "logserver:"  # the log metadata's owner when a log server writes it


def held_by_writer(md) -> bool:
    """Is the log held by an exclusive writer (``Log.writer()``, not a log
    server)?  While it writes (its segment in progress), and also while it
    opens: it has taken the log (the epoch is its own) but not yet started
    its segment (the last segment is from an older epoch)."""
    if not md.owner or md.owner.startswith(SERVICE_OWNER_PREFIX):
        return False
    if md.in_progress is not None:
        return True
    return not md.segments or md.segments[-1].epoch != md.epoch


class LogServer:
    def __init__(self, client, server_id: str, endpoint: str, *, stale_wait_ms: int,
                 metrics_address: str = ""):
        self.client = client
        self.id = server_id
        self.endpoint = endpoint
        self.registry = LogServiceRegistry(client.logs.store)
        self._stale_wait_ms = stale_wait_ms
        self._linger_s = client.log_config.service_linger_us / 1e6
        self._entries_max = client.log_config.service_entries_inflight
        self._gather_s = client.log_config.service_gather_us / 1e6
        self.owned: dict[str, OwnedLog] = {}
        self._lease_sessions: dict[str, str] = {}  # log -> the session its lease is on
        # group commit (_send_buffered): the logs to try this turn (written to, or
        # their ack came: appended by the ledger's thread), and those whose
        # records wait out their linger (a heap of (due, n, log), latest due kept)
        self._buffered: set[OwnedLog] = set()
        self._ready: collections.deque[OwnedLog] = collections.deque()
        self._lingering: list = []
        self._linger_due: dict[OwnedLog, float] = {}
        # control entries of every owned log, driven by this loop (no thread per
        # log): logs whose entry was just acknowledged (appended by the ledger's
        # thread), and a heap of (due, n, log) with each log in it at most once
        self._control_s = client.log_config.service_control_interval_ms / 1000
        self._acked: collections.deque[OwnedLog] = collections.deque()
        self._controls: list = []
        self._controlled: set[OwnedLog] = set()
        self._control_order = itertools.count()
        # opens and closes of owned logs, a few at a time (not a thread each)
        self._pool = ThreadPoolExecutor(limits.LOG_SERVICE_OPENS_MAX, "log-open")
        self._replies: collections.deque = collections.deque()
        self._replies_lock = threading.Lock()
        # a wake is on its way for the queued replies and ready logs (_wake_once)
        self._replies_woken = False
        self._wakeup = WakePipe()
        self._stop = threading.Event()
        self._servers: dict[str, dict] = {}
        self._servers_at = 0.0
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.linger = 0
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
        self._sock.bind(endpoint)
        self.stats = {"requests": 0, "redirects": 0, "records": 0, "duplicates": 0,
                      "entries": 0, "takeovers": 0, "mux_requests": 0, "mux_sections": 0,
                      "mux_replies": 0, "busy": 0}
        self._metrics_address = metrics_address
        self.metrics_url: str | None = None
        self._httpd = self._latency = None
        self._loop_thread = None
        self.reads = None  # the read cache for tailing readers (readcache.py)

    # -- life -------------------------------------------------------------------------
    def run(self) -> None:
        self._loop_thread = threading.get_ident()
        if self._metrics_address:
            self._httpd, self.metrics_url, self._latency = start_metrics(
                self._metrics_address, self)
        self.reads = start_read_service(self)
        self.registry.register(self.id, self.endpoint, {"pid": os.getpid(),
                                                        "metrics_url": self.metrics_url,
                                                        "read_endpoint": self.reads.endpoint},
                               self._stale_wait_ms)
        log.info("log server %s serving at %s", self.id, self.endpoint)
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._wakeup.fd, zmq.POLLIN)
        next_check = 0.0
        due = math.inf  # the next group commit's linger deadline
        try:
            while not self._stop.is_set():
                events = dict(poller.poll(_timeout_ms(due)))
                if self._wakeup.fd in events:
                    self._wakeup.drain()
                if self._sock in events:
                    self._serve_some()
                self._send_replies()
                due = min(self._send_buffered(), self._drive_controls())
                if time.monotonic() >= next_check:
                    self._check_owned()
                    next_check = time.monotonic() + limits.LOG_SERVICE_CHECK_INTERVAL_MS / 1000
        finally:
            self._shutdown()

    def stop(self) -> None:
        """Signal- and thread-safe."""
        self._stop.set()
        self.wake()

    def wake(self) -> None:
        self._wakeup.wake()

    def _shutdown(self) -> None:
        if self.reads is not None:
            self.reads.stop()
        self._pool.shutdown(wait=True, cancel_futures=True)  # opens not begun never begin
        with ThreadPoolExecutor(limits.LOG_SERVICE_OPENS_MAX, "log-close") as closing:
            for owned in list(self.owned.values()):
                closing.submit(owned.close)
        for owned in list(self.owned.values()):
            self.registry.release(owned.name)
        self._send_replies()
        self.registry.unregister(self.id)
        if self._httpd is not None:
            self._httpd.shutdown()
        self._sock.close(linger=0)
        self._ctx.term()
        self._wakeup.close()

    # -- requests ----------------------------------------------------------------------------
    def _serve_some(self) -> None:
        """The requests waiting (the poll said the socket is readable: the
        first is read without asking, only this thread reads the socket)."""
        sock = self._sock
        for i in range(limits.LOG_PRODUCER_BATCH_RECORDS_MAX):
            if i and not sock.getsockopt(_EVENTS) & _POLLIN:  # no exception per empty read
                return
            try:
                frames = [f.bytes for f in recv_frames(sock)]
            except zmq.Again:
                return
            if len(frames) < 2:
                continue  # no header: nothing to answer
            identity = frames[0]
            if len(frames) == 2 and frames[1][:1] == _MUX_BYTE:
                self._serve_mux(identity, frames[1])
                continue
            try:
                doc, payloads = decode_request(frames[1:])
                if len(frames) > limits.LOG_SERVICE_REQUEST_FRAMES_MAX + 1 or \
                        len(payloads) > limits.LOG_PRODUCER_BATCH_RECORDS_MAX:
                    raise BadRequestError(f"log service: more than "
                                          f"{limits.LOG_PRODUCER_BATCH_RECORDS_MAX} records in "
                                          "one request")
                answer = self._handle(identity, doc, payloads)
            except BKError as exc:
                answer = {"op": "error", "code": BAD, "message": str(exc)}
                doc = {}
            if answer is not None:
                self.queue_reply(identity, {**_echo(doc), **answer})

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
                if len(payloads) > limits.LOG_PRODUCER_BATCH_RECORDS_MAX:
                    raise BadRequestError(f"log service: more than "
                                          f"{limits.LOG_PRODUCER_BATCH_RECORDS_MAX} records in "
                                          "one request")
                answer = self._handle(mux, doc, payloads)
            except BKError as exc:
                route = section_route(section)
                if route is not None:
                    self._replies.append((mux, route_answer(*route, encode_header(
                        {"op": "error", "code": BAD, "message": str(exc)}))))
                continue
            if answer is not None:
                self.queue_reply(mux, {**_echo(doc), **answer})

    def _send_buffered(self) -> float:
        """Group commit: the records this turn buffered leave as one entry per
        log, at once if the log has no entry in flight, else when its ack
        comes (``_log_ready``) or their linger ended; the next linger
        deadline (monotonic).  Only the logs written to, acknowledged or
        due are looked at: a turn costs nothing per idle or waiting log."""
        now = time.monotonic()
        try_now, lingering, linger_due = self._buffered, self._lingering, self._linger_due
        while self._ready:
            try_now.add(self._ready.popleft())
        while lingering and lingering[0][0] <= now:
            due, _, owned = heapq.heappop(lingering)
            if linger_due.get(owned) == due:  # else an older deadline of the log
                del linger_due[owned]
                try_now.add(owned)
        for owned in try_now:
            again = owned.send_buffered(now, self._linger_s, self._entries_max)
            if again is not None and again != math.inf and linger_due.get(owned) != again:
                linger_due[owned] = again
                heapq.heappush(lingering, (again, next(self._control_order), owned))
        try_now.clear()
        return lingering[0][0] if lingering else math.inf

    def _log_ready(self, owned: OwnedLog) -> None:
        """Any thread: ``owned``'s held records may leave now (the ack they
        waited for came)."""
        self._ready.append(owned)
        self._wake_once()

    def _log_acked(self, owned: OwnedLog) -> None:
        """The ledger's thread: an entry of ``owned`` with records was
        acknowledged (its replies, queued next, wake the loop)."""
        self._acked.append(owned)

    def _drive_controls(self) -> float:
        """Every owned log's control entry (``OwnedLog.control``) once it has
        been idle ``service_control_interval_ms`` after an acknowledged entry; the
        next due time (monotonic)."""
        now = time.monotonic()
        heap, controlled = self._controls, self._controlled
        while self._acked:
            owned = self._acked.popleft()
            if owned not in controlled:
                controlled.add(owned)
                heapq.heappush(heap, (now + self._control_s, next(self._control_order), owned))
        while heap and heap[0][0] <= now:
            owned = heapq.heappop(heap)[2]
            again = owned.control(now, self._control_s)
            if again is None:
                controlled.discard(owned)
            else:
                heapq.heappush(heap, (again, next(self._control_order), owned))
        return heap[0][0] if heap else math.inf

    def queue_reply(self, identity: bytes, doc: dict) -> None:
        frame = encode_header(doc)
        if type(identity) is MuxIdentity:  # a section of a multi-log request
            try:
                frame = route_answer(doc["log"].encode(), bytes.fromhex(doc["pid"]), frame)
            except (KeyError, ValueError, AttributeError):
                return  # no log or pid to route it by (checked when the request came)
        if threading.get_ident() == self._loop_thread:
            self._replies.append((identity, frame))
            return
        self._replies.append((identity, frame))
        self._wake_once()

    def _wake_once(self) -> None:
        """Any thread, after queueing a reply or a ready log: wake the loop
        unless a wake is on its way (one pipe write and one loop turn for
        the replies of one ack and its log's held records, not one each)."""
        with self._replies_lock:
            woken, self._replies_woken = self._replies_woken, True
        if not woken:
            self.wake()

    def _send_replies(self) -> None:
        if self._replies_woken:  # read unlocked: a wake set after this read is still sent
            with self._replies_lock:  # a reply queued from here on wakes the loop again
                self._replies_woken = False
        replies, sock = self._replies, self._sock
        muxed = None
        while replies:
            reply = replies.popleft()
            if type(reply[0]) is MuxIdentity:  # coalesced per connection below
                if muxed is None:
                    muxed = {}
                muxed.setdefault(reply[0], []).append(reply[1])
                continue
            try:  # int flags: pyzmq's send_multipart ORs enums per part (~1 us a reply)
                send_frames(sock, reply, copy=True)
            except zmq.ZMQError:
                pass  # the producer is gone or slow: it resends after its timeout
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
                try:
                    send_frames(self._sock, (identity, join_mux_reply(group)), copy=True)
                except zmq.ZMQError:
                    pass  # as for a single reply: the producers resend after their timeout
                self.stats["mux_replies"] += 1

    def _handle(self, identity: bytes, doc: dict, payloads: list) -> dict | None:
        op = doc["op"]
        self.stats["requests"] += 1
        if op == "ping":
            return {"op": "pong", "id": self.id, "pid": os.getpid(),
                    "metrics_url": self.metrics_url,
                    "read_endpoint": self.reads.endpoint if self.reads else None,
                    "logs": sorted(n for n, o in self.owned.items() if o.state == OPEN)}
        if op not in ("write", "hello"):
            return {"op": "error", "code": BAD, "message": f"unknown op {op!r}"}
        name, producer_id, seq, oldest = check_write(doc, len(payloads))
        owned = self.owned.get(name)
        if owned is None:
            return self._route(name)
        if owned.state != OPEN:
            return {"op": "error", "code": RETRY, "message": f"log {name} is {owned.state}"}
        if op == "hello":
            return {"op": "hello", "next_seq": owned.hello(producer_id)}
        answer = owned.write(identity, _echo(doc), producer_id, seq, oldest, payloads)
        if answer is None:
            self._buffered.add(owned)
        return answer

    def _route(self, name: str) -> dict:
        """A request for a log this server does not own: redirect, wait, or
        take the log."""
        lease = self.registry.owner(name)
        if lease is not None and lease.get("server") != self.id:
            self.stats["redirects"] += 1
            return {"op": "error", "code": NOT_OWNER, "owner": lease.get("server"),
                    "endpoint": lease["endpoint"], "message": f"log {name} is owned elsewhere"}
        if lease is not None:  # our id, an earlier process's session: wait for its expiry
            return {"op": "error", "code": RETRY, "message": f"log {name}: stale lease"}
        target = owner_of(name, self.live_servers(fresh=True))  # never to a gone server
        if target is not None and target != self.id:
            self.stats["redirects"] += 1
            return {"op": "error", "code": NOT_OWNER, "owner": target,
                    "endpoint": self._servers[target]["endpoint"],
                    "message": f"log {name} belongs to {target}"}
        try:
            md = self.client.logs.read_log(name)[0]
            if held_by_writer(md):
                return {"op": "error", "code": HELD,
                        "message": f"log {name} is held by exclusive writer {md.owner}: "
                                   "producers wait until it closes (if it died, open "
                                   "log.writer() and close it: that recovers its segment)"}
        except NoSuchLogError:
            pass
        session = self.registry.store.session_id
        if not self.registry.acquire(name, self.id, self.endpoint):
            return {"op": "error", "code": RETRY, "message": f"log {name}: lease taken"}
        self._lease_sessions[name] = session
        self.owned[name] = OwnedLog(self.client, name, f"{SERVICE_OWNER_PREFIX}{self.id}:"
                                    f"{os.getpid()}", self.queue_reply, self.wake,
                                    self.stats, self._latency.observe if self._latency else None,
                                    acked=self._log_acked if self._control_s else None,
                                    opener=self._pool, ready=self._log_ready,
                                    gather_s=self._gather_s)
        return {"op": "error", "code": RETRY, "message": f"log {name} is opening"}

    def totals(self) -> dict:
        """Counters for the metrics: the entries of open writers added in."""
        open_entries = sum(o.writer.stats["entries"] for o in list(self.owned.values())
                           if o.writer is not None and o.state == OPEN)
        return {**self.stats, "entries": self.stats["entries"] + open_entries}

    def live_servers(self, fresh: bool = False) -> dict[str, dict]:
        """The registered servers (read again at most every check interval,
        or now if ``fresh``)."""
        now = time.monotonic()
        if fresh or now - self._servers_at > limits.LOG_SERVICE_CHECK_INTERVAL_MS / 1000:
            self._servers = self.registry.servers()
            self._servers_at = now
        return self._servers

    # -- owned logs ------------------------------------------------------------------------------
    def _check_owned(self) -> None:
        """Drop failed logs, hand over logs the hashing gives to another
        live server, and drop logs whose lease this session lost."""
        servers = self.live_servers()
        for name, owned in list(self.owned.items()):
            if owned.state in (OPENING, CLOSING):
                continue
            if owned.state == CLOSED:
                del self.owned[name]
                self._lease_sessions.pop(name, None)
                continue
            target = owner_of(name, servers)
            moving = owned.state == OPEN and target is not None and target != self.id
            # the lease is an ephemeral node of the session that took it: it is
            # ours while that session lives (no metadata read per log)
            lost = owned.state == OPEN and \
                self._lease_sessions.get(name) != self.registry.store.session_id
            if owned.state == FAILED or moving or lost:
                log.info("log %s: %s", name, "failed" if owned.state == FAILED
                         else f"handed over to {target}" if moving else "lease lost")
                owned.state = CLOSING
                self._pool.submit(self._close_owned, owned)

    def _close_owned(self, owned: OwnedLog) -> None:
        owned.close()
        try:
            self.registry.release(owned.name)
        except BKError as exc:
            log.warning("log %s: could not release its lease: %s", owned.name, exc)
        self.wake()


class MuxIdentity(bytes):
    """A connection's identity, for the sections of its multi-log requests:
    their answers are routed (log, pid) and coalesced into MUX_REPLYs."""
    __slots__ = ()


_MUX_BYTE = bytes([MUX_KIND])

# plain ints: pyzmq's enum flags cost microseconds of Python per use (ipc/zmq_frames.py)
_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)


def _timeout_ms(due: float) -> int:
    """The loop's poll timeout: the next linger deadline (whole ms, rounded
    up: zmq's unit), at most the check interval."""
    if due == math.inf:
        return limits.LOG_SERVICE_CHECK_INTERVAL_MS
    return min(limits.LOG_SERVICE_CHECK_INTERVAL_MS,
               max(0, math.ceil((due - time.monotonic()) * 1000)))


def _echo(doc: dict) -> dict:
    """The fields of a request its reply repeats (the producer matches on them)."""
    return {k: doc[k] for k in ("log", "pid", "seq", "gen") if k in doc}

