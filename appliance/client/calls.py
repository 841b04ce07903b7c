"""What the client's blocking calls share: the wait for the driver thread
(bounded by ``limits.CLIENT_CALL_TIMEOUT_S_MAX``), argument checks made
before anything is sent, and ``Entry``, the read result.  Kept apart so
``client`` and the handles (``write_handle``, ``read_handle``) import it
and neither imports the other at module level."""

from __future__ import annotations

from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import NamedTuple

from appliance.errors import BKTimeoutError


class Entry(NamedTuple):
    """One entry read back (immutable).  A named tuple: catch-up reads build
    thousands per call, and a frozen dataclass cost ~4x more to construct."""

    ledger_id: int
    entry_id: int
    payload: bytes


def check_entry_id(name: str, value) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


def wait_result(fut: Future, timeout_s: float, what: str):
    try:
        return fut.result(timeout=timeout_s)
    except FutureTimeout:
        raise BKTimeoutError(f"{what} did not finish within {timeout_s:.0f}s") from None
