"""The vocabulary between the log owner core (``appliance.protocol.log_owner``)
and its drivers (the log server's loop thread, ``appliance.logservice``; the
simulation, ``tests/sim/logservicesim.py``): events in, actions out.

Events (driver -> core), each with ``now_ms`` (any monotonic origin, a
number: fractions of a millisecond count for the linger and the gather):

``Opened``        the log was taken over (a writer fenced the previous owner,
                  recovered its segment) and the tags of its tail read back:
                  ``learnt`` = ((producer id, seq, position), ...) in log order.
``OpenFailed``    the take-over failed (the lease is still to be released).
``Hello``         a producer asks the next seq the owner expects.
``Write``         one request's records (one section of a multi-log request
                  is one ``Write``).
``EntryAcked``    an entry the core sent (``SendEntry`` or ``SendControl``)
                  is durable: ``runs`` its records' positions
                  ``[seg, entry, first slot, n]`` (empty for a control entry).
``EntryFailed``   it failed: it may or may not be in the log.
``Tick``          time passed (at ``LogOwner.next_due_ms`` or later).
``Close``         hand the log over (another server should own it, its lease
                  was lost, the server stops): no new writes, what is held
                  is sent, then the writer is closed and the lease released.
``WriterClosed``  the driver closed the writer (``CloseWriter``).
``LeaseReleased`` the driver released the lease (``ReleaseLease``).

Actions (core -> driver):

``Reply``         answer the request ``token`` (opaque to the core: the
                  driver's handle on who asked) with ``answer``.
``SendEntry``     add one entry of these records to the writer, with their
                  tags; feed back ``EntryAcked`` / ``EntryFailed`` with
                  ``entry_no``.
``SendControl``   add a control entry (no records): the bookies learn the
                  LAC, so readers of the bookies see the last records.
``CloseWriter``   close the writer (completing its segment); then ``WriterClosed``.
``ReleaseLease``  release the log's lease; then ``LeaseReleased``.

Events and actions are plain slotted dataclasses, not frozen ones (a frozen
one cost about 0.8 us to make, several per request on the log server's
hot path): treat them as values, never change one once made.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class OwnerState(enum.Enum):
    OPENING = "opening"
    OPEN = "open"
    CLOSING = "closing"
    FAILED = "failed"
    CLOSED = "closed"


class Answer(enum.StrEnum):
    """A request's answer; the value is the wire's (``op`` "written" /
    "hello", else the error ``code``).  A request whose records were all
    stored before (duplicates) is answered WRITTEN with their kept
    positions: DUPLICATE is a verdict the answer counts, not a reply of its
    own on the wire."""
    WRITTEN = "written"
    HELLO = "hello"
    DUPLICATE = "duplicate"
    GAP = "gap"
    FULL = "full"
    RETRY = "retry"
    NOT_OWNER = "not_owner"
    HELD = "held"
    BAD = "bad"


# -- events --------------------------------------------------------------------------------
@dataclass(slots=True)
class Opened:
    now_ms: float
    learnt: tuple = ()  # (producer id, seq, position) in log order
    epoch: int = 0


@dataclass(slots=True)
class OpenFailed:
    now_ms: float
    reason: str = ""


@dataclass(slots=True)
class Hello:
    token: object
    producer_id: bytes
    now_ms: float


@dataclass(slots=True)
class Write:
    token: object
    producer_id: bytes
    seq: int  # the first record's
    oldest: int  # the producer's oldest unacknowledged seq
    payloads: tuple | list
    now_ms: float


@dataclass(slots=True)
class EntryAcked:
    entry_no: int
    runs: tuple | list  # [seg, entry, first slot, n] of its records, in order
    now_ms: float


@dataclass(slots=True)
class EntryFailed:
    entry_no: int
    reason: str
    now_ms: float


@dataclass(slots=True)
class Tick:
    now_ms: float


@dataclass(slots=True)
class Close:
    now_ms: float
    reason: str = "handed over"


@dataclass(slots=True)
class WriterClosed:
    now_ms: float


@dataclass(slots=True)
class LeaseReleased:
    now_ms: float


# -- actions -------------------------------------------------------------------------------
@dataclass(slots=True)
class Reply:
    token: object
    answer: Answer
    runs: list | None = None  # WRITTEN: [seg, entry, first slot, n] (seg None: forgotten)
    next_seq: int | None = None  # HELLO
    expected: int = 0  # GAP: the seq to resend from
    message: str = ""


@dataclass(slots=True)
class SendEntry:
    entry_no: int
    payloads: list
    tags: list  # (producer id, seq) per payload


@dataclass(slots=True)
class SendControl:
    entry_no: int


@dataclass(slots=True)
class CloseWriter:
    pass


@dataclass(slots=True)
class ReleaseLease:
    pass
