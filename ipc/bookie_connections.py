"""The client side's connection to each bookie: one DEALER socket and its
monitor, owned by the transport's I/O thread (``ipc.client``).

Guarantees and limits:

* reconnect: ZeroMQ reconnects by itself (``reconnect_ivl_ms`` ..
  ``reconnect_ivl_max_ms``).  A socket monitor tracks the connection: on a
  disconnect the bookie's outstanding requests fail at once and its socket
  is replaced, which discards anything still queued in it, so nothing sent
  before the disconnect reaches a restarted bookie later.  Until the
  reconnect completes, requests to that bookie fail fast.  Before the very
  first connection, requests wait in the socket (bounded by their timeout);
  once one of them times out still unconnected, the bookie is treated as
  disconnected (``never_connected``): a host cut off before this client
  ever reached it fails fast too.  With ``heartbeat_timeout_ms``, ZeroMQ
  pings each bookie every quarter of it and a connection that stays silent
  that long counts as a disconnect: a host cut off the network (no RST ever
  arrives) is noticed even by a writer whose other bookies keep its ack
  quorum; and a tcp bookie that sent nothing for that long when a request
  to it times out is disconnected the same way (``silent``: ZeroMQ's
  heartbeat can miss a dead peer while a stream of sends keeps its output
  blocked).
* identities: each DEALER gets ``<identity>-<n>`` (n counts sockets), so a
  replacement socket never collides with a route the bookie still holds;
* CURVE (``ipc.curve``): given ``curve_keys``, a bookie added with a
  ``server_key`` on a tcp endpoint is reached over CURVE (encrypted; its
  key verified; ours presented).  Such a connection counts as up only once
  its handshake succeeded.  A handshake the bookie refuses (our key is not
  authorized, or it wants CURVE and we have no key) fails the bookie's
  outstanding requests with ``UnauthorizedError`` and so does every request
  until a retry: ZeroMQ does not reconnect after a refused handshake, so a
  send at least ``reconnect_ivl_max_ms`` after the refusal opens a fresh
  socket and tries once more (at most one handshake per bookie per
  interval).  ``Transport.refused_bookies()`` names the bookies refusing us.

The connections own the sockets and their states; the requests waiting on
them belong to the request table (``ipc.request_table``), which this module
asks to fail a bookie's requests when its connection goes.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable

import zmq

from appliance.protocol.errors import BookieUnavailableError, UnauthorizedError
from ipc.curve import configure_client, is_tcp

log = logging.getLogger("ipc.client")  # the transport's logger, as before the split

_MONITOR_EVENTS = (zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED
                   | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)
_REFUSED_EVENTS = zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL

_MONITOR_HEAD = struct.Struct("=Hi")  # zmq_socket_monitor: event (16 bits), value (32 bits)


def _monitor_event(frames: list[bytes]) -> int:
    """The event number of a socket monitor message (its first frame; the
    second names the endpoint).  ``zmq.utils.monitor`` would do the same,
    but importing it imports asyncio: thousands of objects more in every
    client's heap for every full garbage collection to scan."""
    return _MONITOR_HEAD.unpack_from(frames[0])[0]


class BookieConnection:
    """One bookie's socket, its monitor and the connection's state."""

    __slots__ = ("bookie_id", "endpoint", "server_key", "sock", "monitor", "state", "retry_at_s",
                 "heard_s", "fds")

    def __init__(self, bookie_id: str, endpoint: str, server_key: bytes | None = None):
        self.bookie_id = bookie_id
        self.endpoint = endpoint
        self.server_key = server_key  # CURVE: the bookie's public key (tcp only)
        self.sock = None
        self.monitor = None
        self.state = "connecting"  # -> up <-> down; -> refused (CURVE) -> connecting
        self.retry_at_s = 0.0
        self.heard_s = 0.0  # when a frame last arrived from it (or it connected)
        self.fds = ()  # the loop's: the descriptors it waits on for sock and monitor


class BookieConnections:
    """The I/O thread's connections, by bookie id (``conns``): socket set-up
    (identity, limits, heartbeats, CURVE), the monitor's events, refusals,
    disconnects and replacement sockets.  ``fail_pending(bookie_id, status)``
    fails a bookie's outstanding requests (the request table's)."""

    def __init__(self, t, watcher, fail_pending: Callable[[str | None, int], None]):
        self.t = t  # the Transport: its options, counters and shared state
        self.watcher = watcher  # the loop's: watch(conn) / unwatch(conn) its descriptors
        self.fail_pending = fail_pending
        self.conns: dict[str, BookieConnection] = {}
        self.sockets_opened = 0

    def add(self, bookie_id: str, endpoint: str, server_key: bytes | None = None) -> None:
        old = self.conns.get(bookie_id)
        if self.t.curve_keys is None or not is_tcp(endpoint):
            server_key = None  # ipc keeps filesystem permissions; no keys: plain
        if old is not None:
            if (old.endpoint, old.server_key) == (endpoint, server_key):
                return
            self.remove(bookie_id)
        conn = BookieConnection(bookie_id, endpoint, server_key)
        self.open_socket(conn)
        self.conns[bookie_id] = conn

    def open_socket(self, conn: BookieConnection) -> None:
        t = self.t
        sock = t._ctx.socket(zmq.DEALER)
        self.sockets_opened += 1  # unique per socket: a replacement never collides
        sock.setsockopt(zmq.IDENTITY, b"%s-%d" % (t.identity, self.sockets_opened))
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, t.inflight_per_bookie_max + 16)
        sock.setsockopt(zmq.RCVHWM, 0)  # replies are bounded by in-flight requests
        sock.setsockopt(zmq.RECONNECT_IVL, t._reconnect[0])
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, t._reconnect[1])
        sock.setsockopt(zmq.MAXMSGSIZE, t.limits.frame_bytes_max + 4096)
        if t._heartbeat_timeout_ms > 0:  # a peer silent this long is disconnected
            sock.setsockopt(zmq.HEARTBEAT_IVL, max(1, t._heartbeat_timeout_ms // 4))
            sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, t._heartbeat_timeout_ms)
            sock.setsockopt(zmq.HEARTBEAT_TTL, t._heartbeat_timeout_ms)
        if conn.server_key is not None:
            configure_client(sock, t.curve_keys, conn.server_key)
        monitor = sock.get_monitor_socket(_MONITOR_EVENTS)
        try:
            sock.connect(conn.endpoint)
        except zmq.ZMQError:  # an endpoint ZeroMQ cannot use: leak no socket
            sock.disable_monitor()
            monitor.close(linger=0)
            sock.close(linger=0)
            raise
        conn.sock, conn.monitor = sock, monitor
        self.watcher.watch(conn)

    def close_conn(self, conn: BookieConnection) -> None:
        if conn.sock is None:
            return
        self.watcher.unwatch(conn)
        conn.sock.disable_monitor()
        conn.monitor.close(linger=0)
        conn.sock.close(linger=0)
        conn.sock = conn.monitor = None

    def remove(self, bookie_id: str) -> None:
        conn = self.conns.pop(bookie_id, None)
        if conn is not None:
            self.close_conn(conn)
        self._set_connected(bookie_id, False)
        self._set_refused(bookie_id, None)
        self.fail_pending(bookie_id, BookieUnavailableError.code)

    def on_monitor(self, conn: BookieConnection) -> None:
        # CURVE: connected means handshake done; plain: the TCP/ipc connect
        up_event = zmq.EVENT_HANDSHAKE_SUCCEEDED if conn.server_key else zmq.EVENT_CONNECTED
        while conn.monitor is not None and conn.monitor.poll(0):
            event = _monitor_event(conn.monitor.recv_multipart())
            if event == up_event:
                conn.state = "up"
                conn.heard_s = self.t.clock()
                self._set_connected(conn.bookie_id, True)
                self._set_refused(conn.bookie_id, None)
            elif event & _REFUSED_EVENTS:
                self._on_refused(conn, event == zmq.EVENT_HANDSHAKE_FAILED_AUTH)
            elif event == zmq.EVENT_DISCONNECTED and conn.state == "up":
                self.on_disconnect(conn)

    def _on_refused(self, conn: BookieConnection, by_zap: bool) -> None:
        """The bookie refused our handshake: ZeroMQ will not reconnect, so the
        socket is closed (dropping its queue) and reopened on a later send."""
        self.t.counters["handshakes_refused"] += 1
        if by_zap:
            why = (f"bookie {conn.bookie_id} ({conn.endpoint}) refused this client's CURVE "
                   f"key {self.t.curve_keys.public.decode()}: it is not in the bookie's "
                   f"[security] authorized_keys_dir")
        elif conn.server_key is None:
            why = (f"bookie {conn.bookie_id} ({conn.endpoint}) refused the handshake: it "
                   f"requires CURVE and this client has no key (set [security] curve = true "
                   f"and key_file, or connect(..., curve_key_file=...))")
        else:
            why = (f"bookie {conn.bookie_id} ({conn.endpoint}) failed the CURVE handshake "
                   f"(protocol error): its published server key may be stale")
        was_up = conn.state == "up"
        conn.state = "refused"
        conn.retry_at_s = self.t.clock() + self.t._reconnect[1] / 1000.0
        self._set_refused(conn.bookie_id, why)
        if was_up:
            self._set_connected(conn.bookie_id, False)
        self.fail_pending(conn.bookie_id, UnauthorizedError.code)
        self.close_conn(conn)

    def retry_refused(self, conn: BookieConnection) -> bool:
        """A send to a bookie that refused us: False until the retry interval
        passed; then a fresh socket tries the handshake again (once per
        interval) and the send goes ahead."""
        if self.t.clock() < conn.retry_at_s:
            return False
        conn.state = "connecting"
        self.open_socket(conn)
        return True

    def _set_refused(self, bookie_id: str, why: str | None) -> None:
        with self.t._cond:
            if why is None:
                self.t._refused.pop(bookie_id, None)
            else:
                if bookie_id not in self.t._refused:
                    log.warning("%s", why)
                self.t._refused[bookie_id] = why

    def on_disconnect(self, conn: BookieConnection, counter: str = "disconnects") -> None:
        """Fail what was outstanding and replace the socket, dropping its queue."""
        self.t.counters[counter] += 1
        conn.state = "down"
        self._set_connected(conn.bookie_id, False)
        self.fail_pending(conn.bookie_id, BookieUnavailableError.code)
        self.close_conn(conn)
        self.open_socket(conn)

    def on_request_timeout(self, bookie_id: str, now: float) -> None:
        """A request to ``bookie_id`` timed out: a bookie never reached, or a
        tcp one silent for the heartbeat timeout, counts as disconnected."""
        conn = self.conns.get(bookie_id)
        if conn is not None and conn.state == "connecting":
            self.on_disconnect(conn, "never_connected")
        elif conn is not None and self._silent(conn, now):
            self.on_disconnect(conn, "silent")

    def _silent(self, conn: BookieConnection, now: float) -> bool:
        """A tcp bookie that sent nothing for the heartbeat timeout while a
        request to it timed out: a host cut off the network.  (ZeroMQ's own
        heartbeat can miss it while a stream of sends keeps its output
        blocked.)  Local ipc bookies are left to the add-timeout resends."""
        limit_ms = self.t._heartbeat_timeout_ms
        return (limit_ms > 0 and conn.state == "up" and conn.endpoint.startswith("tcp://")
                and (now - conn.heard_s) * 1000 >= limit_ms)

    def _set_connected(self, bookie_id: str, up: bool) -> None:
        with self.t._cond:
            self.t._connected[bookie_id] = up
