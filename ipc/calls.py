"""Synchronous request/reply over a ``Transport``, for callers that ask a
bookie something and wait for the answer (the re-replicator's copies, the
supervisor's and the auditor's probes).

Everything about the conversation itself (a deadline on every request,
CURVE, heartbeats, reconnects, exactly one event per request) is the
transport's (``ipc.client``); this module adds only the waiting.

Guarantees: ``Calls.wait`` returns the one event of its request, by the
request's deadline (the transport's); an outer deadline of twice that only
guards against a transport bug (``BKTimeoutError``).  Events of other
requests that arrive meanwhile are kept until asked for; a fired request's
callback runs on a later wait or ``drain_fired``, never concurrently.
``call_once`` never hangs and never leaks a socket or a thread: its
transport runs on the caller's thread and is closed on every path.
Not thread-safe: one ``Calls`` per thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import zmq

from appliance.protocol.errors import BKError, BKTimeoutError, BookieUnavailableError
from ipc.client import Event, Transport
from ipc.curve import KeyPair


class Calls:
    """Request/reply over one ``Transport`` that has no ``on_events``
    callback (events of other requests are kept until asked for)."""

    def __init__(self, transport: Transport, timeout_ms: int):
        self.transport = transport
        self.timeout_ms = timeout_ms
        self._done: dict[int, Event] = {}
        self._fired: dict[int, Callable[[Event], object]] = {}  # never waited for

    def send(self, bookie_id: str, request) -> int:
        """Send ``request``; its request id, for ``wait``."""
        return self.transport.send(bookie_id, request, self.timeout_ms)

    def wait(self, rid: int) -> Event:
        """The event of request ``rid`` (its reply, or its failure)."""
        deadline_s = time.monotonic() + 2 * self.timeout_ms / 1000.0
        while rid not in self._done:
            if time.monotonic() > deadline_s:
                raise BKTimeoutError(f"request {rid} got no event")
            self._take(self.transport.next_events(self.timeout_ms))
        return self._done.pop(rid)

    def call(self, bookie_id: str, request) -> Event:
        """``send`` and ``wait``."""
        return self.wait(self.send(bookie_id, request))

    def fire(self, bookie_id: str, request, on_event: Callable[[Event], object]) -> None:
        """Send without waiting: ``on_event(event)`` runs when a later wait
        (or ``drain_fired``) sees its reply.  A send that fails is an event too."""
        try:
            rid = self.transport.send(bookie_id, request, self.timeout_ms)
        except (BKError, ValueError) as exc:
            on_event(Event(bookie_id, 0, int(request.OP),
                           getattr(exc, "code", BookieUnavailableError.code)))
            return
        self._fired[rid] = on_event

    def drain_fired(self, wait_ms: int) -> None:
        """Let fired requests' replies arrive for at most ``wait_ms``."""
        deadline_s = time.monotonic() + wait_ms / 1000.0
        while self._fired and time.monotonic() < deadline_s:
            self._take(self.transport.next_events(
                max(1, int((deadline_s - time.monotonic()) * 1000))))

    def _take(self, events) -> None:
        for event in events:
            callback = self._fired.pop(event.request_id, None)
            if callback is not None:
                callback(event)
            else:
                self._done[event.request_id] = event


def call_once(endpoint: str, request, timeout_ms: int, *, context: zmq.Context | None = None,
              curve_keys: KeyPair | None = None, server_key: bytes | None = None) -> Event:
    """Ask the bookie at ``endpoint`` one thing over a transport of its own,
    run on the calling thread (no I/O thread) and closed before returning;
    over CURVE when ``curve_keys`` and ``server_key`` are given and the
    endpoint is tcp.  The event says what happened: ``event.reply`` is None
    when no reply came (a timeout, a refused handshake, a reply that did
    not decode).  ``zmq.ZMQError`` for an endpoint ZeroMQ cannot use."""
    events: list[Event] = []
    transport = Transport(context=context or zmq.Context.instance(), curve_keys=curve_keys,
                          inflight_per_bookie_max=1, io_thread=False, on_events=events.extend)
    try:
        transport.bind_owner()
        transport.add_bookie("probed", endpoint, server_key)
        transport.send("probed", request, timeout_ms)
        deadline_s = time.monotonic() + 2 * timeout_ms / 1000.0  # guards a transport bug
        while not events:
            if time.monotonic() > deadline_s:
                raise BKTimeoutError(f"{endpoint}: request got no event")
            transport.step(timeout_ms)
        return events[0]
    finally:
        transport.close()
