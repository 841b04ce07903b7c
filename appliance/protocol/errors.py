"""One exception tree for the whole appliance, with stable integer codes.

The wire carries ``code`` integers, never strings, so a client in any
language can map a reply to the same class.  Codes are part of the public
contract: never renumber, only add.

Response classes (BP-46) are decided here, in one place:

* positive: ``OK`` (code 0);
* explicit negative: ``NoSuchLedgerError``, ``NoSuchEntryError``;
* unknown: every other error, timeouts and ``DataUnknownError`` included.

Retryability is also decided here (``is_retryable``).  "You closed it"
(``ClientClosedError``) is distinct from "it broke" (``BookieUnavailableError``,
``BKTimeoutError``).

This module is stdlib-only: the pure protocol core, storage and ipc may all
import it.  Users import it as ``appliance.errors`` (the same objects).
"""

from __future__ import annotations

OK = 0


class BKError(Exception):
    """Root of every appliance error.  ``code`` is stable across releases."""

    code = 1
    retryable = False

    def __init__(self, message: str | None = None):
        super().__init__(message or self.__class__.__doc__.strip().splitlines()[0])

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


# -- explicit negatives ------------------------------------------------------
class NoSuchLedgerError(BKError):
    """No such ledger."""

    code = 2


class NoSuchEntryError(BKError):
    """No such entry."""

    code = 3


# -- ledger state ------------------------------------------------------------
class LedgerFencedError(BKError):
    """The ledger was fenced by a recovery; this writer may no longer add."""

    code = 4


class LedgerClosedError(BKError):
    """The ledger is closed."""

    code = 5


class DataUnknownError(BKError):
    """The bookie may have lost this data (BP-46 limbo): the answer is unknown."""

    code = 6
    retryable = True


# -- authentication / integrity ---------------------------------------------
class UnauthorizedError(BKError):
    """Wrong password (master key mismatch)."""

    code = 7


class DigestMismatchError(BKError):
    """An entry's digest does not match its contents."""

    code = 8


class CorruptRecordError(BKError):
    """An on-disk record failed its checksum."""

    code = 9


# -- requests and capacity --------------------------------------------------
class BadRequestError(BKError):
    """Malformed request."""

    code = 10


class ProtocolVersionError(BadRequestError):
    """Unsupported wire protocol version."""

    code = 11


class TooManyRequestsError(BKError):
    """The bookie is overloaded; retry later."""

    code = 12
    retryable = True


class ReadOnlyError(BKError):
    """The bookie is read-only and refuses writes."""

    code = 13
    retryable = True


# -- availability ------------------------------------------------------------
class BKTimeoutError(BKError):
    """The operation timed out."""

    code = 14
    retryable = True


class BookieUnavailableError(BKError):
    """The bookie cannot be reached."""

    code = 15
    retryable = True


class NotEnoughBookiesError(BKError):
    """Not enough bookies are available for the requested ensemble."""

    code = 16


class BookieIOError(BKError):
    """The bookie failed an I/O operation."""

    code = 17
    retryable = True


# -- metadata ----------------------------------------------------------------
class MetadataError(BKError):
    """Metadata store error."""

    code = 20


class MetadataVersionError(MetadataError):
    """The metadata changed since it was read (compare-and-swap conflict)."""

    code = 21


class NoNodeError(MetadataError):
    """No such metadata node."""

    code = 22


class NodeExistsError(MetadataError):
    """The metadata node already exists."""

    code = 23


class NotEmptyError(MetadataError):
    """The metadata node has children."""

    code = 24


class MetadataUnavailableError(MetadataError):
    """The metadata store cannot be reached."""

    code = 25
    retryable = True


class CorruptMetadataError(MetadataError):
    """A stored metadata record cannot be decoded."""

    code = 26


class MetadataAuthError(MetadataError):
    """The metadata store refused this client: missing or wrong credentials."""

    code = 27


# -- local identity and configuration ---------------------------------------
class CookieMismatchError(BKError):
    """A bookie cookie is missing, foreign or does not match."""

    code = 30


class ConfigError(BKError):
    """Invalid configuration."""

    code = 31


class ClientClosedError(BKError):
    """The client (or handle) was closed by its user."""

    code = 32


# -- logs (seed 003) -------------------------------------------------------------
class LogError(BKError):
    """A log (named stream of records) could not do what was asked."""

    code = 40


class LogFencedError(LogError):
    """A newer writer took the log over: this writer can write no more."""

    code = 41


class NoSuchLogError(LogError):
    """No log of that name."""

    code = 42


class LogTruncatedError(LogError):
    """The position asked for is before the log's truncation point."""

    code = 43


class LogServiceUnavailableError(LogError):
    """The log service took no write of a producer within its deadline (no
    live log server owned the log, or an exclusive writer held it)."""

    code = 44


class TooManyProducersError(LogError):
    """The log's owner already tracks its limit of active producers."""

    code = 45


_BY_CODE: dict[int, type[BKError]] = {}


def _register(cls: type[BKError]) -> None:
    existing = _BY_CODE.get(cls.code)
    if existing is not None and existing is not cls:
        raise RuntimeError(f"duplicate error code {cls.code}: {existing} and {cls}")
    _BY_CODE[cls.code] = cls
    for sub in cls.__subclasses__():
        _register(sub)


_register(BKError)

EXPLICIT_NEGATIVE_CODES = frozenset({NoSuchLedgerError.code, NoSuchEntryError.code})


def error_class(code: int) -> type[BKError]:
    """The class for a wire code; unknown codes map to ``BKError``."""
    return _BY_CODE.get(code, BKError)


def error_for_code(code: int, message: str | None = None) -> BKError:
    """Build the exception a wire status code stands for."""
    if code == OK:
        raise ValueError("code 0 (OK) is not an error")
    return error_class(code)(message)


def code_of(exc: BaseException) -> int:
    """The wire code for an exception; non-BK exceptions are I/O errors."""
    return exc.code if isinstance(exc, BKError) else BookieIOError.code


def is_explicit_negative(code: int) -> bool:
    """BP-46: only NoSuchLedger / NoSuchEntry are explicit negatives."""
    return code in EXPLICIT_NEGATIVE_CODES


def is_retryable(code: int) -> bool:
    return code != OK and error_class(code).retryable


def all_errors() -> dict[int, type[BKError]]:
    """Every registered code and its class (for docs and tests)."""
    return dict(sorted(_BY_CODE.items()))


__all__ = [
    "OK",
    "BKError",
    "NoSuchLedgerError",
    "NoSuchEntryError",
    "LedgerFencedError",
    "LedgerClosedError",
    "DataUnknownError",
    "UnauthorizedError",
    "DigestMismatchError",
    "CorruptRecordError",
    "BadRequestError",
    "ProtocolVersionError",
    "TooManyRequestsError",
    "ReadOnlyError",
    "BKTimeoutError",
    "BookieUnavailableError",
    "NotEnoughBookiesError",
    "BookieIOError",
    "MetadataError",
    "MetadataVersionError",
    "NoNodeError",
    "NodeExistsError",
    "NotEmptyError",
    "MetadataUnavailableError",
    "CorruptMetadataError",
    "MetadataAuthError",
    "CookieMismatchError",
    "ConfigError",
    "ClientClosedError",
    "LogError",
    "LogFencedError",
    "NoSuchLogError",
    "LogTruncatedError",
    "LogServiceUnavailableError",
    "TooManyProducersError",
    "EXPLICIT_NEGATIVE_CODES",
    "error_class",
    "error_for_code",
    "code_of",
    "is_explicit_negative",
    "is_retryable",
    "all_errors",
]
