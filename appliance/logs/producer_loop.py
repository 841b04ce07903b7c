"""One I/O thread for every producer of a process (``appliance.logs.producer``).

A process with a thousand producers (one per log it writes) has one thread
doing their background work, not a thousand: it receives the replies of
pipelined writes, connects, follows redirects, resends after a pause, and
checks each producer's timeouts and deadlines every ``POLL_MS``.

Guarantees:

* A producer's background step (``Producer._turn``) runs on this thread
  only, holding the producer's ``_io_lock`` as before; its socket is
  created and closed here only, so the descriptors this thread polls are
  never closed under it (a socket is unwatched before it closes).
* A producer is stepped when its socket is readable (unless a blocking
  write of its own is receiving: it leaves that socket alone), when it is
  woken (``wake``), at the time it asked for (``call_at``: a backoff); and
  visited every ``POLL_MS`` whatever happened (``Producer._turn(tick)``:
  its timeout and deadline checked, its socket looked at).
* A producer whose step says it is finished (closed with nothing pending,
  or failed) is finished (``Producer._finish``) and forgotten; an exception
  from a step fails that producer only.
* Multi-log requests: while the process has ``MUX_PRODUCERS_MIN`` or more
  producers, a producer that connects shares one connection per log
  server with the process's other producers (a ``Channel``: one DEALER
  socket, this thread's only).  Its requests are sections that this
  thread sends together, one MUX message per server per turn
  (``appliance.protocol.log_service.encode_mux``); the server's
  MUX_REPLYs are split and each answer handed to its producer (by log
  and producer id), which reads it as from a socket of its own
  (``MuxSocket``): deduplication, order, redirects, timeouts and resends
  stay the producer's, as before.  A producer alone in its process keeps
  a socket of its own (its blocking writes send and receive on their own
  thread: no hand-off).
* Fork: a child process gets a loop of its own on first use.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
import os
import select
import threading
import time

import zmq

from appliance.errors import BKError
from appliance.protocol import limits
from appliance.protocol.log_service import (
    MUX_REPLY_KIND,
    decode_mux_reply,
    encode_mux,
    mux_groups,
)
from ipc.wake import WakePipe

log = logging.getLogger("appliance.logs")

POLL_MS = 50  # every producer is stepped at least this often (timeouts, deadlines)
# a producer that connects while the process has at least this many shares a
# connection per log server (multi-log requests); fewer: a socket of its own
MUX_PRODUCERS_MIN = 2
_EVENTS, _POLLIN, _NOBLOCK = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.NOBLOCK)


class MuxSocket:
    """A producer's view of its ``Channel``: what ``Producer`` uses as its
    socket.  ``send`` queues a request as a section of the channel's next
    message; the answers routed to this producer wait in ``inbox``."""

    __slots__ = ("channel", "key", "inbox", "linger")

    def __init__(self, channel: Channel, key: tuple):
        self.channel, self.key = channel, key
        self.inbox: collections.deque = collections.deque()
        self.linger = 0

    def send(self, frame: bytes, flags: int = 0, copy: bool = True) -> None:
        self.channel.queue(frame)

    def getsockopt(self, option: int) -> int:
        """EVENTS (an answer waits), or RCVMORE (never: an answer is one frame)."""
        return _POLLIN if option == _EVENTS and self.inbox else 0

    def recv(self, flags: int = 0) -> bytes:
        return self.inbox.popleft()

    def close(self, linger: int | None = None) -> None:
        self.channel.leave(self)


class Channel:
    """One log server's connection, shared by the process's producers that
    write to it (see the module docstring)."""

    def __init__(self, loop: ProducerLoop, endpoint: str):
        self.loop, self.endpoint = loop, endpoint
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.linger = 0
        self.sock.connect(endpoint)
        self.fd = self.sock.getsockopt(zmq.FD)
        self.members: dict[tuple, MuxSocket] = {}  # (log name UTF-8, pid) -> its view
        self.producers: dict[tuple, object] = {}
        self.outbox: collections.deque = collections.deque()
        self.flagged = False  # the loop is told to send the outbox
        self.stats = {"messages": 0, "sections": 0, "replies": 0}

    # -- any thread (a producer holding its _io_lock) ---------------------------------
    def queue(self, frame: bytes) -> None:
        self.outbox.append(frame)
        if not self.flagged:
            self.flagged = True
            self.loop.wake(self)

    # -- the loop's thread --------------------------------------------------------------
    def join(self, producer) -> MuxSocket:
        key = (producer._name_bytes, producer.id)
        view = self.members[key] = MuxSocket(self, key)
        self.producers[key] = producer
        return view

    def leave(self, view: MuxSocket) -> None:
        if self.members.get(view.key) is view:
            del self.members[view.key]
            del self.producers[view.key]
        if not self.members:
            self.loop._close_channel(self)

    def flush(self) -> None:
        """Send what the producers queued: one message (more past the bounds)."""
        self.flagged = False  # before reading: a request queued from now on flags again
        outbox, queued = self.outbox, []
        while outbox:  # popped one by one: producers may append meanwhile
            queued.append(outbox.popleft())
        for sections in mux_groups(queued, limits.LOG_SERVICE_MUX_SECTIONS_MAX,
                                   limits.LOG_SERVICE_MUX_BYTES_MAX // 2):  # room for framing
            size = sum(map(len, sections))
            if self.sock is None:
                continue  # closed: the producers resend after their timeout
            try:
                self.sock.send(encode_mux(sections), _NOBLOCK, copy=size < 65_536)
            except zmq.ZMQError:
                pass  # not sent: the producers resend after their timeout
            self.stats["messages"] += 1
            self.stats["sections"] += len(sections)
            self.loop.stats["mux_messages"] += 1
            self.loop.stats["mux_sections"] += len(sections)

    def receive(self) -> None:
        """Hand every answer that arrived to its producer (then step it)."""
        sock, wake = self.sock, self.loop._woken_here
        while sock is not None and sock.getsockopt(_EVENTS) & _POLLIN:
            frame = sock.recv_multipart(_NOBLOCK)[0]
            if frame[:1] != bytes([MUX_REPLY_KIND]):
                log.warning("log server %s refused a multi-log request: %r", self.endpoint,
                            frame[:200])
                continue  # a malformed message: its producers resend after their timeout
            try:
                answers = decode_mux_reply(frame, limits.LOG_SERVICE_MUX_SECTIONS_MAX,
                                           limits.LOG_SERVICE_MUX_BYTES_MAX)
            except BKError as exc:
                log.warning("log server %s: %s", self.endpoint, exc)
                continue
            self.stats["replies"] += 1
            for name, pid, reply in answers:
                key = (name, pid)
                view = self.members.get(key)
                if view is not None:  # else the producer left: it resent or finished
                    view.inbox.append(reply)
                    wake.add(self.producers[key])

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close(linger=0)
            self.sock = None


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
        self._poll = select.epoll()
        self._wakeup = WakePipe()
        self._poll.register(self._wakeup.fd, select.EPOLLIN)
        self._lock = threading.Lock()
        self._woken: collections.deque = collections.deque()
        self._signalled = False  # a wake byte is on its way for _woken
        self._timers: list = []  # (when, n, producer), under _lock
        self._order = itertools.count()
        self._producers: set = set()  # this thread only (added through _woken)
        self._by_fd: dict[int, object] = {}
        self._watched: dict[object, int] = {}
        self._channels: dict[str, Channel] = {}  # endpoint -> the shared connection
        self._woken_here: set = set()  # producers a channel's answers are for (this thread)
        # multi-log messages sent and the requests (sections) they carried, over every channel
        self.stats = {"mux_messages": 0, "mux_sections": 0}
        self._thread = threading.Thread(target=self._run, name="producers-io", daemon=True)
        self._thread.start()

    # -- any thread --------------------------------------------------------------------
    def wake(self, producer) -> None:
        """Step ``producer`` soon (it joins the loop on its first wake)."""
        with self._lock:
            self._woken.append(producer)
            signalled, self._signalled = self._signalled, True
        if not signalled:
            self._wakeup.wake()

    def call_at(self, producer, when: float) -> None:
        """Step ``producer`` at ``when`` (``time.monotonic``)."""
        with self._lock:
            heapq.heappush(self._timers, (when, next(self._order), producer))
        self.wake(producer)  # the loop recomputes its wait

    # -- the loop's thread -------------------------------------------------------------
    def mux_socket(self, producer, endpoint: str) -> MuxSocket | None:
        """A connecting producer's view of the shared connection to
        ``endpoint``, or None: it has a socket of its own (fewer than
        ``MUX_PRODUCERS_MIN`` producers in the process)."""
        if len(self._producers) < MUX_PRODUCERS_MIN:
            return None
        channel = self._channels.get(endpoint)
        if channel is None:
            channel = self._channels[endpoint] = Channel(self, endpoint)
            self._poll.register(channel.fd, select.EPOLLIN)
            self._by_fd[channel.fd] = channel
        return channel.join(producer)

    def _close_channel(self, channel: Channel) -> None:
        if self._channels.get(channel.endpoint) is channel:
            del self._channels[channel.endpoint]
        channel.flush()  # whatever its last members queued (they have left: no answer)
        if channel.sock is not None:
            self._by_fd.pop(channel.fd, None)
            self._poll.unregister(channel.fd)
            channel.close()

    def unwatch(self, producer) -> None:
        """Stop polling ``producer``'s socket (before it is closed)."""
        fd = self._watched.pop(producer, None)
        if fd is not None:
            self._by_fd.pop(fd, None)
            self._poll.unregister(fd)

    def _watch(self, producer, fd: int | None) -> None:
        if self._watched.get(producer) == fd:
            return
        self.unwatch(producer)
        if fd is not None:
            self._poll.register(fd, select.EPOLLIN)
            self._by_fd[fd] = producer
            self._watched[producer] = fd

    def _run(self) -> None:
        tick = 0.0
        while True:
            now = time.monotonic()
            with self._lock:
                due = self._timers[0][0] if self._timers else tick
            wait = max(0.0, min(tick, due) - now)
            events = self._poll.poll(wait)
            ready = {self._by_fd.get(fd) for fd, _ in events}
            if any(fd == self._wakeup.fd for fd, _ in events):
                self._wakeup.drain()  # not on a socket's turn: a read for nothing
            now = time.monotonic()
            with self._lock:
                self._signalled = False
                ready.update(self._woken)
                self._woken.clear()
                while self._timers and self._timers[0][0] <= now:
                    ready.add(heapq.heappop(self._timers)[2])
            ready.discard(None)
            channels = [c for c in ready if type(c) is Channel]
            if channels:
                ready.difference_update(channels)
                woken = self._woken_here
                for channel in channels:
                    channel.receive()  # also when only flagged: its descriptor is edge-triggered
                ready |= woken
                woken.clear()
            self._producers |= ready
            if now >= tick:  # everyone: the ones nothing woke only checked
                for producer in self._producers - ready:
                    self._step(producer, tick=True)
                tick = now + POLL_MS / 1000
            for producer in ready:
                self._step(producer)
            for channel in list(self._channels.values()):
                # flagged and empty: a request queued as the last flush took it
                # (the flag must not stay up, or later requests would not wake us)
                if channel.outbox or channel.flagged:
                    channel.flush()
                    channel.receive()  # re-arm the edge-triggered descriptor
                    if self._woken_here:
                        with self._lock:
                            self._woken.extend(self._woken_here)
                        self._woken_here.clear()
                        self._wakeup.wake()

    def _step(self, producer, tick: bool = False) -> None:
        try:
            finished = producer._turn(tick)
        except Exception as exc:  # noqa: BLE001 - fails that producer only
            log.exception("producer of log %s failed", producer.name)
            producer._fail_unexpected(exc)
            finished = True
        if finished:
            self.unwatch(producer)
            self._producers.discard(producer)
            producer._finish()
        else:
            self._watch(producer, producer._watched_fd())
