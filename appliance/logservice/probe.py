"""Ask a log server whether it is alive: one PING with a deadline.

Used by the supervisor's watch loop and ``bkctl status``.  Never hangs: one
DEALER socket, one receive with a timeout, closed on every path.
"""

from __future__ import annotations

import zmq

from appliance.errors import BKError
from appliance.protocol.log_service import decode_header, encode_header
from ipc.curve import KeyPair, configure_client, is_tcp


def log_server_info(endpoint: str, timeout_ms: int, context: zmq.Context | None = None,
                    curve: KeyPair | None = None, server_key: bytes | None = None) -> dict | None:
    """The server's PONG ({"id", "pid", "metrics_url", "read_endpoint",
    "logs"}), or None if it did not answer within ``timeout_ms``.  ``curve``:
    the key pair to ask a tcp endpoint with, as a CURVE client of
    ``server_key`` (default: ``curve``'s own public key, as a supervisor
    probes the servers of its own host, which serve with its key)."""
    ctx = context or zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    try:
        if curve is not None and is_tcp(endpoint):
            configure_client(sock, curve, server_key or curve.public)
        sock.connect(endpoint)
        sock.send(encode_header({"op": "ping"}))
        if not sock.poll(timeout_ms, zmq.POLLIN):
            return None
        doc = decode_header(sock.recv_multipart()[0])
        return doc if doc.get("op") == "pong" else None
    except (zmq.ZMQError, BKError):
        return None
    finally:
        sock.close(linger=0)
