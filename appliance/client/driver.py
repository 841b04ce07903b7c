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

* ``SendAdd`` / ``SendRead`` / ``SendReadLac`` / ``SendWaitLac`` (a long poll,
  timed out after its own wait plus the request timeout) -> wire requests (one
  ``ADD_PACKED`` per bookie and action, split at ``add_batch_entries_max`` /
  ``add_batch_bytes_max``: adds to one bookie travel batched, their bytes in
  one frame; small adds of several ledgers queued in one loop turn share an
  ``ADD_MULTI`` per bookie, their bytes in one frame too, or ``ADD_BATCH``
  for a bookie that refused ``ADD_MULTI`` as an unknown op: an older one);
  the reply to a ``SendAdd`` comes back as one ``AddResponses``.  Adds to a
  bookie that already has ``add_messages_inflight`` add messages awaiting
  replies wait for one of those replies (at most ``add_linger_us``) and
  share the next message, if they come from a write handle's fresh batch
  (many ledgers, each with an add now and then: one message per bookie per
  round trip instead of one per add); resends, recovery writes, full
  messages and batches that already waited at their handle never wait;
* ``WriteMetadata`` / ``ReadMetadata`` -> the metadata store, on a small
  worker pool (the store blocks; the driver thread never does);
* ``SendWriteLac`` (explicit LAC, best effort: replies are dropped) ->
  WRITE_LAC; those of several ledgers to one bookie in one loop turn (the
  idle writers of many ledgers) share a ``WRITE_LAC_MULTI``, or go one by
  one to a bookie that refused it as an unknown op (an older one);
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
bounds work per wakeup; the metadata pool has ``METADATA_WORKERS`` threads.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import logging
import math
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor

from appliance.errors import (
    OK,
    BadRequestError,
    BKError,
    BKTimeoutError,
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
from ipc.packed import AddMultiReply, AddMultiRequest, AddPackedRequest, ReadPackedRequest
from ipc.replies import ErrorReply
from ipc.requests import (
    AddBatchRequest,
    AddItem,
    ReadLacRequest,
    ReadRequest,
    WaitLacRequest,
    WriteCloseRequest,
    WriteLacMultiRequest,
    WriteLacRequest,
)

from .core_events import (
    add_head,
    chunks,
    coalesced,
    coalesced_events,
    failure_events,
    translate,
)
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


def _no_op() -> None:
    """A deferred call that only ends the driver's wait (a hold's deadline)."""


class Driver:
    """See the module docstring.  ``start()`` then use; ``close()`` when done."""

    def __init__(self, ledgers, registry, *,
                 request_timeout_ms: int = limits.CLIENT_ADD_TIMEOUT_MS,
                 inflight_per_bookie_max: int = limits.CLIENT_TRANSPORT_INFLIGHT_PER_BOOKIE_MAX,
                 transport_options: dict | None = None,
                 add_batch_entries_max: int = limits.CLIENT_ADD_BATCH_ENTRIES_MAX,
                 add_batch_bytes_max: int = limits.CLIENT_ADD_BATCH_BYTES_MAX,
                 read_batch_bytes_max: int = limits.CLIENT_READ_BATCH_BYTES_MAX, curve=None,
                 add_messages_inflight: int = 1, add_linger_us: int = 2000):
        self.ledgers = ledgers
        self.registry = registry
        self.request_timeout_ms = request_timeout_ms
        self.add_batch_entries_max = add_batch_entries_max
        self.add_batch_bytes_max = add_batch_bytes_max
        self.read_batch_bytes_max = read_batch_bytes_max
        self._packed_datas: tuple | None = None  # the last SendAdd's datas and their chunks
        self._packed: list = []
        self._adds_out: dict[str, list] = {}  # bookie -> (core, SendAdd part, lengths, data)
        self._multi_refused: set[str] = set()  # bookies that answered ADD_MULTI BadRequest
        self._multi_ok: set[str] = set()  # bookies that answered ADD_MULTI with its reply
        # The hold of adds per bookie (see the module docstring): add messages
        # awaiting their reply, when each bookie's held adds began to wait,
        # and the bookies with an add this turn that must not wait.
        self.add_messages_inflight = add_messages_inflight
        self.add_hold_s = add_linger_us / 1e6
        self._add_messages: dict[str, int] = {}
        self._held_since: dict[str, float] = {}
        self._adds_now: set[str] = set()
        self._lacs_out: dict[str, list] = {}  # bookie -> [(core, SendWriteLac)] this turn
        self._lac_multi_refused: set[str] = set()  # bookies that answered it BadRequest
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
        self._pool = ThreadPoolExecutor(METADATA_WORKERS, thread_name_prefix="bk-metadata")
        # The transport has no I/O thread of its own: the driver thread owns
        # the sockets and waits on them (one thread hand-off less per message
        # each way); replies arrive through _on_transport_events.
        self.transport = Transport(on_events=self._on_transport_events,
                                   inflight_per_bookie_max=inflight_per_bookie_max,
                                   curve_keys=curve.keys if curve is not None else None,
                                   io_thread=False, **(transport_options or {}))
        self._thread = threading.Thread(target=self._run, name="bk-client-driver", daemon=True)
        self._use_registry(self._read_registry() or {})

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
                self._send(core, action, ReadPackedRequest(
                    action.ledger_id, action.first_entry_id, action.last_entry_id, count,
                    self.read_batch_bytes_max, master_key=action.master_key or None))
            elif kind is ev.SendRead:  # every read carries the key (b"" in an event: none)
                req = ReadRequest(action.ledger_id, action.entry_id, action.fence,
                                  action.master_key or None)
                self._send(core, action, req)
            elif kind is ev.SendReadLac:
                req = ReadLacRequest(action.ledger_id, action.fence, action.master_key or None)
                self._send(core, action, req)
            elif kind is ev.SendWaitLac:  # a long poll: its own timeout on top
                self._send(core, action, WaitLacRequest(
                    action.ledger_id, action.previous_lac, action.timeout_ms,
                    master_key=action.master_key or None), action.timeout_ms)
            elif kind is ev.WriteMetadata or kind is ev.ReadMetadata:
                self._pool.submit(self._metadata_op, core, action)
            elif kind is ev.SendWriteLac:  # best effort: the reply (or none) is dropped
                lacs = self._lacs_out.get(action.bookie_id)
                if lacs is None:
                    lacs = self._lacs_out[action.bookie_id] = []
                lacs.append((core, action))  # sent at the end of this loop turn
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
                    self._ensure_bookie(action.bookie_id)
                    rid = self.transport.send(action.bookie_id,
                                              WriteCloseRequest(ledger_id, action.master_key),
                                              self.request_timeout_ms)
                except (BKError, ValueError) as exc:
                    outcome.done(action.bookie_id, code_of(exc) if isinstance(exc, BKError)
                                 else BookieUnavailableError.code)
                    continue
                self._routes[rid] = (outcome, action)

    def feed(self, core, event) -> None:
        """Apply one event to ``core`` and carry out what it returns."""
        if id(core) in self._cores:
            self.run(core, core.handle(event))

    # -- wire ---------------------------------------------------------------------
    def _send_add(self, core, action: ev.SendAdd, holdable: bool = False) -> None:
        """Queue one part per chunk of at most ``add_batch_entries_max``
        entries / ``add_batch_bytes_max`` bytes, each routed (and, on failure,
        answered) as a ``SendAdd`` of its own entries; ``_flush_adds`` sends
        them at the end of this loop turn.  A chunk's bytes are joined into
        one frame only if it travels as ``ADD_PACKED`` (once for every
        bookie of the write set); coalesced parts never need it.  Unless
        ``holdable``, this turn's adds to the bookie leave at its end."""
        if not holdable:
            self._adds_now.add(action.bookie_id)
        entry_ids, datas = action.entry_ids, action.datas
        if self._packed_datas is not datas:  # a writer sends one tuple to every bookie
            self._packed_datas = datas
            nbytes = sum(map(len, datas))
            if len(datas) <= self.add_batch_entries_max and nbytes <= self.add_batch_bytes_max:
                self._packed = [[0, len(datas), nbytes, None]]  # one chunk: the usual case
            else:
                self._packed = [[lo, hi, sum(map(len, datas[lo:hi])), None]
                                for lo, hi in chunks(datas, self.add_batch_entries_max,
                                                      self.add_batch_bytes_max)]
        out = self._adds_out.get(action.bookie_id)
        if out is None:
            out = self._adds_out[action.bookie_id] = []
        if len(self._packed) == 1:
            out.append((core, action, self._packed[0][2], self._packed[0]))
            return
        for chunk in self._packed:
            lo, hi = chunk[0], chunk[1]
            part = action if (lo, hi) == (0, len(datas)) else dataclasses.replace(
                action, entry_ids=entry_ids[lo:hi], datas=datas[lo:hi])
            out.append((core, part, chunk[2], chunk))

    def _flush_adds(self) -> None:
        """End of a loop turn: send the adds queued for each bookie.  The
        parts of several ledgers (many ledgers written at once: a few
        entries each per turn) share ``ADD_MULTI`` messages up to
        ``add_batch_entries_max`` / ``add_batch_bytes_max``: one message
        with one data frame, one bookie storage block and one reply instead
        of one per ledger.  A bookie's only part, or one that fills a
        message by itself, goes alone as ``ADD_PACKED`` (its bytes joined
        once for every bookie of its write set).  A bookie's adds that may
        wait (``_held``) stay queued for the next turn."""
        if not self._adds_out:
            return
        out, self._adds_out = self._adds_out, {}
        now = time.monotonic()
        for bookie_id, parts in out.items():
            if self._held(bookie_id, parts, now):
                self._adds_out[bookie_id] = parts
                continue
            self._held_since.pop(bookie_id, None)
            self._adds_now.discard(bookie_id)
            if len(parts) == 1:
                self._send_packed(parts[0])
                continue
            for group in coalesced(parts, self.add_batch_entries_max, self.add_batch_bytes_max):
                self._send_coalesced(bookie_id, group)

    def _held(self, bookie_id: str, parts: list, now: float) -> bool:
        """Whether ``parts``, this turn's adds to ``bookie_id``, wait for a
        reply from it: only if every one may wait, the bookie already has
        ``add_messages_inflight`` add messages awaiting replies, they began
        to wait less than ``add_linger_us`` ago (a deferred no-op wakes the
        loop then) and they do not fill a message.  A reply of the bookie
        lowers its count and so ends the wait at the end of that turn."""
        limit = self.add_messages_inflight
        if not limit or bookie_id in self._adds_now or \
                self._add_messages.get(bookie_id, 0) < limit:
            return False
        since = self._held_since.get(bookie_id)
        if since is None:
            since = self._held_since[bookie_id] = now
            self.call_later_s(self.add_hold_s, _no_op)
        if now - since >= self.add_hold_s:
            return False
        entries = nbytes = 0
        for item in parts:
            entries += len(item[1].entry_ids)
            nbytes += item[2]
        return entries < self.add_batch_entries_max and nbytes < self.add_batch_bytes_max

    def _flush_lacs(self) -> None:
        """End of a loop turn: send the explicit LACs queued for each bookie;
        those of several ledgers share ``WRITE_LAC_MULTI`` messages of up to
        ``add_batch_entries_max`` rows (each ledger's writer ticks on its
        own timer, so many idle ledgers' LACs fall in the same turns)."""
        if not self._lacs_out:
            return
        out, self._lacs_out = self._lacs_out, {}
        step = self.add_batch_entries_max
        for bookie_id, items in out.items():
            if len(items) == 1 or bookie_id in self._lac_multi_refused:
                for core, action in items:
                    self._send_write_lac(core, action)
                continue
            for lo in range(0, len(items), step):
                self._send_lac_multi(bookie_id, items[lo:lo + step])

    def _send_write_lac(self, core, action: ev.SendWriteLac) -> None:
        self._send(core, action, WriteLacRequest(action.ledger_id, action.lac,
                                                 action.master_key))

    def _send_lac_multi(self, bookie_id: str, items: list) -> None:
        request = WriteLacMultiRequest([(action.ledger_id, action.lac, action.master_key)
                                        for _, action in items])
        try:
            self._ensure_bookie(bookie_id)
            rid = self.transport.send(bookie_id, request, self.request_timeout_ms)
        except (BKError, ValueError) as exc:  # best effort, as a WRITE_LAC's failure
            log.debug("cannot send WRITE_LAC_MULTI to %s: %s", bookie_id, exc)
            return
        self._routes[rid] = (_LAC_MULTI, (bookie_id, items))

    def _on_lac_multi(self, sent: tuple, event) -> None:
        """A ``WRITE_LAC_MULTI`` reply: dropped, as a WRITE_LAC's, unless the
        bookie refused the op as a bad request (one from before it: it kept
        nothing); then its LACs go again one by one, and from then on."""
        bookie_id, items = sent
        reply = event.reply
        if type(reply) is ErrorReply and reply.status == BadRequestError.code \
                and bookie_id not in self._lac_multi_refused:
            log.info("bookie %s refused WRITE_LAC_MULTI (%s): sending it WRITE_LAC",
                     bookie_id, reply.message)
            self._lac_multi_refused.add(bookie_id)
            for core, action in items:
                if id(core) in self._cores:  # a closed handle's LAC no longer matters
                    self._send_write_lac(core, action)

    def _send_packed(self, item: tuple) -> None:
        """One part as ``ADD_PACKED``: its chunk's bytes joined once."""
        core, part, _nbytes, chunk = item
        if chunk[3] is None:
            chunk[3] = (list(map(len, part.datas)), b"".join(part.datas))
        lengths, data = chunk[3]
        self._send(core, part, AddPackedRequest(part.ledger_id, part.master_key,
                                                part.entry_ids, lengths, data, part.recovery),
                   route=add_head(part))

    def _send_coalesced(self, bookie_id: str, group: list) -> None:
        if len(group) == 1:
            self._send_packed(group[0])
            return
        self._send_multi(bookie_id, [item[0] for item in group], [item[1] for item in group])

    def _send_multi(self, bookie_id: str, cores: list, parts: list) -> None:
        """Several parts (``parts[i]``, a SendAdd of ``cores[i]``) to one
        bookie in one message: ``ADD_MULTI`` (every entry's bytes in one
        frame), or ``ADD_BATCH`` (a frame per entry) to a bookie that refused
        ``ADD_MULTI``.  The route keeps the cores and, once the bookie is known
        to take ``ADD_MULTI``, only the parts' ``add_head``s (before that the
        parts, for the ``ADD_BATCH`` fallback): what an add keeps alive until
        its reply is what the garbage collector promotes and later scans."""
        recovery = parts[0].recovery
        multi = bookie_id not in self._multi_refused
        if multi:
            groups, entry_ids, datas = [], [], []
            for part in parts:
                groups.append((part.ledger_id, part.master_key, len(part.entry_ids)))
                entry_ids += part.entry_ids
                datas += part.datas
            request = AddMultiRequest(groups, entry_ids, list(map(len, datas)),
                                      b"".join(datas), recovery)
        else:
            request = AddBatchRequest([AddItem(part.ledger_id, e, part.master_key, d)
                                       for part in parts
                                       for e, d in zip(part.entry_ids, part.datas, strict=True)],
                                      recovery)
        try:
            self._ensure_bookie(bookie_id)
            rid = self.transport.send(bookie_id, request, self.request_timeout_ms)
        except (BKError, ValueError) as exc:
            code = exc.code if isinstance(exc, BKError) else BookieUnavailableError.code
            for core, part in zip(cores, parts, strict=True):
                self._q.append(("fail", core, part, code))
            return
        if not multi or bookie_id in self._multi_ok:  # no ADD_BATCH fallback needed
            parts = tuple(add_head(part) for part in parts)
        self._routes[rid] = (_COALESCED, (bookie_id, cores, parts, multi))
        self._add_messages[bookie_id] = self._add_messages.get(bookie_id, 0) + 1

    def _send(self, core, action, request, extra_timeout_ms: int = 0, route=None) -> None:
        """Send ``request`` for ``action`` of ``core``; the reply is routed
        back as to ``action`` (``route``: what stands for it until then)."""
        bookie_id = action.bookie_id
        try:
            self._ensure_bookie(bookie_id)
            rid = self.transport.send(bookie_id, request,
                                      self.request_timeout_ms + extra_timeout_ms)
        except (BKError, ValueError) as exc:
            log.debug("cannot send to %s: %s", bookie_id, exc)
            code = exc.code if isinstance(exc, BKError) else BookieUnavailableError.code
            self._q.append(("fail", core, action, code))
            return
        self._routes[rid] = (core, action if route is None else route)
        if type(route) is tuple:  # an add_head: an ADD_PACKED awaiting its reply
            self._add_messages[bookie_id] = self._add_messages.get(bookie_id, 0) + 1

    def _ensure_bookie(self, bookie_id: str) -> None:
        if bookie_id in self._endpoints:
            return
        if bookie_id in self._refusals:
            raise self._refusals[bookie_id]
        info = (self._read_registry() or {}).get(bookie_id)
        if info is None:
            raise BookieUnavailableError(f"bookie {bookie_id} is not registered")
        self._connect(bookie_id, info)

    def _connect(self, bookie_id: str, info: dict, open_now: bool = True) -> None:
        """Driver thread: reach ``bookie_id`` as its registration says (its
        endpoint, its CURVE key checked; with ``open_now`` false only if it
        was reached before); raise why not."""
        from appliance.curve import bookie_server_key

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
                self._add_messages[action[0]] -= 1
                self._on_coalesced(action, event, now)
                continue
            if core is _LAC_MULTI:
                self._on_lac_multi(action, event)
                continue
            if type(action) is tuple:  # an ADD_PACKED's add_head
                self._add_messages[action[1]] -= 1
            if type(action) is ev.SendWriteClose:  # the "core" is its outcome: logged only
                core.done(action.bookie_id, reply_code(event.status, event.reply))
                continue
            for core_event in translate(action, event, now):
                self.feed(core, core_event)

    def _on_coalesced(self, sent: tuple, event, now: int) -> None:
        """An ``ADD_MULTI`` / ``ADD_BATCH`` reply split back into each part's
        ``AddResponses``.  A bookie that answers ``ADD_MULTI`` as a bad
        request (one from before the op: nothing of it was stored) gets the
        parts again as ``ADD_BATCH``, and ``ADD_BATCH`` from then on.  Once a
        bookie has answered ``ADD_MULTI`` the route keeps only the parts'
        ``add_head``s; should it refuse one later (replaced by an older
        version), those parts count as unanswered and the writers' timeouts
        resend them, as ``ADD_BATCH``."""
        bookie_id, cores, parts, multi = sent
        reply = event.reply
        if multi and type(reply) is ErrorReply and reply.status == BadRequestError.code:
            log.info("bookie %s refused ADD_MULTI (%s): sending it ADD_BATCH", bookie_id,
                     reply.message)
            self._multi_refused.add(bookie_id)
            self._multi_ok.discard(bookie_id)
            if type(parts) is list:  # the parts themselves: send them again now
                self._send_multi(bookie_id, cores, parts)
                return
            event = dataclasses.replace(event, status=BKTimeoutError.code, reply=None)
        elif multi and type(reply) is AddMultiReply:
            self._multi_ok.add(bookie_id)
        for core, core_event in coalesced_events(cores, parts, event, now):
            self.feed(core, core_event)

    def _fail(self, core, action, code: int) -> None:
        now = self.now_ms()
        for core_event in failure_events(action, code, now):
            self.feed(core, core_event)

    # -- metadata -----------------------------------------------------------------
    def _metadata_op(self, core, action) -> None:
        """On a pool thread: do the blocking store call, post the result."""
        try:
            if type(action) is ev.WriteMetadata:
                version = self.ledgers.write_ledger(action.metadata, action.expected_version)
                event = ev.MetadataWritten(action.request_id, action.ledger_id, OK, version)
            else:
                md, version = self.ledgers.read_ledger(action.ledger_id)
                event = ev.MetadataRead(action.request_id, action.ledger_id, OK, md, version)
        except Exception as exc:  # every failure becomes a code the core understands
            code = code_of(exc)
            if not isinstance(exc, BKError):
                log.exception("metadata operation failed")
            event = (ev.MetadataWritten(action.request_id, action.ledger_id, code)
                     if type(action) is ev.WriteMetadata
                     else ev.MetadataRead(action.request_id, action.ledger_id, code))
        self._put(("event", core, event))

    def _read_registry(self) -> dict | None:
        try:
            return self.registry.available()
        except BKError as exc:
            log.warning("cannot list bookies: %s", exc)
            return None

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

    def _refresh_in_pool(self) -> None:
        live = self._read_registry()
        if live is not None:
            self._put(("bookies", live))

    # -- the loop -----------------------------------------------------------------
    def _run(self) -> None:
        self.transport.bind_owner()
        next_refresh = self.now_ms() + BOOKIE_REFRESH_MS
        q = self._q
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
            self._flush_adds()
            self._flush_lacs()
            if self.now_ms() >= next_refresh:
                next_refresh = self.now_ms() + BOOKIE_REFRESH_MS
                self._pool.submit(self._refresh_in_pool)

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
        self._pool.shutdown(wait=True)
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
