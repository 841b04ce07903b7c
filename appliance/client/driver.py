"""The client driver: runs the pure protocol cores over ZeroMQ and the
metadata store.

One thread (the *driver thread*) owns every core and the bookie sockets:
it waits on the sockets (``ipc.client.Transport`` without an I/O thread of
its own, ``io_thread=False``) and on a wake-up pipe at once; replies are
applied as they are read, and user calls, metadata results and timers
arrive on one queue (appended by any thread, then one ``wake()`` per wait).
So the cores need no locks and stay exactly the code the simulation runs,
and a message costs no hand-off to a transport thread either way.  The
driver carries out the actions the cores return:

* ``SendAdd`` -> the outbound (``outbound.Outbound``, owned by the driver
  and run on its thread): batched per bookie as ``ADD_PACKED``, small adds
  of several ledgers coalesced into ``ADD_MULTI`` (``ADD_BATCH`` for an
  older bookie), held for company while a bookie has
  ``add_messages_inflight`` add messages awaiting replies; sent at the end
  of the loop turn; the reply to a ``SendAdd`` comes back as one
  ``AddResponses``;
* ``SendRead`` / ``SendReadBatch`` / ``SendReadLac`` / ``SendWaitLac`` (a
  long poll, timed out after its own wait plus the request timeout) -> one
  wire request each, sent at once;
* ``WriteMetadata`` / ``ReadMetadata`` -> the metadata store, on a small
  worker pool (``metadata_pool.MetadataPool``: the store blocks; the driver
  thread never does);
* ``SendWriteLac`` (explicit LAC, best effort: replies are dropped) -> the
  outbound: WRITE_LAC, or one ``WRITE_LAC_MULTI`` per bookie for the LACs
  of several ledgers in one loop turn;
* ``SendWriteClose`` (BP-32) -> WRITE_CLOSE requests, fire and forget: their
  replies only feed a logged outcome (``write_close.WriteCloseOutcome``);
* ``SetTimer`` -> a timer heap on the driver thread;
* result actions (``CompleteAdds``, ``OpenDone``, ...) -> the sink object
  that registered the core (a ledger handle), which resolves futures.

A request to a bookie the registry does not list, or that the transport
refuses, is answered to the core as ``BookieUnavailableError`` (unknown
class: it drives an ensemble change, never a wrong negative).

CURVE (``appliance.curve``): a tcp bookie is reached with the server key it
registered; one not trusted is refused (a log line) and not available; one
refusing our key fails requests with ``UnauthorizedError``, which
``error(code, prefix)`` explains.

Limits: the driver queue is unbounded in type but bounded in practice by
each write handle's in-flight count (its add paths wait on a condition
while ``inflight_adds_max`` adds or ``inflight_bytes_max`` bytes are in
flight) and by one outstanding call per user thread; ``limits.CLIENT_DRAIN_ITEMS_MAX``
bounds work per wakeup; the metadata pool (``metadata_pool``) has
``METADATA_WORKERS`` threads; the outbound's messages are bounded by
``add_batch_entries_max`` / ``add_batch_bytes_max`` (``outbound``).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import threading
import time
from collections import deque
from concurrent.futures import Future

from appliance.curve import bookie_server_key
from appliance.errors import (
    BKError,
    BookieUnavailableError,
    ClientClosedError,
    UnauthorizedError,
    code_of,
    error_for_code,
)
from appliance.meta.bookies import bookie_locations
from appliance.protocol import events as ev
from appliance.protocol import limits
from ipc.client import Transport
from ipc.packed import ReadPackedRequest
from ipc.requests import ReadLacRequest, ReadRequest, WaitLacRequest, WriteCloseRequest

from .core_events import failure_events, translate
from .metadata_pool import MetadataPool
from .outbound import Outbound
from .write_close import WriteCloseOutcome, new_counters, reply_code

log = logging.getLogger(__name__)

METADATA_WORKERS = 2
BOOKIE_REFRESH_MS = 1000  # how often live bookies are re-read from the registry
_COALESCED = object()  # route marker: the request carried several parts
_LAC_MULTI = object()  # route marker: a WRITE_LAC_MULTI (its actions, for the fallback)


def _fail_call(fut: Future, error: BaseException) -> None:
    """Fail a call's future unless it is done or cancelled already (the
    closing thread and the caller may both try, once the loop stopped)."""
    try:
        if fut.set_running_or_notify_cancel():
            fut.set_exception(error)
    except RuntimeError:  # already running or finished: the other side failed it
        pass


class Driver:
    """See the module docstring.  ``start()`` then use; ``close()`` when done.

    Any thread: ``call``, ``post``, ``close``.  The driver thread: ``run``,
    ``feed``, ``register`` / ``unregister``, ``call_later_s``, and the sends
    the outbound makes through it (``send``, ``send_routed``,
    ``fail_next_turn``).  It owns ``outbound`` (adds and explicit LACs per
    bookie) and ``metadata`` (the metadata worker pool)."""

    def __init__(self, ledgers, registry, *,
                 request_timeout_ms: int = limits.CLIENT_ADD_TIMEOUT_MS,
                 inflight_per_bookie_max: int = limits.CLIENT_TRANSPORT_INFLIGHT_PER_BOOKIE_MAX,
                 transport_options: dict | None = None,
                 add_batch_entries_max: int = limits.CLIENT_ADD_BATCH_ENTRIES_MAX,
                 add_batch_bytes_max: int = limits.CLIENT_ADD_BATCH_BYTES_MAX,
                 read_batch_bytes_max: int = limits.CLIENT_READ_BATCH_BYTES_MAX, curve=None,
                 add_messages_inflight: int = 1, add_linger_us: int = 2000):
        self.request_timeout_ms = request_timeout_ms
        self.read_batch_bytes_max = read_batch_bytes_max
        # Adds and explicit LACs: batched and coalesced per bookie by the
        # outbound (its methods bound once: every add comes through run());
        # its messages of several parts are routed by the driver's markers.
        self.outbound = Outbound(self, coalesced_route=_COALESCED, lac_multi_route=_LAC_MULTI,
                                 add_batch_entries_max=add_batch_entries_max,
                                 add_batch_bytes_max=add_batch_bytes_max,
                                 add_messages_inflight=add_messages_inflight,
                                 add_linger_us=add_linger_us)
        self._send_add = self.outbound.add
        self._write_lac = self.outbound.write_lac
        self._on_packed_reply = self.outbound.on_packed_reply
        self._on_coalesced_reply = self.outbound.on_coalesced_reply
        self._on_lac_multi_reply = self.outbound.on_lac_multi_reply
        self.ids = itertools.count(1)  # shared by every core: ids route replies
        # Work from other threads: appended here, then the transport's wake()
        # ends the driver's wait (once per wait: _wake_pending).
        self._q: deque = deque()
        self._wake_pending = False
        self._stopped = False
        self._routes: dict[int, tuple] = {}  # transport request id -> (core, action)
        self._timers: list[tuple[int, int]] = []  # (deadline_ms, timer_id)
        self._later: list[tuple] = []  # call_later_s: (deadline_s, seq, fn, args)
        self._later_seq = itertools.count()
        self._timer_owner: dict[int, object] = {}
        self._sinks: dict[int, object] = {}  # id(core) -> sink
        self._cores: dict[int, object] = {}
        self._endpoints: dict[str, tuple] = {}  # bookie id -> (endpoint, CURVE server key)
        self.curve = curve  # appliance.curve.ClientCurve or None
        self._refusals: dict[str, BKError] = {}  # bookie id -> why we do not talk to it
        self._available: tuple[str, ...] = ()
        self._locations: dict = {}  # bookie id -> placement.Location (registry labels)
        self.write_close_outcomes = new_counters()  # BP-32: succeeded / partly / failed
        self._closed = False
        self.metadata = MetadataPool(ledgers, registry, self._put, METADATA_WORKERS)
        # The transport has no I/O thread of its own: the driver thread owns
        # the sockets and waits on them (one thread hand-off less per message
        # each way); replies arrive through _on_transport_events.
        self.transport = Transport(on_events=self._on_transport_events,
                                   inflight_per_bookie_max=inflight_per_bookie_max,
                                   curve_keys=curve.keys if curve is not None else None,
                                   io_thread=False, **(transport_options or {}))
        self._thread = threading.Thread(target=self._run, name="bk-client-driver", daemon=True)
        self._use_registry(self.metadata.read_bookies() or {})

    def start(self) -> None:
        self._thread.start()

    @staticmethod
    def now_ms() -> int:
        return int(time.monotonic() * 1000)

    @property
    def available_bookies(self) -> tuple[str, ...]:
        return self._available

    @property
    def locations(self) -> dict:
        """Where the registered bookies are (``placement.Location`` by id)."""
        return self._locations

    # -- calls from user threads ------------------------------------------------
    def call(self, fn, *args) -> Future:
        """Run ``fn(*args)`` on the driver thread; its return value (or
        exception) completes the future."""
        fut: Future = Future()
        if self._closed:
            fut.set_exception(ClientClosedError("the client is closed"))
            return fut
        self._put(("call", fn, args, fut))
        if self._stopped:  # closed meanwhile: the leftovers may have been failed already
            _fail_call(fut, ClientClosedError("the client was closed before this call ran"))
        return fut

    def post(self, fn, *args) -> None:
        """Run ``fn(*args)`` on the driver thread, fire and forget."""
        self._put(("post", fn, args))

    def _put(self, item: tuple) -> None:
        """Any thread: queue ``item`` for the driver thread and wake it (one
        wake-up per wait: the flag is cleared by the driver before it drains
        the queue, so an item appended after the drain always wakes it)."""
        self._q.append(item)
        if not self._wake_pending:
            self._wake_pending = True
            self.transport.wake()

    def call_later_s(self, delay_s: float, fn, *args) -> None:
        """Driver thread only: run ``fn(*args)`` on the driver thread in
        ``delay_s`` (sub-millisecond, unlike the cores' timers)."""
        heapq.heappush(self._later, (time.monotonic() + delay_s, next(self._later_seq), fn, args))

    # -- used on the driver thread ------------------------------------------------
    def register(self, core, sink) -> None:
        self._cores[id(core)] = core
        self._sinks[id(core)] = sink

    def unregister(self, core) -> None:
        self._cores.pop(id(core), None)
        self._sinks.pop(id(core), None)

    def run(self, core, actions: list, holdable: bool = False) -> None:
        """Carry out ``actions`` returned by ``core`` (the add path's kinds
        tested first: every flush of every ledger comes through here).
        ``holdable``: its adds may wait for company (a handle's fresh batch)."""
        write_closes = None
        for action in actions:
            kind = type(action)
            if kind is ev.SendAdd:
                self._send_add(core, action, holdable)
            elif kind is ev.CompleteAdds:
                sink = self._sinks.get(id(core))
                if sink is not None:
                    sink.on_result(action)
            elif kind is ev.SetTimer:
                heapq.heappush(self._timers, (self.now_ms() + action.delay_ms, action.timer_id))
                self._timer_owner[action.timer_id] = core
            elif kind is ev.SendWriteClose:
                if write_closes is None:
                    write_closes = []
                write_closes.append(action)
            elif kind is ev.SendReadBatch:
                count = action.last_entry_id - action.first_entry_id + 1
                self.send(core, action, ReadPackedRequest(
                    action.ledger_id, action.first_entry_id, action.last_entry_id, count,
                    self.read_batch_bytes_max, master_key=action.master_key or None))
            elif kind is ev.SendRead:  # every read carries the key (b"" in an event: none)
                req = ReadRequest(action.ledger_id, action.entry_id, action.fence,
                                  action.master_key or None)
                self.send(core, action, req)
            elif kind is ev.SendReadLac:
                req = ReadLacRequest(action.ledger_id, action.fence, action.master_key or None)
                self.send(core, action, req)
            elif kind is ev.SendWaitLac:  # a long poll: its own timeout on top
                self.send(core, action, WaitLacRequest(
                    action.ledger_id, action.previous_lac, action.timeout_ms,
                    master_key=action.master_key or None), action.timeout_ms)
            elif kind is ev.WriteMetadata or kind is ev.ReadMetadata:
                self.metadata.submit(core, action)
            elif kind is ev.SendWriteLac:  # best effort: the reply (or none) is dropped
                self._write_lac(core, action)  # sent at the end of this loop turn
            else:
                sink = self._sinks.get(id(core))
                if sink is not None:
                    sink.on_result(action)
        if write_closes:  # after the results: the close's future is already done
            self._send_write_closes(write_closes)

    def _send_write_closes(self, actions: list) -> None:
        """BP-32: one advisory WRITE_CLOSE per bookie; never waited for."""
        by_ledger: dict[int, list] = {}
        for action in actions:
            by_ledger.setdefault(action.ledger_id, []).append(action)
        for ledger_id, group in by_ledger.items():
            outcome = WriteCloseOutcome(ledger_id, [a.bookie_id for a in group],
                                        self.write_close_outcomes)
            for action in group:
                try:
                    self.send_routed(action.bookie_id,
                                     WriteCloseRequest(ledger_id, action.master_key),
                                     (outcome, action))
                except (BKError, ValueError) as exc:
                    outcome.done(action.bookie_id, code_of(exc) if isinstance(exc, BKError)
                                 else BookieUnavailableError.code)

    def feed(self, core, event) -> None:
        """Apply one event to ``core`` and carry out what it returns."""
        if id(core) in self._cores:
            self.run(core, core.handle(event))

    def is_registered(self, core) -> bool:
        """Whether ``core`` is still fed (registered and not yet unregistered)."""
        return id(core) in self._cores

    # -- sending to bookies (driver thread) ---------------------------------------
    def send(self, core, action, request, extra_timeout_ms: int = 0, route=None) -> int | None:
        """Send ``request`` for ``action`` of ``core``; the reply is routed
        back as to ``action`` (``route``: what stands for it until then).
        The transport's request id, or ``None`` when it could not leave
        (``action`` then fails on the next loop turn)."""
        bookie_id = action.bookie_id
        try:
            self._ensure_bookie(bookie_id)
            rid = self.transport.send(bookie_id, request,
                                      self.request_timeout_ms + extra_timeout_ms)
        except (BKError, ValueError) as exc:
            log.debug("cannot send to %s: %s", bookie_id, exc)
            code = exc.code if isinstance(exc, BKError) else BookieUnavailableError.code
            self.fail_next_turn(core, action, code)
            return None
        self._routes[rid] = (core, action if route is None else route)
        return rid

    def send_routed(self, bookie_id: str, request, route: tuple) -> int:
        """Send ``request`` to ``bookie_id`` (the request timeout); its reply
        or failure goes to ``route``: (a core or a route marker, what stands
        for the action).  Raise ``BKError`` / ``ValueError`` when it cannot
        leave: the caller answers what it carried."""
        self._ensure_bookie(bookie_id)
        rid = self.transport.send(bookie_id, request, self.request_timeout_ms)
        self._routes[rid] = route
        return rid

    def fail_next_turn(self, core, action, code: int) -> None:
        """Driver thread: answer ``action`` of ``core`` with failure ``code``
        on the next loop turn (never inside the call that sent it)."""
        self._q.append(("fail", core, action, code))

    def _ensure_bookie(self, bookie_id: str) -> None:
        if bookie_id in self._endpoints:
            return
        if bookie_id in self._refusals:
            raise self._refusals[bookie_id]
        info = (self.metadata.read_bookies() or {}).get(bookie_id)
        if info is None:
            raise BookieUnavailableError(f"bookie {bookie_id} is not registered")
        self._connect(bookie_id, info)

    def _connect(self, bookie_id: str, info: dict, open_now: bool = True) -> None:
        """Driver thread: reach ``bookie_id`` as its registration says (its
        endpoint, its CURVE key checked; with ``open_now`` false only if it
        was reached before); raise why not."""
        try:
            route = (info["endpoint"], bookie_server_key(self.curve, bookie_id, info))
        except BKError as exc:
            if str(self._refusals.get(bookie_id)) != str(exc):
                log.warning("%s", exc)
            self._refusals[bookie_id] = exc
            self._endpoints.pop(bookie_id, None)
            raise
        self._refusals.pop(bookie_id, None)
        if (open_now or bookie_id in self._endpoints) and self._endpoints.get(bookie_id) != route:
            self._endpoints[bookie_id] = route
            self.transport.add_bookie(bookie_id, *route)

    def error(self, code: int, prefix: str) -> BKError:
        """The exception for ``code``, its message prefixed; an
        ``UnauthorizedError`` names the bookies refusing this client's key."""
        text = str(error_for_code(code))
        if code == UnauthorizedError.code:
            refused = {b: str(e) for b, e in dict(self._refusals).items()
                       if isinstance(e, UnauthorizedError)}
            refused.update(self.transport.refused_bookies())
            text = "; ".join(refused[b] for b in sorted(refused)) or text
        return error_for_code(code, f"{prefix}: {text}")

    def _on_transport_events(self, events) -> None:
        """Driver thread (inside ``transport.step``): replies and failures."""
        if self._stopped:
            return  # closing: the cores are gone
        try:
            self._on_net(events)
        except Exception:
            log.exception("client driver: failure applying replies")

    def _on_net(self, events) -> None:
        now = self.now_ms()
        for event in events:
            route = self._routes.pop(event.request_id, None)
            if route is None:
                continue
            core, action = route
            if core is _COALESCED:
                self._on_coalesced_reply(action, event, now)
                continue
            if core is _LAC_MULTI:
                self._on_lac_multi_reply(action, event)
                continue
            if type(action) is tuple:  # an ADD_PACKED's add_head
                self._on_packed_reply(core, action, event, now)
                continue
            if type(action) is ev.SendWriteClose:  # the "core" is its outcome: logged only
                core.done(action.bookie_id, reply_code(event.status, event.reply))
                continue
            for core_event in translate(action, event, now):
                self.feed(core, core_event)

    def _fail(self, core, action, code: int) -> None:
        now = self.now_ms()
        for core_event in failure_events(action, code, now):
            self.feed(core, core_event)

    # -- the registry's view of the bookies ------------------------------------------
    def _use_registry(self, live: dict) -> None:
        """Driver thread: take the registry's view of live bookies."""
        untrusted = set()
        for bookie_id, info in live.items():
            if bookie_id in self._endpoints or bookie_id in self._refusals or self.curve:
                try:
                    self._connect(bookie_id, info, open_now=False)
                except BookieUnavailableError:
                    untrusted.add(bookie_id)  # refused: not a candidate for ensembles
                except BKError:
                    pass  # requires CURVE we lack: sends fail with UnauthorizedError
        self._available = tuple(sorted(b for b, info in live.items()
                                       if not info.get("read_only") and b not in untrusted))
        self._locations = bookie_locations(live)

    # -- the loop -----------------------------------------------------------------
    def _run(self) -> None:
        self.transport.bind_owner()
        next_refresh = self.now_ms() + BOOKIE_REFRESH_MS
        q = self._q
        flush_adds, flush_lacs = self.outbound.flush_adds, self.outbound.flush_lacs
        while True:
            # Wait on the bookies' sockets and the wake pipe at once: replies
            # are handled inside step(), queued work right after it.
            wait_ms = 0 if q else math.ceil(self._wait_s() * 1000.0)
            self.transport.step(wait_ms)
            self._wake_pending = False  # before draining: see _put
            for _ in range(min(len(q), limits.CLIENT_DRAIN_ITEMS_MAX)):
                it = q.popleft()
                if it[0] == "stop":
                    self._stopped = True
                    return
                self._apply(it)
            self._fire_timers()
            flush_adds()
            flush_lacs()
            if self.now_ms() >= next_refresh:
                next_refresh = self.now_ms() + BOOKIE_REFRESH_MS
                self.metadata.refresh_bookies()

    def _apply(self, item) -> None:
        kind = item[0]
        try:
            if kind == "event":
                self.feed(item[1], item[2])
            elif kind == "fail":
                self._fail(item[1], item[2], item[3])
            elif kind == "call":
                _, fn, args, fut = item
                if fut.set_running_or_notify_cancel():
                    try:
                        fut.set_result(fn(*args))
                    except BaseException as exc:
                        fut.set_exception(exc)
            elif kind == "post":
                item[1](*item[2])
            elif kind == "bookies":
                self._use_registry(item[1])
                event = ev.AvailableBookies(self._available, self.now_ms(), self._locations)
                for core in list(self._cores.values()):
                    self.feed(core, event)
        except Exception:
            log.exception("client driver: failure applying %s", kind)

    def _wait_s(self) -> float:
        wait_s = BOOKIE_REFRESH_MS / 1000.0
        if self._timers:
            wait_s = max(0.0, (self._timers[0][0] - self.now_ms()) / 1000.0)
        if self._later:
            wait_s = min(wait_s, max(0.0, self._later[0][0] - time.monotonic()))
        return wait_s

    def _fire_timers(self) -> None:
        while self._later and self._later[0][0] <= time.monotonic():
            _, _, fn, args = heapq.heappop(self._later)
            try:
                fn(*args)
            except Exception:
                log.exception("client driver: failure in a deferred call")
        now = self.now_ms()
        while self._timers and self._timers[0][0] <= now:
            _, timer_id = heapq.heappop(self._timers)
            core = self._timer_owner.pop(timer_id, None)
            if core is not None:
                self.feed(core, ev.TimerFired(timer_id, now))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._put(("stop",))
        if self._thread.is_alive():
            self._thread.join()
        self._stopped = True
        self.transport.close()
        self.metadata.shutdown()
        self._fail_leftovers()

    def _fail_leftovers(self) -> None:
        """After the loop stopped: the calls it never ran and the results it
        never delivered fail with ``ClientClosedError`` (each handle's
        ``client_closed``), instead of leaving their callers waiting."""
        error = ClientClosedError("the client was closed before this call ran")
        while self._q:
            item = self._q.popleft()
            if item[0] == "call":
                _fail_call(item[3], error)
        for sink in list(self._sinks.values()):
            closed = getattr(sink, "client_closed", None)
            if closed is not None:
                try:
                    closed()
                except Exception:
                    log.exception("client driver: failure failing a handle's calls")
