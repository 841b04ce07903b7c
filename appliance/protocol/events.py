"""Events in, actions out: the only vocabulary between a protocol core and
its driver (the ZeroMQ client, or the deterministic simulation).

A core never does I/O.  Its user-facing methods (``add``, ``close``,
``read`` ...) and ``handle(event)`` return a list of actions; the driver
carries them out and feeds back what happened as events.  Time is an input:
every event and user call carries ``now_ms``; a core never reads a clock.

Correlation: every request action has a ``request_id`` (unique within the
ids the core was given, see ``CoreBase``) and every reply event echoes it.
Replies the core no longer expects (late, duplicated, reordered, or from a
superseded round) are ignored or applied idempotently, so the driver may
deliver at-least-once and in any order.  Error ``code`` values are
``appliance.protocol.errors`` codes (``OK = 0``); their response class (positive /
explicit negative / unknown) is decided by ``errors.is_explicit_negative``.

Actions (core -> driver)
------------------------
``SendAdd``        store entries on one bookie (many entries per action: the
                   batch path); reply with one ``AddResponse`` per entry.
``SendRead``       read one entry (``fence=True``: fence the ledger first).
                   Every read action (``SendRead``, ``SendReadBatch``,
                   ``SendReadLac``, ``SendWaitLac``) carries the ledger's
                   ``master_key``: a bookie that holds the ledger's key
                   refuses a read with another one, or with none (``b""``)
                   by default (``appliance.protocol.read_access``).
``SendReadBatch``  read a run of entries from one bookie (E == Qw only); reply
                   ``ReadBatchResponse``.
``SendReadLac``    ask a bookie its LAC (``fence=True``: the recovery fence).
``SendWaitLac``    long poll: a bookie's LAC once it exceeds a value, or at a timeout.
``SendWriteLac``   tell a bookie the writer's LAC (best effort, no reply needed).
``SendWriteClose`` BP-32 advisory write close, one per bookie of the current
                   ensemble once a close succeeded: the bookie may rotate the
                   ledger's entry log.  No reply is fed back: the driver only
                   logs the outcome, and nothing waits for it.
``WriteMetadata``  CAS ``metadata`` over ``expected_version``; reply ``MetadataWritten``.
``ReadMetadata``   reply ``MetadataRead``.
``SetTimer``       fire ``TimerFired(timer_id)`` after ``delay_ms`` (stale timers
                   are ignored by the core, so no cancel is needed).
``CompleteAdds``   entries first..last are acknowledged (in order); LAC = last.
``FailAdds``       entries first..last failed with ``code`` (may or may not be stored).
``CloseDone``      a writer close finished: ``code``, ``last_entry_id``.
``OpenDone``       an open (recovering or not) finished: ``code``, LAC, metadata.
``ReadDone``       a read finished: payloads of entries first.. in order, or ``code``.
``LacRead``        a LAC read / wait finished: ``code``, ``lac``.

Events (driver -> core)
-----------------------
``AddResponse`` (or ``AddResponses``: all replies to one ``SendAdd``),
``ReadResponse`` (``ReadBatchResponse``), ``ReadLacResponse``, ``MetadataWritten``,
``MetadataRead``, ``TimerFired``, ``AvailableBookies`` (the bookies a writer or
recovery may pick replacements from, with where they are for host-aware
placement: an input, never a lookup).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from appliance.protocol.metadata import LedgerMetadata
from appliance.protocol.placement import Location

# HOT: the actions and events every add makes (``SendAdd``, ``SetTimer``,
# ``CompleteAdds``, ``AddResponses``) are plain slotted dataclasses, not
# frozen ones: a frozen dataclass sets each field through
# ``object.__setattr__`` (0.75 against 0.15 us for one of 7 fields), and a
# few are made per flush of every ledger.  Nothing mutates an event or an
# action once made; they compare and hash by value like the frozen ones.

# -- actions -----------------------------------------------------------------
@dataclass(slots=True, unsafe_hash=True)  # not frozen: see HOT above
class SendAdd:
    request_id: int
    bookie_id: str
    ledger_id: int
    entry_ids: tuple[int, ...]
    datas: tuple[bytes, ...]  # packed records (appliance.protocol.entry), same order
    recovery: bool
    master_key: bytes


@dataclass(frozen=True, slots=True)
class SendRead:
    request_id: int
    bookie_id: str
    ledger_id: int
    entry_id: int
    fence: bool
    master_key: bytes  # the ledger's key (b"": none); fence=True stores it if new


@dataclass(frozen=True, slots=True)
class SendReadBatch:
    """Read entries first..last (one fragment) from one bookie in one request.
    Only for ledgers whose every bookie stores every entry (E == Qw)."""

    request_id: int
    bookie_id: str
    ledger_id: int
    first_entry_id: int
    last_entry_id: int
    master_key: bytes


@dataclass(frozen=True, slots=True)
class SendReadLac:
    request_id: int
    bookie_id: str
    ledger_id: int
    fence: bool
    master_key: bytes


@dataclass(frozen=True, slots=True)
class SendWaitLac:
    """Long poll: the bookie answers (``ReadLacResponse``) once its LAC for
    the ledger exceeds ``previous_lac``, or with the LAC it has after
    ``timeout_ms``."""

    request_id: int
    bookie_id: str
    ledger_id: int
    previous_lac: int
    timeout_ms: int
    master_key: bytes


@dataclass(frozen=True, slots=True)
class SendWriteLac:
    request_id: int
    bookie_id: str
    ledger_id: int
    lac: int
    master_key: bytes


@dataclass(frozen=True, slots=True)
class SendWriteClose:
    request_id: int
    bookie_id: str
    ledger_id: int
    master_key: bytes


@dataclass(frozen=True, slots=True)
class WriteMetadata:
    request_id: int
    ledger_id: int
    metadata: LedgerMetadata
    expected_version: int


@dataclass(frozen=True, slots=True)
class ReadMetadata:
    request_id: int
    ledger_id: int


@dataclass(slots=True, unsafe_hash=True)  # not frozen: see HOT above
class SetTimer:
    timer_id: int
    delay_ms: int


@dataclass(slots=True, unsafe_hash=True)  # not frozen: see HOT above
class CompleteAdds:
    ledger_id: int
    first_entry_id: int
    last_entry_id: int  # the new last_add_confirmed


@dataclass(frozen=True, slots=True)
class FailAdds:
    ledger_id: int
    first_entry_id: int
    last_entry_id: int
    code: int


@dataclass(frozen=True, slots=True)
class CloseDone:
    ledger_id: int
    code: int
    last_entry_id: int


@dataclass(frozen=True, slots=True)
class OpenDone:
    ledger_id: int
    code: int
    last_add_confirmed: int
    metadata: LedgerMetadata | None = None
    version: int | None = None
    # Why an open failed, when the core can say more than the code does
    # (a recovery names the entry it could not decide, with its replies).
    detail: str = ""


@dataclass(frozen=True, slots=True)
class ReadDone:
    read_id: int
    ledger_id: int
    code: int
    first_entry_id: int
    payloads: tuple = ()  # memoryviews/bytes of entries first_entry_id.. in order


@dataclass(frozen=True, slots=True)
class LacRead:
    read_id: int
    ledger_id: int
    code: int
    lac: int


# -- events ------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class AddResponse:
    request_id: int
    bookie_id: str
    ledger_id: int
    entry_id: int
    code: int
    now_ms: int = 0


@dataclass(slots=True, unsafe_hash=True)  # not frozen: see HOT above
class AddResponses:
    """The replies to one ``SendAdd`` at once (the batch path): ``codes[i]``
    answers ``entry_ids[i]``.  Equivalent to one ``AddResponse`` per entry."""

    request_id: int
    bookie_id: str
    ledger_id: int
    entry_ids: tuple[int, ...]
    codes: tuple[int, ...]
    now_ms: int = 0


@dataclass(frozen=True, slots=True)
class ReadResponse:
    request_id: int
    bookie_id: str
    ledger_id: int
    entry_id: int
    code: int
    data: bytes | None = None
    now_ms: int = 0


@dataclass(frozen=True, slots=True)
class ReadBatchResponse:
    """The answer to one ``SendReadBatch``: ``code`` is OK or why the whole
    request failed; rows (``entry_ids[i]``, ``codes[i]``, ``datas[i]``: the
    stored record, or None) run in entry order from the first asked and may
    stop early (a bookie's limits, or its first non-OK row)."""

    request_id: int
    bookie_id: str
    ledger_id: int
    code: int
    entry_ids: tuple[int, ...] = ()
    codes: tuple[int, ...] = ()
    datas: tuple = ()
    now_ms: int = 0


@dataclass(frozen=True, slots=True)
class ReadLacResponse:
    request_id: int
    bookie_id: str
    ledger_id: int
    code: int
    lac: int = -1
    now_ms: int = 0


@dataclass(frozen=True, slots=True)
class MetadataWritten:
    request_id: int
    ledger_id: int
    code: int  # OK, or MetadataVersionError.code on a CAS conflict
    version: int | None = None  # the new version when code == OK
    now_ms: int = 0


@dataclass(frozen=True, slots=True)
class MetadataRead:
    request_id: int
    ledger_id: int
    code: int
    metadata: LedgerMetadata | None = None
    version: int | None = None
    now_ms: int = 0


@dataclass(frozen=True, slots=True)
class TimerFired:
    timer_id: int
    now_ms: int = 0


@dataclass(frozen=True, slots=True)
class AvailableBookies:
    """The live writable bookies, and where bookies are (``locations``:
    bookie id -> ``placement.Location``; may also name read-only ones, and
    merges into what the core knew; a bookie never located is its own host)."""

    bookie_ids: tuple[str, ...]
    now_ms: int = 0
    locations: Mapping[str, Location] | None = None


REQUEST_ACTIONS = (SendAdd, SendRead, SendReadBatch, SendReadLac, SendWriteLac, WriteMetadata,
                   ReadMetadata, SendWriteClose)
RESULT_ACTIONS = (CompleteAdds, FailAdds, CloseDone, OpenDone, ReadDone, LacRead)
