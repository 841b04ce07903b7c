"""Ask a log server whether it is alive: one PING with a deadline.

Used by the supervisor's watch loop and ``bkctl status``.  Never hangs: one
DEALER socket, one receive with a timeout, closed on every path.
"""

from __future__ import annotations

import zmq

from appliance.errors import BKError
from appliance.protocol.log_service import decode_header, encode_header


def log_server_info(endpoint: str, timeout_ms: int,
                    context: zmq.Context | None = None) -> dict | None:
    """The server's PONG ({"id", "pid", "metrics_url", "read_endpoint",
    "logs"}), or None if it did not answer within ``timeout_ms``."""
    ctx = context or zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    try:
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
