"""The log service's pure rules (seed 003's write proxy): which log server
owns a log, the owner's duplicate filter, and the wire messages.

Spread (``owner_of``): rendezvous hashing, a form of consistent hashing.
Every live server gets a score ``blake2b(server id, log name)``; the highest
score owns the log.  Every process computes the same answer from the same
list of live servers, and when a server joins or leaves only the logs it
wins (or won) move: about 1/N of them.

Duplicate filter (``DedupTable``), one per owned log.  Every producer has
an id (16 bytes) and numbers its writes 1, 2, 3, ... (``seq``).  For each
producer the owner keeps the next sequence number it expects and the
positions of its last ``recent_max`` records:

* ``seq`` below the next expected: a duplicate (a retry).  Its answer is the
  kept position (or the pending write's, when the first copy is still
  being stored); one older than the kept ones is ``OLD`` (stored, position
  no longer known).
* ``seq`` equal to it: a new record, written, then ``next = seq + 1``.
* ``seq`` above it: a gap, refused (``GAP``, with the expected number); the
  producer resends from its oldest unacknowledged write, so a producer's
  records are applied in its order.
* A producer the table does not know starts at the oldest write it has
  not seen acknowledged (``oldest``, sent with every request): a request
  overtaken by a later one (a reconnection reorders them) is then a gap,
  never a new start that would hide the earlier writes as duplicates.

Bounds: at most ``producers_max`` producers; one silent for ``idle_ms`` is
forgotten when room is needed, and a new producer is refused (``FULL``)
while all of them are active.  A new owner rebuilds the table from the tags
in the log's tail (``learn``, in log order), so the filter survives the
owner's ``kill -9``.

A ``DedupTable`` belongs to the thread that drives its log's owner core
(``appliance.protocol.log_owner``): no lock, no other caller.

Values the table keeps for positions are opaque (a DLSN, or a pending
write's future): the table only stores and returns them.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections import OrderedDict
from dataclasses import dataclass, field
from itertools import accumulate

from appliance.protocol.errors import BadRequestError

NEW, DUPLICATE, OLD, GAP, FULL = "new", "duplicate", "old", "gap", "full"
PRODUCER_ID_BYTES = 16


# -- spread ----------------------------------------------------------------------------
def _score(server_id: str, log: str) -> bytes:
    return hashlib.blake2b(f"{server_id}\0{log}".encode(), digest_size=8).digest()


def owner_of(log: str, servers) -> str | None:
    """The live server (an id of ``servers``) that should own ``log``."""
    best = None
    for server in servers:
        score = (_score(server, log), server)
        if best is None or score > best:
            best = score
    return None if best is None else best[1]


# -- the duplicate filter ------------------------------------------------------------------
@dataclass
class _Producer:
    next_seq: int
    used_ms: int
    recent: OrderedDict = field(default_factory=OrderedDict)  # seq -> position


@dataclass(frozen=True)
class Verdict:
    kind: str  # NEW, DUPLICATE, OLD, GAP, FULL
    position: object = None  # DUPLICATE: the kept position
    expected: int = 0  # GAP: the next sequence number the owner expects


class DedupTable:
    """See the module docstring; ``now_ms`` is passed in (no clock here)."""

    def __init__(self, producers_max: int, recent_max: int, idle_ms: int):
        if producers_max < 1 or recent_max < 1:
            raise ValueError("producers_max and recent_max must be >= 1")
        self.producers_max = producers_max
        self.recent_max = recent_max
        self.idle_ms = idle_ms
        self._producers: OrderedDict[bytes, _Producer] = OrderedDict()  # least recent first

    def __len__(self) -> int:
        return len(self._producers)

    def next_seq(self, producer_id: bytes) -> int | None:
        p = self._producers.get(producer_id)
        return None if p is None else p.next_seq

    def admit(self, producer_id: bytes, seq: int, now_ms: int,
              oldest: int | None = None) -> Verdict:
        """Judge one record; a NEW one is reserved (``next = seq + 1``): the
        caller must then ``store`` its position (or drop the table).
        ``oldest``: the producer's oldest unacknowledged write, where an
        unknown producer starts (default ``seq``)."""
        p = self._producers.get(producer_id)
        if p is None:
            if not self._make_room(now_ms):
                return Verdict(FULL)
            p = self._producers[producer_id] = _Producer(seq if oldest is None else oldest,
                                                         now_ms)
        self._producers.move_to_end(producer_id)
        p.used_ms = now_ms
        if seq == p.next_seq:
            p.next_seq = seq + 1
            return Verdict(NEW)
        if seq > p.next_seq:
            return Verdict(GAP, expected=p.next_seq)
        if seq in p.recent:
            return Verdict(DUPLICATE, position=p.recent[seq])
        return Verdict(OLD)

    def admit_run(self, producer_id: bytes, seq: int, n: int, now_ms: int) -> int:
        """The common case in one step: a known producer's next ``n``
        records (``seq`` is the next expected) are all NEW and reserved
        (``next = seq + n``); returns ``n``.  Otherwise 0 and nothing
        changes: judge the records one by one with ``admit``."""
        p = self._producers.get(producer_id)
        if p is None or seq != p.next_seq or n < 1:
            return 0
        self._producers.move_to_end(producer_id)
        p.used_ms = now_ms
        p.next_seq = seq + n
        return n

    def store_many(self, producer_id: bytes, seq: int, positions: list) -> None:
        """``store`` of consecutive records ``seq, seq + 1, ...`` just
        admitted."""
        p = self._producers.get(producer_id)
        if p is None:
            return
        recent = p.recent
        if len(positions) == 1:  # the usual request: one record (no zip, no range)
            recent[seq] = positions[0]
        else:
            for s, position in zip(range(seq, seq + len(positions)), positions, strict=True):
                recent[s] = position
        while len(recent) > self.recent_max:
            recent.popitem(last=False)

    def store(self, producer_id: bytes, seq: int, position: object) -> None:
        """Keep the position of a record (a pending write's future first,
        its DLSN later: either is an answer to a retry)."""
        p = self._producers.get(producer_id)
        if p is None:
            return
        p.recent[seq] = position
        p.recent.move_to_end(seq)
        while len(p.recent) > self.recent_max:
            p.recent.popitem(last=False)

    def learn(self, producer_id: bytes, seq: int, position: object, now_ms: int) -> None:
        """A record read back from the log (in log order): the producer's
        next expected number follows it."""
        p = self._producers.get(producer_id)
        if p is None:
            p = self._producers[producer_id] = _Producer(seq + 1, now_ms)
        p.next_seq = seq + 1
        p.used_ms = now_ms
        self._producers.move_to_end(producer_id)
        self.store(producer_id, seq, position)
        while len(self._producers) > self.producers_max:
            self._producers.popitem(last=False)

    def _make_room(self, now_ms: int) -> bool:
        if len(self._producers) < self.producers_max:
            return True
        oldest_id, oldest = next(iter(self._producers.items()))
        if now_ms - oldest.used_ms < self.idle_ms:
            return False
        del self._producers[oldest_id]
        return True


# -- wire ------------------------------------------------------------------------------------
# A request or reply is a multipart ZeroMQ message.  The hot pair (a write
# and its "written" reply) has a binary header of fixed fields (``encode_write``,
# ``encode_written``): a JSON header cost a producer more CPU than the rest of
# a synchronous write.  Every other message is one JSON header frame (a
# write is never JSON: producers and servers are upgraded together, and the
# producer sends WRITEs only).  A binary header's first byte is
# its kind (``WRITE_KIND``, ``WRITTEN_KIND``); a JSON one's is "{".
#
#   producer -> server   WRITE, one frame: ``_WRITE`` (kind, gen, seq of the first
#                        record, oldest: the producer's oldest unacknowledged seq,
#                        pid: 16 bytes, the log name's length, n), the log name
#                        (UTF-8), n sizes (u32 big-endian each), the n records back
#                        to back: records seq .. seq + n - 1.  ``decode_request``
#                        reads it as the document {"op": "write", "log", "pid"
#                        (hex), "seq", "gen", "oldest"} and its records.
#                        {"op": "hello", "log", "pid", "gen"}: the next seq expected
#                        {"op": "ping"}
#   server -> producer   WRITTEN, one frame: ``_WRITTEN`` (kind, gen, seq, number of
#                        runs), then per run ``_RUN`` (seg, entry, first slot, n):
#                        the request's records in order, n at a time at consecutive
#                        slots of one entry (seg ``FORGOTTEN``: stored, position
#                        forgotten).  ``decode_header`` reads it as {"op": "written",
#                        "seq", "gen", "runs": [[seg, entry, first slot, n], ...]}
#                        (seg None: forgotten; ``dlsn_runs`` / ``runs_dlsns``), and
#                        ``encode_header`` writes that document as WRITTEN.
#                        {"op": "hello", "log", "pid", "gen", "next_seq": int or null}
#                        {"op": "error", "code", "log", "seq", "gen", "message",
#                         "owner", "endpoint", "expected"}
#                        {"op": "pong", "id", "pid", "metrics_url", "read_endpoint",
#                         "logs": [owned log names]}
#
#   producer -> server   MUX, one frame: ``_MUX`` (kind, n), then n sections, each
#                        ``_SECTION`` (its length) and one single-frame request as
#                        above (a binary WRITE or a JSON hello), for any logs and
#                        producers: the requests of a process's producers that talk
#                        to one server, in one message (``encode_mux``,
#                        ``decode_mux``).  Each section is judged as if it came
#                        alone (deduplication, order and answers unchanged); its
#                        answer is a section of a MUX_REPLY.
#   server -> producer   MUX_REPLY, one frame: ``_MUX`` (kind, n), then n answers,
#                        each ``_ROUTE`` (the log name's length, pid: 16 bytes, the
#                        reply's length), the log name (UTF-8) and one reply frame as
#                        above (WRITTEN or a JSON hello / error): the answers ready
#                        for one connection in one turn of the server's loop
#                        (``encode_mux_reply``, ``decode_mux_reply``).  A malformed
#                        MUX is answered as a whole with a JSON "bad" error.
#
# Error codes: "not_owner" (try "owner" at "endpoint"), "retry" (the owner is
# opening, closing or waiting for a stale lease: resend soon), "held" (an
# exclusive writer holds the log: wait), "gap" (resend from "expected"),
# "full" (TooManyProducersError), "bad" (a malformed request: not retried).
NOT_OWNER, RETRY, HELD, BAD = "not_owner", "retry", "held", "bad"
OPS = ("write", "hello", "ping")


WRITE_KIND, WRITTEN_KIND = 1, 2
_WRITE = struct.Struct("!BIQQ16sHI")  # kind, gen, seq, oldest, pid, log name bytes, n
_WRITTEN = struct.Struct("!BIQI")  # kind, gen, seq, runs
_RUN = struct.Struct("!QQII")  # seg, entry, first slot, n
FORGOTTEN = (1 << 64) - 1  # a run's seg: stored, position forgotten
_SIZES: dict[int, struct.Struct] = {}  # n -> the struct of n sizes
MUX_KIND, MUX_REPLY_KIND = 3, 4
_MUX = struct.Struct("!BI")  # kind, sections
_SECTION = struct.Struct("!I")  # a section's length
_ROUTE = struct.Struct("!H16sI")  # log name bytes, pid, the reply's length


def _sizes(n: int) -> struct.Struct:
    fmt = _SIZES.get(n)
    if fmt is None:
        fmt = struct.Struct(f"!{n}I")
        if n <= 64:
            _SIZES[n] = fmt
    return fmt


def encode_write(log: bytes, pid: bytes, gen: int, seq: int, oldest: int,
                 payloads: list) -> bytes:
    """A WRITE request (one frame); ``log`` is the name's UTF-8."""
    n = len(payloads)
    return b"".join((_WRITE.pack(WRITE_KIND, gen, seq, oldest, pid, len(log), n), log,
                     _sizes(n).pack(*map(len, payloads)), *payloads))


def _decode_write(frame: bytes) -> tuple[dict, list]:
    if len(frame) < _WRITE.size:
        raise BadRequestError("log service: a write header is cut short")
    _, gen, seq, oldest, pid, name_len, n = _WRITE.unpack_from(frame)
    start = _WRITE.size + name_len
    blob = start + 4 * n
    if len(frame) < blob:
        raise BadRequestError("log service: a write's name or sizes are cut short")
    try:
        name = frame[_WRITE.size:start].decode()
    except UnicodeDecodeError as exc:
        raise BadRequestError(f"log service: bad log name ({exc})") from exc
    ends = list(accumulate(_sizes(n).unpack_from(frame, start), initial=blob))
    if ends[-1] != len(frame):
        raise BadRequestError(f"log service: {n} records of {ends[-1] - blob} bytes in "
                              f"{len(frame) - blob}")
    doc = {"op": "write", "log": name, "pid": pid.hex(), "seq": seq, "gen": gen,
           "oldest": oldest}
    return doc, [frame[a:b] for a, b in zip(ends, ends[1:], strict=False)]


def encode_mux(sections: list) -> bytes:
    """A MUX request (one frame): ``sections`` are single-frame requests
    (``encode_write`` frames, JSON hellos)."""
    parts = [_MUX.pack(MUX_KIND, len(sections))]
    for section in sections:
        parts.append(_SECTION.pack(len(section)))
        parts.append(section)
    return b"".join(parts)


def mux_groups(parts: list, sections_max: int, bytes_max: int):
    """``parts`` (sections or routed answers, in order) cut into the groups
    of successive parts that one MUX or MUX_REPLY carries: at most
    ``sections_max`` parts and ``bytes_max`` bytes each (a bigger part goes
    alone)."""
    start = 0
    while start < len(parts):
        end, size = start, 0
        while end < len(parts) and end - start < sections_max and \
                (end == start or size + len(parts[end]) <= bytes_max):
            size += len(parts[end])
            end += 1
        yield parts[start:end]
        start = end


def _split_mux(frame: bytes, kind: str, sections_max: int, bytes_max: int):
    if len(frame) > bytes_max:
        raise BadRequestError(f"log service: a {kind} of {len(frame)} bytes (at most "
                              f"{bytes_max})")
    if len(frame) < _MUX.size:
        raise BadRequestError(f"log service: a {kind} header is cut short")
    _, count = _MUX.unpack_from(frame)
    if not 1 <= count <= sections_max:
        raise BadRequestError(f"log service: a {kind} of {count} sections (1 to "
                              f"{sections_max})")
    return count, _MUX.size


def decode_mux(frame: bytes, sections_max: int, bytes_max: int) -> list[bytes]:
    """The sections of a MUX request (each a single-frame request, read
    with ``decode_request([section])``); ``BadRequestError`` if it is cut
    short, too long, holds more than ``sections_max`` sections or
    ``bytes_max`` bytes, or a section is itself a MUX."""
    count, at = _split_mux(frame, "multi-log request", sections_max, bytes_max)
    sections = []
    for _ in range(count):
        if at + _SECTION.size > len(frame):
            raise BadRequestError("log service: a multi-log request's section is cut short")
        (size,) = _SECTION.unpack_from(frame, at)
        at += _SECTION.size
        if size < 1 or at + size > len(frame):
            raise BadRequestError(f"log service: a multi-log request's section of {size} "
                                  f"bytes in {len(frame) - at}")
        section = frame[at:at + size]
        if section[0] in (MUX_KIND, MUX_REPLY_KIND):
            raise BadRequestError("log service: a multi-log request inside another")
        sections.append(section)
        at += size
    if at != len(frame):
        raise BadRequestError(f"log service: {len(frame) - at} bytes after a multi-log "
                              "request's last section")
    return sections


def route_answer(name: bytes, pid: bytes, reply: bytes) -> bytes:
    """One answer of a MUX_REPLY: ``reply`` for the producer ``pid`` of the
    log ``name`` (UTF-8)."""
    return b"".join((_ROUTE.pack(len(name), pid, len(reply)), name, reply))


def join_mux_reply(routed: list) -> bytes:
    """A MUX_REPLY of answers made by ``route_answer``."""
    return b"".join((_MUX.pack(MUX_REPLY_KIND, len(routed)), *routed))


def encode_mux_reply(answers: list) -> bytes:
    """A MUX_REPLY (one frame): ``answers`` are (log name UTF-8, pid: 16
    bytes, reply frame)."""
    return join_mux_reply([route_answer(*answer) for answer in answers])


def section_route(section: bytes) -> tuple[bytes, bytes] | None:
    """(log name UTF-8, pid) of a MUX section, as far as they can be read
    (to route the "bad" answer of a malformed one); None if they cannot."""
    if section[:1] == b"\x01":  # WRITE_KIND
        if len(section) < _WRITE.size:
            return None
        _, _, _, _, pid, name_len, _ = _WRITE.unpack_from(section)
        return section[_WRITE.size:_WRITE.size + name_len], pid
    try:
        doc = json.loads(section)
        return doc["log"].encode(), bytes.fromhex(doc["pid"])
    except (ValueError, UnicodeError, TypeError, KeyError, AttributeError):
        return None


def decode_mux_reply(frame: bytes, sections_max: int, bytes_max: int) -> list[tuple]:
    """(log name UTF-8, pid, reply frame) of each answer of a MUX_REPLY;
    ``BadRequestError`` if it is malformed."""
    count, at = _split_mux(frame, "multi-log reply", sections_max, bytes_max)
    answers = []
    for _ in range(count):
        if at + _ROUTE.size > len(frame):
            raise BadRequestError("log service: a multi-log reply's answer is cut short")
        name_len, pid, size = _ROUTE.unpack_from(frame, at)
        at += _ROUTE.size
        end = at + name_len + size
        if size < 1 or end > len(frame):
            raise BadRequestError("log service: a multi-log reply's answer is cut short")
        answers.append((frame[at:at + name_len], pid, frame[at + name_len:end]))
        at = end
    if at != len(frame):
        raise BadRequestError(f"log service: {len(frame) - at} bytes after a multi-log "
                              "reply's last answer")
    return answers


def decode_request(frames: list) -> tuple[dict, list]:
    """A request's header document and records (``frames``: the message
    without the sender's identity); ``BadRequestError`` if it is not one.
    (A MUX is split with ``decode_mux`` first.)"""
    if not frames:
        raise BadRequestError("log service: a request without a header")
    head, payloads = frames[0], frames[1:]
    if not head:
        raise BadRequestError("log service: an empty header")
    if head[0] in (MUX_KIND, MUX_REPLY_KIND):
        raise BadRequestError("log service: a multi-log request is split with decode_mux")
    if head[:1] == b"\x01":  # WRITE_KIND
        if payloads:
            raise BadRequestError("log service: a binary write is one frame")
        return _decode_write(head)
    doc = decode_header(head)
    if payloads:
        raise BadRequestError("log service: a JSON request is one frame")
    if doc["op"] == "write":
        raise BadRequestError("log service: a write is a binary WRITE frame")
    return doc, []


def encode_written(gen: int, seq: int, runs) -> bytes:
    """A WRITTEN reply (one frame): ``runs`` as ``dlsn_runs`` makes them."""
    return b"".join((_WRITTEN.pack(WRITTEN_KIND, gen, seq, len(runs)),
                     *(_RUN.pack(FORGOTTEN if seg is None else seg, entry or 0, slot or 0, n)
                       for seg, entry, slot, n in runs)))


def decode_written(frame: bytes) -> tuple[int, int, list]:
    """(gen, seq, runs) of a WRITTEN reply: runs (seg, entry, first slot, n),
    seg ``FORGOTTEN`` for records whose position is forgotten;
    ``BadRequestError`` if it is cut short or too long."""
    if len(frame) < _WRITTEN.size:
        raise BadRequestError("log service: a written reply is cut short")
    _, gen, seq, count = _WRITTEN.unpack_from(frame)
    if len(frame) != _WRITTEN.size + count * _RUN.size:
        raise BadRequestError(f"log service: a written reply of {count} runs has "
                              f"{len(frame)} bytes")
    return gen, seq, list(_RUN.iter_unpack(memoryview(frame)[_WRITTEN.size:]))


def encode_header(doc: dict) -> bytes:
    """A header frame: WRITTEN for a "written" document, else JSON."""
    if doc.get("op") == "written":  # seq and gen as a request without them is read
        try:
            return encode_written(doc.get("gen", 0), doc.get("seq", 1), doc["runs"])
        except (struct.error, TypeError, ValueError):
            pass  # numbers a binary reply cannot carry (a JSON request's): JSON, as before
    return json.dumps(doc, separators=(",", ":")).encode()


def decode_header(frame: bytes) -> dict:
    """A request or reply header; ``BadRequestError`` if it is not one.
    (A binary WRITE is read with its records: ``decode_request``.)"""
    if frame[:1] == b"\x02":  # WRITTEN_KIND
        gen, seq, runs = decode_written(frame)
        return {"op": "written", "gen": gen, "seq": seq,
                "runs": [[None, None, None, n] if seg == FORGOTTEN else [seg, entry, slot, n]
                         for seg, entry, slot, n in runs]}
    try:
        doc = json.loads(frame)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequestError(f"log service: bad header ({exc})") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("op"), str):
        raise BadRequestError("log service: a header is a JSON object with an op")
    return doc


def _positive(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def check_write(doc: dict, records: int) -> tuple[str, bytes, int, int]:
    """(log, producer id, first seq, oldest unacknowledged seq) of a WRITE
    or HELLO header."""
    log, pid, seq = doc.get("log"), doc.get("pid"), doc.get("seq", 1)
    oldest = doc.get("oldest", seq)
    if not isinstance(log, str) or not isinstance(pid, str) or not _positive(seq) \
            or not _positive(oldest) or oldest > seq:
        raise BadRequestError("log service: a write names a log, a pid and a seq >= oldest "
                              ">= 1")
    try:
        producer_id = bytes.fromhex(pid)
    except ValueError as exc:
        raise BadRequestError(f"log service: pid {pid!r} is not hex") from exc
    if len(producer_id) != PRODUCER_ID_BYTES:
        raise BadRequestError(f"log service: a pid is {PRODUCER_ID_BYTES} bytes")
    if doc["op"] == "write" and records < 1:
        raise BadRequestError("log service: a write carries at least one record")
    return log, producer_id, seq, oldest


def pack_records(payloads: list) -> list[bytes]:
    """The two frames of a packed WRITE: the sizes, then the bytes."""
    return [struct.pack(f"!{len(payloads)}I", *map(len, payloads)), b"".join(payloads)]


def unpack_records(sizes: bytes, blob: bytes) -> list[bytes]:
    """The records of a packed WRITE; ``BadRequestError`` if the frames
    disagree."""
    count, rest = divmod(len(sizes), 4)
    if rest or not count:
        raise BadRequestError("log service: a packed write's sizes frame is n x 4 bytes, n >= 1")
    ends = list(accumulate(struct.unpack(f"!{count}I", sizes), initial=0))
    if ends[-1] != len(blob):
        raise BadRequestError(f"log service: {count} records of {ends[-1]} bytes in a frame of "
                              f"{len(blob)}")
    return [blob[a:b] for a, b in zip(ends, ends[1:], strict=False)]


def dlsn_runs(positions) -> list[list]:
    """Positions ((seg, entry, slot) tuples, or None) as runs
    ``[seg, entry, first slot, n]`` of consecutive slots in one entry."""
    runs: list[list] = []
    last = None
    for pos in positions:
        if last is not None and (pos is None and last[0] is None or pos is not None and
                                 last[0] == pos[0] and last[1] == pos[1] and
                                 last[2] + last[3] == pos[2]):
            last[3] += 1
            continue
        last = [None, None, None, 1] if pos is None else [pos[0], pos[1], pos[2], 1]
        runs.append(last)
    return runs


def runs_dlsns(runs) -> list:
    """``dlsn_runs`` back: one (seg, entry, slot) tuple or None per record;
    ``BadRequestError`` for a malformed run."""
    out: list = []
    try:
        for seg, entry, slot, n in runs:
            if seg is None:
                out.extend([None] * n)
            else:
                out.extend((seg, entry, slot + k) for k in range(n))
    except (TypeError, ValueError) as exc:
        raise BadRequestError(f"log service: bad position runs ({exc})") from exc
    return out
