"""Ask a bookie whether it is alive: one INFO request with a deadline.

Used by the supervisor's watch loop, ``bkctl up --detach`` and
``bkctl status``.  Never hangs: each probe is one ``ipc.calls.call_once``
(the client transport, on the caller's thread, closed on every path).

CURVE: a tcp bookie of a config with ``[security] curve`` is probed over
CURVE with the config's own key pair (``probe_curve(config)``), which is
also the bookie's server key: the supervisor and ``bkctl`` run on the
bookies' host with their config.
"""

from __future__ import annotations

import zmq

from appliance.errors import BKError
from ipc.calls import call_once
from ipc.curve import KeyPair, load_key_pair
from ipc.replies import CompactReply, InfoReply
from ipc.requests import CompactRequest, InfoRequest


def probe_curve(config) -> KeyPair | None:
    """The key pair to probe ``config``'s bookies with (None: CURVE off);
    ``ConfigError`` if its key file cannot be used."""
    if not config.security.curve:
        return None
    return load_key_pair(config.security.key_file)


def bookie_info(endpoint: str, timeout_ms: int, context: zmq.Context | None = None,
                curve: KeyPair | None = None) -> dict | None:
    """The bookie's INFO document, or None if it did not answer in time."""
    return _ask(endpoint, InfoRequest(), InfoReply, timeout_ms, context, curve)


def bookie_compact(endpoint: str, major: bool, timeout_ms: int,
                   context: zmq.Context | None = None,
                   curve: KeyPair | None = None, suspend: bool = False,
                   resume: bool = False) -> dict | None:
    """Start a compaction on a bookie (COMPACT), or with ``suspend`` /
    ``resume`` suspend or resume its automatic compaction; its reply
    document (``ticket``, ``compaction``), or None if it did not answer in
    time."""
    return _ask(endpoint, CompactRequest(major, suspend=suspend, resume=resume), CompactReply,
                timeout_ms, context, curve)


def bookie_gc(endpoint: str, timeout_ms: int, context: zmq.Context | None = None,
              curve: KeyPair | None = None) -> dict | None:
    """Start a garbage-collection pass on a bookie (COMPACT with ``gc``);
    its reply document (``ticket``, ``gc``), or None if it did not answer."""
    return _ask(endpoint, CompactRequest(gc=True), CompactReply, timeout_ms, context, curve)


def _ask(endpoint: str, request, reply_type, timeout_ms: int,
         context: zmq.Context | None, curve: KeyPair | None = None) -> dict | None:
    try:  # same host, same key pair as the bookie: our public key is its server key
        event = call_once(endpoint, request, timeout_ms, context=context, curve_keys=curve,
                          server_key=curve.public if curve is not None else None)
    except (zmq.ZMQError, BKError):
        return None
    return event.reply.info if isinstance(event.reply, reply_type) else None
