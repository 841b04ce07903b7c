"""The producers' one transport: per log-server endpoint, one ZeroMQ DEALER
(``Channel``) shared by every producer of the process that writes to a log
that server owns (``appliance.logs.producer_loop`` drives them).

Guarantees:

* Every producer socket is made by ``producer_socket`` (the one place for
  the client's socket options): on tcp with CURVE, a CURVE client of the
  key the log server registered; a refusal of its handshake (this
  client's key not authorized) is seen on the socket's monitor at once
  (``Channel.refused``) and fails the producers writing there with
  ``UnauthorizedError`` naming the log server.
* What the producers queue for one endpoint in one turn of the loop leaves
  as one message: a single request alone (the wire a single producer has
  always spoken), or a multi-log request (``encode_mux``; more than one
  past ``LOG_SERVICE_MUX_SECTIONS_MAX`` / ``_BYTES_MAX``) whose answers come
  back in a MUX_REPLY, each routed by (log, producer id).
* A reply to a single request carries no route: it belongs to the one
  producer allowed to send single requests on the channel (``plain``: the
  first that did; never another for the channel's life, so a late reply
  cannot reach the wrong producer).  Every other producer's requests go as
  multi-log sections, even alone.
* A request that cannot be sent (a full or closed socket) is dropped: its
  producer resends after its request timeout.

Threads: a ``Channel`` and its socket are the loop thread's only (made,
used and closed there); no other thread touches them.
"""

from __future__ import annotations

import logging
import struct

import zmq

from appliance.errors import BKError
from appliance.protocol import limits
from appliance.protocol.log_service import (
    MUX_REPLY_KIND,
    decode_mux_reply,
    encode_mux,
    mux_groups,
)
from ipc.curve import configure_client

log = logging.getLogger("appliance.logs")

COPY_BYTES_MIN = 65_536  # a smaller message is copied into its frame (zero-copy costs more)
_REFUSED_EVENTS = zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
_MONITOR_HEAD = struct.Struct("=Hi")  # zmq_socket_monitor: event (16 bits), value (32 bits)
# plain ints: the enum forms cost a microsecond per look at the socket
EVENTS, POLLIN, NOBLOCK = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.NOBLOCK)


def producer_socket(endpoint: str, curve=None, server_key: bytes | None = None) -> zmq.Socket:
    """A producer's connection to the log server at ``endpoint``: every one
    is made here, on the process's one ZeroMQ context (one I/O thread); a
    CURVE client (``curve``: the client's ``ClientCurve``) of ``server_key``
    when one is given (tcp: ``Producer._server_route``)."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    if server_key is not None:
        configure_client(sock, curve.keys, server_key)
    sock.connect(endpoint)
    return sock


def refusal(frames: list, endpoint: str, server_id: str | None, curve) -> str | None:
    """What a CURVE socket's monitor message says, if it is a refusal of the
    handshake (the server's ZAP refused this client's key, or the handshake
    failed): the ``UnauthorizedError`` message naming the log server."""
    event = _MONITOR_HEAD.unpack_from(frames[0])[0]
    server = f"log server {server_id or '?'} ({endpoint})"
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return (f"{server} refused this client's CURVE key {curve.keys.public.decode()}: it is "
                "not in the log server's [security] authorized_keys_dir")
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
        return f"{server} failed the CURVE handshake (protocol error): its key may be stale"
    return None


class Channel:
    """One log server's connection, shared by the process's producers (see
    the module docstring)."""

    def __init__(self, endpoint: str, stats: dict, curve=None, server_key: bytes | None = None,
                 server_id: str | None = None):
        self.endpoint = endpoint
        self.sock = producer_socket(endpoint, curve, server_key)
        self.fd = self.sock.getsockopt(zmq.FD)
        self.server_id, self.curve = server_id, curve
        # CURVE: the socket's monitor says when the server refuses the handshake
        self.monitor = self.sock.get_monitor_socket(_REFUSED_EVENTS) \
            if server_key is not None else None
        self.monitor_fd = self.monitor.getsockopt(zmq.FD) if self.monitor is not None else None
        self.members: set = set()  # producers whose owner is this server
        self.plain = None  # the producer whose requests may leave alone
        self.watch = None  # the server watch's subscription (the loop's, set by it)
        self.outbox: list = []  # (producer, request frame, payload bytes), this turn's
        self._mux_reply = bytes([MUX_REPLY_KIND])
        self.stats = stats  # the loop's: messages, mux_messages, mux_sections

    def queue(self, producer, frame: bytes, size: int) -> None:
        self.outbox.append((producer, frame, size))

    def flush(self) -> None:
        """Send this turn's requests: one message (more past the bounds)."""
        out, self.outbox = self.outbox, []
        if not out:
            return
        if len(out) == 1 and self.plain in (None, out[0][0]):
            self.plain = out[0][0]
            self._send(out[0][1], out[0][2])
            return
        for group in mux_groups([frame for _, frame, _ in out],
                                limits.LOG_SERVICE_MUX_SECTIONS_MAX,
                                limits.LOG_SERVICE_MUX_BYTES_MAX // 2):  # room for framing
            self._send(encode_mux(group), sum(map(len, group)))
            self.stats["mux_messages"] += 1
            self.stats["mux_sections"] += len(group)

    def _send(self, frame: bytes, size: int) -> None:
        try:
            self.sock.send(frame, NOBLOCK, copy=size < COPY_BYTES_MIN)
        except zmq.ZMQError:
            return  # not sent: the producer resends after its timeout
        self.stats["messages"] += 1

    def readable(self) -> bool:
        """Whether a reply waits (look after every use of the socket: its
        descriptor is edge-triggered)."""
        return bool(self.sock.getsockopt(EVENTS) & POLLIN)

    def receive(self) -> list:
        """The replies that arrived: (route, reply frame) pairs, route a
        (log name UTF-8, producer id) pair, or None for a single request's
        reply (``plain``'s)."""
        got, sock = [], self.sock
        while sock.getsockopt(EVENTS) & POLLIN:  # no exception per empty read
            frame = sock.recv(NOBLOCK)  # a reply is one frame (a stray one: dropped as malformed)
            if frame[:1] != self._mux_reply:
                got.append((None, frame))
                continue
            try:
                answers = decode_mux_reply(frame, limits.LOG_SERVICE_MUX_SECTIONS_MAX,
                                           limits.LOG_SERVICE_MUX_BYTES_MAX)
            except BKError as exc:
                log.warning("log server %s: %s", self.endpoint, exc)
                continue  # its producers resend after their timeout
            got.extend(((name, pid), reply) for name, pid, reply in answers)
        return got

    def refused(self) -> str | None:
        """The refusal the monitor reported, if any (see ``refusal``)."""
        while self.monitor is not None and self.monitor.getsockopt(EVENTS) & POLLIN:
            why = refusal(self.monitor.recv_multipart(NOBLOCK), self.endpoint, self.server_id,
                          self.curve)
            if why is not None:
                return why
        return None

    def close(self) -> None:
        if self.monitor is not None:
            self.sock.disable_monitor()
            self.monitor.close(linger=0)
            self.monitor = None
        self.sock.close(linger=0)
        self.sock = None
