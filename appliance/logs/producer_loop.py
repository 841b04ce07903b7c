"""One thread drives every producer of a process: the producer I/O thread
(``ProducerLoop``; producers in ``appliance.logs.producer``).

A process with a thousand producers (one per log it writes) has one thread
doing their work, not a thousand.  It alone drives each producer's core
(``appliance.protocol.log_producer.ProducerCore``) and alone touches the
sockets (``appliance.logs.producer_io.Channel``: one per log server).

Guarantees:

* Writing threads only hand their writes in (``submit``: one list append
  under a lock, and one wake of the thread only if it is not awake) and
  wait on the writes' futures; every turn of the thread takes everything
  handed in, feeds it to the cores, and sends what they make, one message
  per log server per turn.
* Each core is stepped when a write or a command for it is handed in, when
  a reply for it arrives, at the time it asked for (``WakeAt``: a
  back-off), and every ``POLL_MS`` whatever happened (``Tick``: its request
  timeout and deadline), and when the log server it writes to is known
  gone (``ServerGone``: each channel watches its server's registration,
  ``appliance.logs.server_watch``).  Its actions are carried out here: requests sent,
  the owner looked up in the metadata store (``Producer._find_owner``),
  futures settled or failed (and the producer's window given back).
* A producer whose core is done (closed with nothing pending, or failed)
  is let go (``Producer._finished``); an exception while stepping fails
  that producer only.
* Fork: a child process gets a loop of its own on first use.

Threads: ``_inbox`` and ``_awake`` are guarded by ``_lock`` (any thread
appends, this thread takes); every other field, the cores and the channels
are this thread's only.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import select
import threading
import time
from concurrent.futures import Future

from appliance.errors import BKError, LogServiceUnavailableError, UnauthorizedError
from appliance.logs.producer_io import Channel
from appliance.logs.server_watch import ServerWatch
from appliance.protocol import log_producer as lp
from ipc.wake import WakePipe

log = logging.getLogger("appliance.logs")

POLL_MS = 50  # every producer's core is ticked at least this often (timeouts, deadlines)
OPEN, CLOSE, STATS, GONE = "open", "close", "stats", "gone"  # commands (a write's: its seq)


class ProducerLoop:
    _instance: ProducerLoop | None = None
    _instance_lock = threading.Lock()

    @classmethod
    def get(cls) -> ProducerLoop:
        """The process's loop (started on first use, again after a fork)."""
        with cls._instance_lock:
            loop = cls._instance
            if loop is None or loop._pid != os.getpid():
                loop = cls._instance = cls()
            return loop

    def __init__(self):
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._inbox: list = []  # (producer, payload, future, seq or command), under _lock
        self._awake = True  # the thread looks at _inbox before it sleeps, under _lock
        self._wakeup = WakePipe()
        self._poll = select.epoll()
        self._poll.register(self._wakeup.fd, select.EPOLLIN)
        self._producers: dict[tuple, object] = {}  # (log name UTF-8, pid) -> producer
        self._channels: dict[str, Channel] = {}  # endpoint -> the connection
        self._by_fd: dict[int, Channel] = {}
        self._monitors: dict[int, Channel] = {}  # a CURVE channel's monitor fd -> it
        self._joined: dict[object, Channel] = {}  # producer -> the channel it writes through
        self._timers: list = []  # (when, n, producer)
        self._order = itertools.count()
        self._touched: set = set()  # producers to pump this turn
        self._dirty: list = []  # channels with requests queued this turn
        self._readable: list = []  # channels with a reply waiting (seen after a send)
        self.stats = {"turns": 0, "ticks": 0, "wakes": 0, "messages": 0, "mux_messages": 0,
                      "servers_gone": 0,
                      "mux_sections": 0}
        self._thread = threading.Thread(target=self._run, name="producers-io", daemon=True)
        self._thread.start()

    # -- any thread ------------------------------------------------------------------------
    def submit(self, item: tuple) -> None:
        """Hand ``item`` to the thread; wake it only if it is asleep."""
        with self._lock:
            self._inbox.append(item)
            if self._awake:
                return
            self._awake = True
        self._wakeup.wake()

    def server_gone(self, endpoint: str) -> None:
        """The log server at ``endpoint`` died or was replaced (called on the
        server watch's thread: ``appliance.logs.server_watch``)."""
        self.submit((None, None, endpoint, GONE))

    def snapshot(self) -> dict:
        """The loop's counters (turns, ticks, wakes, messages, multi-log
        messages and their sections), read on its thread."""
        fut: Future = Future()
        self.submit((None, None, fut, STATS))
        return fut.result(timeout=10)

    # -- the loop's thread -----------------------------------------------------------------
    def _run(self) -> None:
        tick = 0.0
        while True:
            with self._lock:
                items, self._inbox = self._inbox, []
                if not items and not self._readable:
                    self._awake = False
            ready, self._readable = self._readable, []
            if not items and not ready:
                due = self._timers[0][0] if self._timers else tick
                for fd, _ in self._poll.poll(max(0.0, min(tick, due) - time.monotonic())):
                    channel = self._by_fd.get(fd)
                    if channel is not None:
                        ready.append(channel)
                    elif fd in self._monitors:
                        self._check_refused(self._monitors[fd])
                    else:
                        self._drain_wakeup()
                with self._lock:
                    self._awake = True
                    items, self._inbox = self._inbox, []
            self.stats["turns"] += 1
            for channel in ready:
                self._receive(channel)
            if items:
                self._take_all(items)
            now = time.monotonic()
            while self._timers and self._timers[0][0] <= now:
                self._touched.add(heapq.heappop(self._timers)[2])
            if now >= tick:
                self._tick()
                tick = now + POLL_MS / 1000
            if self._touched:
                self._pump_touched()
            if self._dirty:
                self._flush()

    def _drain_wakeup(self) -> None:
        """One read takes every wake byte written (a wake is written only
        while ``_awake`` is False: one, or a few)."""
        self.stats["wakes"] += 1
        try:
            os.read(self._wakeup.fd, 4096)
        except BlockingIOError:
            pass

    def _tick(self) -> None:
        """Every core's timeout and deadline; the channels' sockets looked at
        (nothing is missed if a wake-up was: it costs little to be sure)."""
        self.stats["ticks"] += 1
        for producer in list(self._producers.values()):
            self._step(producer, lp.Tick)
        for channel in list(self._channels.values()):
            self._receive(channel)
            if channel.monitor is not None:  # its descriptor is edge-triggered: look anyway
                self._check_refused(channel)

    def _receive(self, channel: Channel) -> None:
        if channel.sock is None:
            return  # closed this turn
        for route, frame in channel.receive():
            producer = channel.plain if route is None else self._producers.get(route)
            if producer is None or self._producers.get(producer._key) is not producer:
                continue  # the producer let go: it finished
            self._step(producer, lp.Reply, frame)

    def _take_all(self, items: list) -> None:
        """Writes handed in go to their cores (the time read once per run of
        one producer's writes); commands one by one."""
        last = core = None
        now_ms = 0
        touched = self._touched
        for item in items:
            producer, payload, fut, seq = item
            if payload is None:
                self._take(item)
                last = None
                continue
            if producer is not last:
                last, core, now_ms = producer, producer._core, producer._now_ms()
                touched.add(producer)
            core.write(payload, fut, seq, now_ms)

    def _take(self, item: tuple) -> None:
        producer, payload, fut, what = item
        if producer is None and what == GONE:  # (fut: the server's endpoint)
            self._server_gone(fut)
            return
        if producer is None:  # the loop's counters (snapshot)
            fut.set_result(dict(self.stats))
            return
        core = producer._core
        if what == OPEN:
            self._producers[producer._key] = producer
            self._touched.add(producer)
        elif what == CLOSE:
            core.close()
            self._touched.add(producer)
        elif what == STATS:
            fut.set_result(dict(core.stats))

    def _step(self, producer, event_type, frame: bytes | None = None) -> None:
        """``producer``'s core handles one event (its actions carried out)."""
        core = producer._core
        try:
            now_ms = producer._now_ms()
            event = event_type(frame, now_ms) if frame is not None else event_type(now_ms)
            self._carry_out(producer, core.handle(event))  # (handle pumps)
        except Exception as exc:  # noqa: BLE001 - fails that producer only
            self._broken(producer, exc)
        if core.done():
            self._touched.add(producer)  # let go at the end of the turn

    def _pump_touched(self) -> None:
        touched, self._touched = self._touched, set()
        for producer in touched:
            try:
                self._carry_out(producer, producer._core.pump(producer._now_ms()))
            except Exception as exc:  # noqa: BLE001 - fails that producer only
                self._broken(producer, exc)
            if producer._core.done() and self._producers.get(producer._key) is producer:
                self._let_go(producer)

    def _carry_out(self, producer, actions: list) -> None:
        for action in actions:
            kind = type(action)
            if kind is lp.Send:
                channel = self._channel(producer, action.endpoint)
                if channel is not None:
                    channel.queue(producer, action.frame, action.payload_bytes)
            elif kind is lp.Settle:
                producer._settled(action.done, None, action.payload_bytes)
            elif kind is lp.Fail:
                producer._settled(action.done, action.error, action.payload_bytes)
            elif kind is lp.WakeAt:
                delay_s = max(0, action.at_ms - producer._now_ms()) / 1000
                heapq.heappush(self._timers, (time.monotonic() + delay_s, next(self._order),
                                              producer))
            elif kind is lp.FindOwner:
                self._carry_out(producer, producer._core.handle(
                    lp.OwnerFound(self._find_owner(producer), producer._now_ms())))

    def _find_owner(self, producer) -> str | None:
        try:
            return producer._find_owner()
        except BKError as exc:
            log.info("log %s: finding its owner: %s", producer.name, exc)
            return None

    def _broken(self, producer, exc: BaseException) -> None:
        log.exception("producer of log %s failed", producer.name)
        core = producer._core
        if core.error is None:
            core._fail(exc if isinstance(exc, BKError) else
                       LogServiceUnavailableError(f"log {producer.name!r}: {exc}"))
            for action in core.take_actions():
                if type(action) is lp.Fail:
                    producer._settled(action.done, action.error, action.payload_bytes)

    def _check_refused(self, channel: Channel) -> None:
        """A CURVE channel's monitor spoke: if the server refused this
        client's handshake, every producer writing there fails with
        ``UnauthorizedError`` naming it (ZeroMQ would not retry)."""
        why = channel.refused() if channel.sock is not None else None
        if why is None:
            return
        log.warning("%s", why)
        for producer in list(channel.members):  # closed first, as for a server gone
            self._joined.pop(producer, None)
        channel.members.clear()
        self._close_channel(channel)
        for producer in list(self._producers.values()):
            if producer._core.endpoint == channel.endpoint:
                self._step(producer, lp.Refused, UnauthorizedError(why))

    def _server_gone(self, endpoint: str) -> None:
        """The channel is closed (the next one to it watches the new
        registration), then every core writing to ``endpoint`` finds the owner
        again now: what it resends (perhaps to a new server at the same
        endpoint) goes through a new channel, never the closed one."""
        self.stats["servers_gone"] += 1
        channel = self._channels.get(endpoint)
        if channel is not None:
            for producer in list(channel.members):
                self._joined.pop(producer, None)
            channel.members.clear()
            self._close_channel(channel)
        for producer in list(self._producers.values()):
            if producer._core.endpoint == endpoint:
                self._step(producer, lp.ServerGone, endpoint)

    def _channel(self, producer, endpoint: str) -> Channel:
        """The channel to ``endpoint`` (made on first use, watching its
        server's registration); ``producer`` writes through it, and this
        turn it has a request to send."""
        channel = self._channels.get(endpoint)
        if channel is None:
            try:
                server_key, server_id = producer._server_route(endpoint)
            except BKError as exc:  # refused before connecting (no key, or not trusted)
                self._step(producer, lp.Refused, exc)
                return None
            channel = self._channels[endpoint] = Channel(endpoint, self.stats, producer._curve,
                                                         server_key, server_id)
            self._poll.register(channel.fd, select.EPOLLIN)
            self._by_fd[channel.fd] = channel
            if channel.monitor_fd is not None:
                self._poll.register(channel.monitor_fd, select.EPOLLIN)
                self._monitors[channel.monitor_fd] = channel
            channel.watch = ServerWatch.of(producer._registry.store).subscribe(
                endpoint, lambda: self.server_gone(endpoint))
        old = self._joined.get(producer)
        if old is not channel:
            if old is not None:
                self._leave(producer, old)
            channel.members.add(producer)
            self._joined[producer] = channel
        if not channel.outbox:
            self._dirty.append(channel)
        return channel

    def _leave(self, producer, channel: Channel) -> None:
        channel.members.discard(producer)
        if not channel.members:
            self._dirty.append(channel)  # closed once its last requests left

    def _flush(self) -> None:
        """Send what this turn queued (one message per channel), then close
        the channels nobody uses."""
        dirty, self._dirty = self._dirty, []
        for channel in dirty:
            if channel.outbox and channel.sock is None:
                channel.outbox = []  # closed this turn (its server gone): resent after a lookup
            if channel.outbox:
                channel.flush()
                if channel.readable():  # a reply came meanwhile: its wake-up was taken
                    self._readable.append(channel)
            if not channel.members and channel.sock is not None and \
                    self._channels.get(channel.endpoint) is channel:
                self._close_channel(channel)

    def _close_channel(self, channel: Channel) -> None:
        del self._channels[channel.endpoint]
        del self._by_fd[channel.fd]
        self._poll.unregister(channel.fd)
        if channel.monitor_fd is not None:
            del self._monitors[channel.monitor_fd]
            self._poll.unregister(channel.monitor_fd)
        if channel.watch is not None:
            channel.watch.cancel()
        channel.close()

    def _let_go(self, producer) -> None:
        del self._producers[producer._key]
        channel = self._joined.pop(producer, None)
        if channel is not None:
            self._leave(producer, channel)
        producer._finished.set()
