"""A reader's side of the log service's read cache (seed 003's read proxy):
ask the log server that owns a log for its records from a position.

Guarantees (the reader, ``appliance.logs.reader``, relies on them):

* ``fetch(pos, ...)`` returns the log's records at and after ``pos`` in
  DLSN order with none left out (the owner answers from its cache only
  when it holds every record from ``pos`` on, and only records whose entry
  its ack quorum acknowledged: they are in the log for good), ``[]`` when
  none came within the wait, or None: read from the bookies (no owner, the
  owner does not hold ``pos``, no answer within the wait plus
  ``LOG_READ_SERVICE_REPLY_GRACE_MS``).  The reader keeps the position, so
  moving between the owner and the bookies neither repeats nor skips a
  record.
* Ownership moves: the owner is found through its lease in the metadata
  store, and a server that no longer owns the log answers "not owner" with
  the owner's read endpoint, which is followed (up to
  ``LOG_READ_SERVICE_REDIRECTS_MAX`` times per fetch).
* After a None the owner is asked again only once ``due(pos)``
  (``LOG_READ_SERVICE_RECHECK_MS`` later, or at once from a position past
  the one it last could not serve): a log nobody serves costs a metadata
  read per reader that often, only while it waits at the tail.
* Read your writes: an owner that cannot serve a position says how far its
  writer's entries are acknowledged (``confirmed``, kept until the next
  answer).  Every write it answered is at or before that, so a reader
  started after the write returned reads the bookies that far, past their
  LAC, which the next entry carries only.

Wire (ZeroMQ DEALER -> the server's read ROUTER, one JSON header frame):

    reader -> server  {"op": "read", "log", "from": [seg, entry, slot], "max": n,
                       "wait_ms": t, "rid": k}
    server -> reader  {"op": "records", "rid", "runs": [[seg, entry, slot, n], ...]}
                      + 3 frames: sizes (u32 each), payloads back to back,
                      txids (i64 each, big-endian); no frames when empty
                      {"op": "miss", "rid"[, "confirmed": [seg, entry]]}: read
                      these from the bookies; "confirmed": the owner's writer
                      had entries up to there acknowledged (read that far,
                      although the bookies' LAC, carried by the next entry,
                      may be behind)
                      {"op": "error", "code": "not_owner", "rid", "owner", "endpoint"}
    reader -> server  {"op": "confirmed", "log", "rid"}
    server -> reader  {"op": "confirmed", "rid", "at": [seg, entry] or null}: how far
                      the owner's writer has the log acknowledged (or the
                      not_owner / miss answers above)
                      {"op": "error", "code": "bad", "rid", "message"}
"""

from __future__ import annotations

import logging
import struct
import time

import zmq

from appliance.curve import log_server_key
from appliance.errors import BadRequestError, BKError
from appliance.meta.logservice import LogServiceRegistry
from appliance.protocol import limits
from appliance.protocol.log_service import (
    NOT_OWNER,
    decode_header,
    encode_header,
    pack_records,
    runs_dlsns,
    unpack_records,
)
from appliance.protocol.logs import DLSN
from ipc.curve import configure_client

log = logging.getLogger("appliance.logs")

MISS = "miss"
CONFIRMED = "confirmed"


# -- wire ------------------------------------------------------------------------------------
def encode_read(name: str, pos: DLSN, max_records: int, wait_ms: int, rid: int) -> bytes:
    return encode_header({"op": "read", "log": name, "from": list(pos), "max": max_records,
                          "wait_ms": wait_ms, "rid": rid})


def check_read(doc: dict) -> tuple[str, DLSN, int, int]:
    """(log, from, max records, wait ms) of a READ header; ``BadRequestError``
    if it is malformed."""
    name, pos, n, wait = doc.get("log"), doc.get("from"), doc.get("max"), doc.get("wait_ms", 0)
    ok = isinstance(name, str) and isinstance(pos, list) and len(pos) == 3 and \
        all(_int(v) and v >= 0 for v in pos) and _int(n) and n >= 1 and _int(wait) and wait >= 0
    if not ok:
        raise BadRequestError("log service: a read names a log, a from [seg, entry, slot], "
                              "a max >= 1 and a wait_ms >= 0")
    return name, DLSN(*pos), min(n, limits.LOG_READ_CACHE_RECORDS_MAX), \
        min(wait, limits.LOG_READ_SERVICE_WAIT_MS_MAX)


def check_confirmed(doc: dict) -> str:
    """The log of a CONFIRMED request; ``BadRequestError`` if it names none."""
    name = doc.get("log")
    if not isinstance(name, str) or not name:
        raise BadRequestError("log service: a confirmed request names a log")
    return name


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def encode_records(rid, runs: list, txids: list, payloads: list) -> list[bytes]:
    """A RECORDS reply's frames (``runs``: ``[seg, entry, first slot, n]``
    of consecutive records, as ``dlsn_runs`` makes them)."""
    return [encode_header({"op": "records", "rid": rid, "runs": runs}),
            *encode_payloads(txids, payloads)]


def encode_payloads(txids: list, payloads: list) -> list[bytes]:
    """The frames after a RECORDS header (none when there is no record)."""
    if not payloads:
        return []
    return [*pack_records(payloads), struct.pack(f"!{len(txids)}q", *txids)]


def decode_records(doc: dict, frames: list, make) -> list:
    """The records of a RECORDS reply, each ``make((dlsn, txid, payload))``;
    ``BadRequestError`` if the frames disagree."""
    positions = runs_dlsns(doc.get("runs") or [])
    if not positions:
        return []
    if len(frames) != 3 or len(frames[2]) != 8 * len(positions) or \
            any(p is None for p in positions):
        raise BadRequestError("log service: a records reply has sizes, payloads and txids")
    payloads = unpack_records(frames[0], frames[1])
    txids = struct.unpack(f"!{len(positions)}q", frames[2])
    if len(payloads) != len(positions):
        raise BadRequestError("log service: a records reply's frames disagree")
    return [make((DLSN(*p), t, b)) for p, t, b in zip(positions, txids, payloads, strict=True)]


def _confirmed(value) -> tuple[int, int] | None:
    """A (seg, entry) of an answer, or None if absent or malformed."""
    if isinstance(value, list) and len(value) == 2 and all(_int(v) and v >= 0 for v in value):
        return value[0], value[1]
    return None


def owner_confirmed(client, name: str) -> tuple[int, int] | None:
    """``ServiceTail.confirmed_end`` of log ``name``, asked once."""
    tail = ServiceTail(client, name)
    try:
        return tail.confirmed_end()
    finally:
        tail.close()


# -- the reader's side -----------------------------------------------------------------------
class ServiceTail:
    """See the module docstring.  One per reader; not thread-safe (a reader
    is read from one thread)."""

    def __init__(self, client, name: str, clock=time.monotonic):
        self.name = name
        self._registry = LogServiceRegistry(client.logs.store)
        self._clock = clock
        self._ctx = zmq.Context.instance()  # one for every reader of the process
        self._curve = client.curve  # appliance.curve.ClientCurve or None (tcp: CURVE)
        self._sock = None
        self._endpoint: str | None = None
        self._server_key: bytes | None = None  # the owner's CURVE key (tcp), or None
        self._rid = 0
        self.serving = False  # the last fetch was answered from the owner's cache
        self._retry_at = 0.0
        self._missed_at: DLSN | None = None  # the position the owner last could not serve
        self.confirmed: tuple[int, int] | None = None  # (seg, entry): see the docstring
        self.stats = {"requests": 0, "hits": 0, "misses": 0, "redirects": 0, "timeouts": 0}

    def due(self, pos: DLSN) -> bool:
        """Should a fetch from ``pos`` ask the owner?"""
        return self.serving or self._clock() >= self._retry_at or \
            (self._missed_at is not None and pos > self._missed_at)

    def fetch(self, pos: DLSN, max_records: int, wait_s: float, make) -> list | None:
        """Records from ``pos`` (see the module docstring); None: read the
        bookies."""
        wait_ms = int(min(max(wait_s, 0.0) * 1000, limits.LOG_READ_SERVICE_WAIT_MS_MAX))
        self.confirmed = None
        reply = self._exchange(
            lambda rid: encode_read(self.name, pos, max_records, wait_ms, rid), wait_ms)
        if reply is None:
            return self._miss()
        doc, frames = reply
        if doc["op"] == "records":
            self.serving = True
            self.stats["hits"] += 1
            return decode_records(doc, frames, make)
        if doc["op"] == MISS:  # the bookies have it all
            self.confirmed = _confirmed(doc.get("confirmed"))
            return self._miss(pos)
        return self._miss()  # an error: the bookies have it all

    def confirmed_end(self) -> tuple[int, int] | None:
        """(seg, entry): how far the owner's writer has the log's entries
        acknowledged (every write it answered is at or before it), for a
        reader of the bookies (Spark's planning) to read that far past their
        LAC; None: no owner, no answer, nothing acknowledged yet."""
        reply = self._exchange(
            lambda rid: encode_header({"op": CONFIRMED, "log": self.name, "rid": rid}), 0)
        if reply is None or reply[0]["op"] != CONFIRMED:
            return None
        return _confirmed(reply[0].get("at"))

    def _exchange(self, encode, wait_ms: int):
        """One request (``encode(rid)``) to the log's owner, following its
        "not owner" redirects: the answer (header, other frames), or None
        (no owner, no answer in time: the socket is dropped)."""
        for _ in range(limits.LOG_READ_SERVICE_REDIRECTS_MAX + 1):
            if self._endpoint is None:
                self._route(self._owner_id())
                if self._endpoint is None:
                    return None
            reply = self._ask(encode, wait_ms)
            if reply is None:
                self.stats["timeouts"] += 1
                self._drop()
                return None
            doc = reply[0]
            if doc.get("code") != NOT_OWNER:
                return reply
            self.stats["redirects"] += 1
            self._drop()
            self._route(doc.get("owner"))
        return None

    def _owner_id(self) -> str | None:
        """The lease holder's id, or None."""
        try:
            lease = self._registry.owner(self.name)
        except BKError as exc:
            log.info("log %s: owner lookup failed (%s); reading the bookies", self.name, exc)
            return None
        return lease.get("server") if lease is not None else None

    def _route(self, server_id) -> None:
        """Aim at log server ``server_id``'s read endpoint (with its CURVE
        key on tcp), as registered; none (the bookies are read) when it is
        not registered, has no read endpoint, or refuses this client."""
        self._endpoint = self._server_key = None
        if not isinstance(server_id, str):
            return
        try:
            info = self._registry.servers().get(server_id, {})
            endpoint = info.get("read_endpoint")
            if isinstance(endpoint, str):
                self._server_key = log_server_key(self._curve, server_id, info, endpoint)
                self._endpoint = endpoint
        except BKError as exc:
            log.info("log %s: owner %s not usable (%s); reading the bookies", self.name,
                     server_id, exc)

    def _ask(self, encode, wait_ms: int):
        """Send one request (``encode(rid)``) and wait for its answer:
        (header, other frames), or None if none came in time."""
        if self._sock is None:
            self._sock = self._ctx.socket(zmq.DEALER)
            self._sock.linger = 0
            if self._server_key is not None:
                configure_client(self._sock, self._curve.keys, self._server_key)
            self._sock.connect(self._endpoint)
        self._rid += 1
        self._sock.send(encode(self._rid))
        self.stats["requests"] += 1
        deadline = self._clock() + (wait_ms + limits.LOG_READ_SERVICE_REPLY_GRACE_MS) / 1000
        while True:
            remaining = deadline - self._clock()
            if remaining <= 0 or not self._sock.poll(int(remaining * 1000) + 1, zmq.POLLIN):
                return None
            frames = self._sock.recv_multipart()
            try:
                doc = decode_header(frames[0])
            except BKError:
                continue
            if doc.get("rid") == self._rid:  # an older request's late answer is dropped
                return doc, frames[1:]

    def _miss(self, missed_at: DLSN | None = None) -> None:
        """``missed_at``: the owner answered that it does not hold this
        position (a later one may be asked at once)."""
        self._missed_at = missed_at
        self.serving = False
        self.stats["misses"] += 1
        self._retry_at = self._clock() + limits.LOG_READ_SERVICE_RECHECK_MS / 1000
        return None

    def _drop(self) -> None:
        """Close the socket and forget the owner (looked up again next time)."""
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None
        self._endpoint = self._server_key = None

    def close(self) -> None:
        self._drop()
