"""Ask a bookie whether it is alive: one INFO request with a deadline.

Used by the supervisor's watch loop, ``bkctl up --detach`` and
``bkctl status``.  Never hangs: a fresh DEALER with ``linger=0`` per probe,
closed on every path.

CURVE: a tcp bookie of a config with ``[security] curve`` is probed over
CURVE with the config's own key pair (``probe_curve(config)``), which is
also the bookie's server key: the supervisor and ``bkctl`` run on the
bookies' host with their config.
"""

from __future__ import annotations

import zmq

from appliance.errors import BadRequestError
from ipc.curve import KeyPair, configure_client, is_tcp, load_key_pair
from ipc.replies import CompactReply, InfoReply, decode_reply
from ipc.requests import CompactRequest, InfoRequest, encode_request


def probe_curve(config) -> KeyPair | None:
    """The key pair to probe ``config``'s bookies with (None: CURVE off);
    ``ConfigError`` if its key file cannot be used."""
    if not config.security.curve:
        return None
    return load_key_pair(config.security.key_file)


def bookie_info(endpoint: str, timeout_ms: int, context: zmq.Context | None = None,
                curve: KeyPair | None = None) -> dict | None:
    """The bookie's INFO document, or None if it did not answer in time."""
    return _ask(endpoint, InfoRequest(request_id=1), InfoReply, timeout_ms, context, curve)


def bookie_compact(endpoint: str, major: bool, timeout_ms: int,
                   context: zmq.Context | None = None,
                   curve: KeyPair | None = None) -> dict | None:
    """Start a compaction on a bookie (COMPACT); its reply document
    (``ticket``, ``compaction``), or None if it did not answer in time."""
    return _ask(endpoint, CompactRequest(major, request_id=1), CompactReply, timeout_ms,
                context, curve)


def _ask(endpoint: str, request, reply_type, timeout_ms: int,
         context: zmq.Context | None, curve: KeyPair | None = None) -> dict | None:
    ctx = context or zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        if curve is not None and is_tcp(endpoint):  # same host, same key pair as the bookie
            configure_client(sock, curve, curve.public)
        sock.connect(endpoint)
        sock.send_multipart(encode_request(request))
        if not sock.poll(timeout_ms, zmq.POLLIN):
            return None
        reply = decode_reply(sock.recv_multipart())
        return reply.info if isinstance(reply, reply_type) else None
    except (zmq.ZMQError, BadRequestError):
        return None
    finally:
        sock.close(linger=0)
