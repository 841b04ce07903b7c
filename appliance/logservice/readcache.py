"""The log server's read cache (seed 003's read proxy): tailing readers of a
log are served by its owner from the records it wrote, so N readers cost
the bookies about what one costs.

Guarantees:

* Only acknowledged records: the cache of an owned log is fed by its
  writer's ``listen`` hook, entry by entry once the ledger acknowledged it
  (durable on its ack quorum: those records are in the log at those DLSNs
  for good, whatever happens to this process), in entry order.
* Whole or nothing: a cache covers every record of the log from its
  ``start`` on (its entries are consecutive; a gap found makes it start
  again after the gap).  A read from a position before ``start``
  (a reader far behind, records evicted, segments of an earlier owner) is
  answered ``miss``: the reader reads those from the bookies.  So a reader
  is never given a record twice nor made to skip one.
* Bounded: ``[log] read_cache_bytes`` of payloads per log (the oldest
  entries go first, ``start`` moves past them), at most
  ``LOG_READ_CACHE_WAITERS_MAX`` long polls parked, a reply at most
  ``LOG_READ_CACHE_RECORDS_MAX`` records.  A log gets a cache when a reader
  first asks for it; one no reader asked for in ``LOG_READ_CACHE_IDLE_MS``
  is dropped, and so is one whose log this server no longer writes.
* Superseded writers: an exclusive writer (``Log.writer()``) that takes
  the log fences the owner's segment, which the owner only learns on its
  next write.  So for every log with readers waiting, the log's metadata
  is read every ``LOG_READ_CACHE_CHECK_INTERVAL_MS``: once its epoch is not
  the owner's writer's, the cache is dropped and the readers sent to the
  bookies (which show the new writer's records).
* Long polls: a read with nothing new waits up to its ``wait_ms`` (at most
  ``LOG_READ_SERVICE_WAIT_MS_MAX``) and is answered as soon as an entry is
  acknowledged.  A log this server does not own (any more) is answered
  "not owner" with the owner's read endpoint, or ``miss`` when none holds
  it.

The service has its own socket (``<endpoint>.read`` for ipc, a free port
for tcp, CURVE there as the write socket; registered as the server's
``read_endpoint``) and thread, so reads never wait behind the write path's
loop.  Wire:
``appliance.logs.tail``.

Threads and what each owns:

* the read thread (``ReadService._run``) owns the socket, the caches
  (``_caches``), the parked long polls, ``_writers`` (the writer of each
  log the server has open, as it last heard) and ``stats``.  It learns the
  open logs' writers through a queue (``publish``), never by looking at
  the server's ``owned``.
* the server's loop thread calls ``publish(name, writer or None)`` when an
  owned log opens or stops being open (a ``queue.SimpleQueue``, then a wake).
* a ``RecentRecords`` is fed on the ledger client's completion thread
  (``LogWriter.listen``) and read on the read thread: its own lock.
* the metrics' HTTP thread asks ``shown()``: the read thread copies its
  stats and gauges when it takes the request from the same queue, and the
  HTTP thread waits for that copy on a future.
"""

from __future__ import annotations

import bisect
import logging
import queue
import threading
import time
from concurrent.futures import Future

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from appliance.errors import BadRequestError, BKError
from appliance.logs.tail import CONFIRMED, MISS, check_confirmed, check_read, encode_payloads
from appliance.logservice.wire import HEADER_WIRE
from appliance.meta.logservice import LogServiceRegistry
from appliance.protocol import limits
from appliance.protocol.invariant import invariant
from appliance.protocol.log_service import NOT_OWNER, encode_header
from appliance.protocol.logs import DLSN
from ipc.server import FrameServer

log = logging.getLogger("appliance.logservice")

CHECK_INTERVAL_S = limits.LOG_READ_CACHE_CHECK_INTERVAL_MS / 1000


class RecentRecords:
    """The recent acknowledged records of one log writer (see the module
    docstring).  ``append`` runs on the ledger's completion thread,
    ``read`` on the read service's: one lock."""

    def __init__(self, bytes_max: int, on_new=lambda: None):
        self._lock = threading.Lock()
        self.start = DLSN.FIRST  # every record of the log from here on is held
        self._next: tuple[int, int] | None = None  # the entry expected next (None: not begun)
        self._first: tuple[int, int] = (0, 0)  # the first entry the writer tells of
        # (seg, entry) of the last entry the writer had acknowledged: told to a
        # reader the cache cannot serve, so it reads the bookies that far
        self.confirmed: tuple[int, int] | None = None
        self._keys: list[tuple[int, int]] = []  # (seg, entry) of the entries held
        self._entries: list[tuple[list, list]] = []  # (txids, payloads)
        self._sizes: list[int] = []
        self.bytes = 0
        self.bytes_max = bytes_max
        self._on_new = on_new
        self.used_at = time.monotonic()

    def attach(self, writer) -> None:
        """Be told of ``writer``'s entries from now on (``LogWriter.listen``),
        and how far it had them acknowledged already (``confirmed``)."""
        with self._lock:  # an entry acknowledged meanwhile waits for ``start``
            self.start, next_entry = writer.listen(self.append)
            self._next = self._first = (self.start.seq, next_entry)
        try:  # outside the lock: the driver thread may be appending meanwhile
            acked = writer.acknowledged_now()
        except (BKError, TimeoutError) as exc:
            log.warning("read cache: how far the writer is acknowledged is unknown: %s", exc)
            return
        with self._lock:  # an entry appended meanwhile is later: the larger stays
            if acked is not None and (self.confirmed is None or acked > self.confirmed):
                self.confirmed = acked

    def append(self, seq: int, entry_id: int, txids: list, payloads: list) -> None:
        """One acknowledged entry (a control entry has no records)."""
        with self._lock:
            key = (seq, entry_id)
            if self.confirmed is None or key > self.confirmed:  # acknowledged in order
                self.confirmed = key
            if self._next is None or key < self._first:
                return  # sent before the cache began
            if key < self._next:  # out of order (the last entry of a segment after the
                # next segment's first): what is held may lack it; hold nothing before
                self._restart(DLSN(*self._next, 0), key)
                return
            # the next entry, or a new segment's first (the ledger client settles
            # one segment's adds before the writer sends the next segment's)
            if key != self._next and not (seq > self._next[0] and entry_id == 0):
                self._restart(DLSN(seq, entry_id, 0), key)
            self._next = (seq, entry_id + 1)
            if payloads:
                size = sum(map(len, payloads))
                self._keys.append(key)
                self._entries.append((txids, payloads))
                self._sizes.append(size)
                self.bytes += size
                self._evict()
        if payloads:
            self._on_new()

    def confirmed_now(self) -> tuple[int, int] | None:
        with self._lock:
            return self.confirmed

    def _restart(self, start: DLSN, key: tuple) -> None:
        """An entry that does not follow: drop everything, hold from ``start``."""
        log.warning("read cache: entry %s after %s: starting again from %s", key, self._next,
                    start)
        self._keys, self._entries, self._sizes, self.bytes = [], [], [], 0
        self.start = start

    def _evict(self) -> None:
        drop = 0
        while self.bytes > self.bytes_max and drop < len(self._keys) - 1:
            self.bytes -= self._sizes[drop]
            drop += 1
        if drop:  # from just after the last record dropped
            self.start = DLSN(*self._keys[drop - 1], len(self._entries[drop - 1][1]))
            del self._keys[:drop], self._entries[:drop], self._sizes[:drop]

    def read(self, pos: DLSN, max_records: int, max_bytes: int):
        """(runs ``[seg, entry, first slot, n]``, txids, payloads) of the
        records from ``pos`` on (empty: none yet), or None if the cache does
        not hold ``pos``.  Whole entries where they fit (``max_bytes`` is
        checked between entries)."""
        with self._lock:
            self.used_at = time.monotonic()
            if pos < self.start:
                return None
            runs, txids, payloads = [], [], []
            i = bisect.bisect_left(self._keys, (pos.seq, pos.entry_id))
            size = 0
            for j in range(i, len(self._keys)):
                room = max_records - len(payloads)
                if room <= 0 or (payloads and size >= max_bytes):
                    break
                seq, entry_id = self._keys[j]
                e_txids, e_payloads = self._entries[j]
                first = pos.slot if (seq, entry_id) == (pos.seq, pos.entry_id) else 0
                last = min(len(e_payloads), first + room)
                if first >= last:
                    continue
                runs.append([seq, entry_id, first, last - first])
                txids += e_txids[first:last]
                payloads += e_payloads[first:last]
                size += self._sizes[j]
            invariant(not runs or DLSN(*runs[0][:3]) >= pos,
                      "read cache: a record before the position asked for")
            return runs, txids, payloads


def read_endpoint_for(endpoint: str) -> str:
    """The read socket's endpoint beside a write endpoint."""
    if endpoint.startswith("ipc://"):
        return endpoint + ".read"
    if endpoint.startswith("tcp://"):
        return endpoint.rsplit(":", 1)[0] + ":*"
    return endpoint + "-read"


class ReadService:
    """The read socket and thread of one log server (``server``: its
    ``owned`` logs are read, never changed).  The socket is a ``FrameServer``
    (``HEADER_WIRE``; CURVE on tcp with the server's keys) whose loop runs
    on the ``read-cache`` thread: that thread alone owns ``_caches``,
    ``_superseded``, ``_waiters`` and ``stats``; the ledger's completion
    thread only calls ``wake`` (a record came)."""

    def __init__(self, server, bytes_max: int, curve=None):
        self.server = server
        self.bytes_max = bytes_max
        self.registry = LogServiceRegistry(server.client.logs.store)
        self._caches: dict[str, tuple[object, RecentRecords]] = {}  # log -> (writer, cache)
        self._writers: dict[str, object] = {}  # log -> its open writer (publish)
        self._posted: queue.SimpleQueue = queue.SimpleQueue()  # functions for the thread
        self._superseded: set = set()  # writers whose log another writer took
        self._waiters: list[tuple[bytes, dict, str, DLSN, int, float]] = []
        self._next_check = 0.0
        self.endpoint: str | None = None  # None: no read service (readers read the bookies)
        self._frames: FrameServer | None = None
        keys, authorized = curve if curve is not None else (None, None)
        try:
            self._frames = FrameServer(read_endpoint_for(server.endpoint), self,
                                       codec=HEADER_WIRE, curve_keys=keys,
                                       authorized_keys=authorized,
                                       poll_ms_max=int(CHECK_INTERVAL_S * 1000))
            self.endpoint = self._frames.endpoint
        except BKError as exc:
            log.warning("read cache off: cannot bind %s: %s", read_endpoint_for(server.endpoint),
                        exc)
        self.stats = {"read_requests": 0, "read_hits": 0, "read_misses": 0,
                      "read_records": 0, "read_redirects": 0}
        self._thread = threading.Thread(target=self._run, name="read-cache", daemon=True)

    def start(self) -> ReadService:
        if self._frames is not None:
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._frames is None:
            return
        self._frames.stop()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        else:
            self._frames.close()

    def _wake(self) -> None:
        if self._frames is not None:
            self._frames.wake()

    def publish(self, name: str, writer) -> None:
        """The server's loop thread: ``name`` is open with ``writer`` now, or
        not open any more (None)."""
        if self.endpoint is not None:
            self._posted.put(lambda: self._set_writer(name, writer))
            self._wake()

    def _set_writer(self, name: str, writer) -> None:
        if writer is None:
            self._writers.pop(name, None)
        else:
            self._writers[name] = writer

    def _run_posted(self) -> None:
        while True:
            try:
                fn = self._posted.get_nowait()
            except queue.Empty:
                return
            fn()

    def shown(self) -> dict:
        """Any thread but the read thread: its stats and gauges, copied there
        ({} when it does not run or does not answer in time)."""
        if self.endpoint is None or not self._thread.is_alive():
            return {}
        fut: Future = Future()
        self._posted.put(lambda: fut.set_result(self._show()))
        self._wake()
        try:
            return fut.result(timeout=limits.CLIENT_CALL_TIMEOUT_S_MAX)
        except TimeoutError:
            return {}

    def _show(self) -> dict:
        caches = [c for _w, c in self._caches.values()]
        return {**self.stats, "read_cache_logs": len(caches),
                "read_cache_bytes": sum(c.bytes for c in caches),
                "read_waiting": len(self._waiters)}

    # -- the thread -------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._frames.serve()
        except Exception:  # noqa: BLE001 - reads go to the bookies; the writes go on
            log.exception("read cache stopped")
        finally:
            for writer, _cache in self._caches.values():
                writer.listen(None)
            self._frames.close()

    def after_step(self) -> None:
        """Every turn of the loop: parked reads answered (records came, or
        their wait is over), and the caches checked every interval.  What
        the server's loop published is taken first (a read that came in the
        same turn was answered from what the thread knew before: at worst a
        miss, which sends the reader to the bookies)."""
        self._run_posted()
        self._answer_waiters()
        if time.monotonic() >= self._next_check:
            self._drop_stale()
            self._next_check = time.monotonic() + CHECK_INTERVAL_S

    def handle(self, identity: bytes, doc: dict) -> list | None:
        """One read or ``confirmed`` request: answered now, or parked until
        a record comes or its ``wait_ms`` is over (a timer wakes the loop)."""
        if doc["op"] == CONFIRMED:
            self._answer_confirmed(identity, doc.get("rid"), check_confirmed(doc))
            return None
        if doc["op"] != "read":
            raise BadRequestError(f"unknown op {doc['op']!r}")
        name, pos, max_records, wait_ms = check_read(doc)
        self.stats["read_requests"] += 1
        if self._answer(identity, doc.get("rid"), name, pos, max_records, wait_ms == 0):
            return None
        if len(self._waiters) >= limits.LOG_READ_CACHE_WAITERS_MAX:
            self._reply_miss(identity, doc.get("rid"))
            return None
        self._waiters.append((identity, doc.get("rid"), name, pos, max_records,
                              time.monotonic() + wait_ms / 1000))
        self._frames.call_later_ms(wait_ms, _no_op)  # a turn when its wait is over
        return None

    def _answer(self, identity: bytes, rid, name: str, pos: DLSN, max_records: int,
                empty_ok: bool, memo: dict | None = None) -> bool:
        """Answer a read now if there is something to say (records, miss, not
        owner), or an empty one if ``empty_ok``; False: park it."""
        cache = self._cache_for(name)
        if cache is None:
            self._not_here(identity, rid, name, memo)
            return True
        key = (name, pos, max_records)
        if memo is not None and key in memo:
            got = memo[key]
        else:
            got = cache.read(pos, max_records, limits.LOG_READ_CACHE_REPLY_BYTES_MAX)
            if got is not None:  # (runs, records, payload frames): one encoding for all
                got = (got[0], len(got[2]), encode_payloads(got[1], got[2]))
            if memo is not None:
                memo[key] = got
        if got is None:
            self._reply_miss(identity, rid, cache.confirmed_now())
            return True
        runs, records, frames = got
        if not records and not empty_ok:
            return False
        self.stats["read_hits"] += 1
        self.stats["read_records"] += records
        self._send(identity, [encode_header({"op": "records", "rid": rid, "runs": runs}),
                              *frames])
        return True

    def _answer_confirmed(self, identity: bytes, rid, name: str) -> None:
        """How far this owner's writer has ``name`` acknowledged (read your
        writes for readers of the bookies), or where to ask instead."""
        cache = self._cache_for(name)
        if cache is None:
            self._not_here(identity, rid, name, None)
            return
        at = cache.confirmed_now()
        self._send(identity, [encode_header({"op": CONFIRMED, "rid": rid,
                                             "at": list(at) if at is not None else None})])

    def _answer_waiters(self) -> None:
        if not self._waiters:
            return
        now = time.monotonic()
        memo: dict = {}  # readers at one position share one read of the cache
        keep = []
        for w in self._waiters:
            identity, rid, name, pos, max_records, deadline = w
            if not self._answer(identity, rid, name, pos, max_records, now >= deadline, memo):
                keep.append(w)
        self._waiters = keep

    def _cache_for(self, name: str) -> RecentRecords | None:
        """The cache of a log this server writes now (made on first use)."""
        writer = self._writers.get(name)
        if writer is None:
            return None
        held = self._caches.get(name)
        if held is not None and held[0] is writer:
            return held[1]
        if writer in self._superseded:
            return None
        if held is not None:
            held[0].listen(None)
        cache = RecentRecords(self.bytes_max, self._wake)
        cache.attach(writer)
        self._caches[name] = (writer, cache)
        log.info("log %s: read cache from %s", name, cache.start)
        return cache

    def _not_here(self, identity: bytes, rid, name: str, memo: dict | None) -> None:
        """A read of a log this server does not write: to its owner, or the
        bookies (looked up once per log per turn: ``memo``)."""
        route = memo.get(("route", name)) if memo is not None else None
        if route is None:
            route = self._route(name)
            if memo is not None:
                memo[("route", name)] = route
        if route[0] is None:
            self._reply_miss(identity, rid)
            return
        self.stats["read_redirects"] += 1
        self._send(identity, [encode_header({"op": "error", "code": NOT_OWNER, "rid": rid,
                                             "owner": route[0], "endpoint": route[1]})])

    def _route(self, name: str) -> tuple:
        """(owner, its read endpoint) of a log another server owns, else
        (None, None)."""
        try:
            lease = self.registry.owner(name)
            info = self.registry.servers().get(lease["server"], {}) if lease else {}
        except BKError:
            return None, None
        if lease is None or lease.get("server") == self.server.id or \
                not isinstance(info.get("read_endpoint"), str):
            return None, None
        return lease["server"], info["read_endpoint"]

    def _reply_miss(self, identity: bytes, rid, confirmed: tuple | None = None) -> None:
        """Read the bookies; ``confirmed``: (seg, entry) acknowledged so far by
        this owner, for the reader to read that far although the bookies'
        LAC, carried by the next entry, is behind (read your writes)."""
        self.stats["read_misses"] += 1
        doc = {"op": MISS, "rid": rid}
        if confirmed is not None:
            doc["confirmed"] = list(confirmed)
        self._send(identity, [encode_header(doc)])

    def _send(self, identity: bytes, frames: list) -> None:
        """Never blocks: a reader gone or slow asks again after its timeout."""
        self._frames.send_reply(identity, frames)

    def _drop_stale(self) -> None:
        """Drop the caches of logs this server no longer writes, those whose
        writer was superseded, and those no reader asked for in
        ``LOG_READ_CACHE_IDLE_MS``."""
        now = time.monotonic()
        waited = {w[2] for w in self._waiters}
        for name, (writer, cache) in list(self._caches.items()):
            if self._writers.get(name) is not writer or \
                    now - cache.used_at > limits.LOG_READ_CACHE_IDLE_MS / 1000 or \
                    (name in waited and self._superseded_now(name, writer)):
                writer.listen(None)
                del self._caches[name]
        self._superseded &= set(self._writers.values())

    def _superseded_now(self, name: str, writer) -> bool:
        """Has another writer taken the log (its epoch is not ``writer``'s)?"""
        try:
            md, _ = self.server.client.logs.read_log(name)
        except BKError:
            return False  # the next check looks again
        if md.epoch == writer.epoch:
            return False
        log.info("log %s: taken by another writer (epoch %d): readers to the bookies", name,
                 md.epoch)
        self._superseded.add(writer)
        return True


def start_read_service(server, curve=None) -> ReadService:
    """Bind and start the read cache of ``server`` (a ``LogServer``);
    ``curve``: its (keys, authorized keys) on tcp, or None."""
    return ReadService(server, server.client.log_config.read_cache_bytes, curve).start()


def _no_op() -> None:
    """A timer's callback that only makes the loop take a turn."""


def read_metrics(reads: ReadService | None):
    """The read cache's Prometheus families (none when it is off)."""
    if reads is None:
        return
    docs = {"read_requests": "Reads from tailing readers.",
            "read_hits": "Reads answered from the read cache (records, or none yet after "
                         "the long poll).",
            "read_misses": "Reads answered 'miss' (read the bookies): before the cache, or a "
                           "log not owned here.",
            "read_records": "Records served from the read cache.",
            "read_redirects": "Reads answered 'not owner' (sent to the owner)."}
    gauges = reads.shown()
    for name, text in docs.items():
        yield CounterMetricFamily(f"bookkeeper_logserver_{name}", text,
                                  value=gauges.get(name, 0))
    yield GaugeMetricFamily("bookkeeper_logserver_read_cache_logs", "Logs with a read cache.",
                            value=gauges.get("read_cache_logs", 0))
    yield GaugeMetricFamily("bookkeeper_logserver_read_cache_bytes",
                            "Payload bytes in the read caches.",
                            value=gauges.get("read_cache_bytes", 0))
    yield GaugeMetricFamily("bookkeeper_logserver_read_waiting",
                            "Tailing readers' long polls waiting for a record.",
                            value=gauges.get("read_waiting", 0))
