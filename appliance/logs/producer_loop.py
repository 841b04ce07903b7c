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

from ipc.wake import WakePipe

log = logging.getLogger("appliance.logs")

POLL_MS = 50  # every producer is stepped at least this often (timeouts, deadlines)


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
            self._producers |= ready
            if now >= tick:  # everyone: the ones nothing woke only checked
                for producer in self._producers - ready:
                    self._step(producer, tick=True)
                tick = now + POLL_MS / 1000
            for producer in ready:
                self._step(producer)

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
