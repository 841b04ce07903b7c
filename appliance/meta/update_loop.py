"""The one read / transform / compare-and-swap loop every metadata change
goes through (BookKeeper's ``MetadataUpdateLoop``).

``MetadataUpdateLoop(store).update(path, transform, decode=..., encode=...)``
reads the node's (value, version), applies the pure ``transform`` to the
value, and writes the result only if the node is still at the version read.

Guarantees (checked on SQLite and ZooKeeper by
``tests/metadata/test_update_loop.py``):

* A change is decided on the value just read and written by CAS on its
  version, so concurrent updates of one node serialise: each update that
  returns was applied exactly once, to the result of the ones before it.
* A conflict (another writer's CAS won; with ``create_missing``, also a
  concurrent create or delete of the node) re-reads and re-applies the
  transform, at most ``retries_max`` times, sleeping a randomised back-off
  between tries: uniform in ``[0, min(METADATA_BACKOFF_MS_MAX, METADATA_BACKOFF_MS_BASE *
  2**attempt)]`` ms ("full jitter", so racing writers spread apart).  Then
  one ``MetadataVersionError`` naming the path and the count.
* A transform that returns ``NO_CHANGE`` writes nothing; one that raises
  aborts: nothing is written and its exception propagates unchanged.
* ``expected_version``: one try, and only if the node is still at that
  version (``MetadataVersionError`` otherwise, conflict included).
* Every other error (``MetadataUnavailableError``: a CAS whose outcome is
  unknown; a damaged record) propagates without a retry: the caller
  re-reads and decides.
* The sleep function and the random source are injected, so tests and the
  simulation replay exactly.

The loop's limits (tries per caller, back-off) are the module-level
constants below, in one place.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable
from typing import Any

from appliance.errors import MetadataVersionError, NodeExistsError, NoNodeError
from appliance.protocol import limits

_EXPONENT_MAX = 30  # 2**30 ms caps any BACKOFF_MS_MAX anyone would set

# Store errors a write can raise that mean "another writer got there first".
_CAS_CONFLICTS = (MetadataVersionError,)
_CREATE_CONFLICTS = (MetadataVersionError, NodeExistsError, NoNodeError)


class _NoChange:
    def __repr__(self) -> str:
        return "NO_CHANGE"


NO_CHANGE: Any = _NoChange()
"""A transform's answer for "leave the node as it is" (nothing is written)."""


@dataclasses.dataclass(frozen=True)
class Updated:
    """The value now stored and its version; ``changed`` when this call wrote it."""

    value: Any
    version: int
    changed: bool


def backoff_cap_ms(attempt: int, base_ms: float = limits.METADATA_BACKOFF_MS_BASE,
                   max_ms: float = limits.METADATA_BACKOFF_MS_MAX) -> float:
    """The longest sleep after the ``attempt``-th conflict (0-based)."""
    return min(max_ms, base_ms * 2 ** min(attempt, _EXPONENT_MAX))


class MetadataUpdateLoop:
    """Read / transform / CAS / retry on one store (see the module docstring)."""

    def __init__(self, store, *, sleep: Callable[[float], None] = time.sleep,
                 rng: random.Random | None = None,
                 backoff_ms_base: float = limits.METADATA_BACKOFF_MS_BASE,
                 backoff_ms_max: float = limits.METADATA_BACKOFF_MS_MAX):
        self.store = store
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._backoff_ms_base = backoff_ms_base
        self._backoff_ms_max = backoff_ms_max

    def update(self, path: str, transform: Callable[[Any], Any], *,
               decode: Callable[[bytes], Any], encode: Callable[[Any], bytes],
               retries_max: int, expected_version: int | None = None,
               create_missing: bool = False,
               missing_error: Callable[[NoNodeError], Exception] | None = None,
               action: str = "") -> Updated:
        """Apply ``transform`` (value -> new value or ``NO_CHANGE``; raise to
        abort) to the node at ``path``.

        A missing node raises ``NoNodeError`` (or ``missing_error(exc)``) when
        read; with ``create_missing`` the transform gets ``None`` instead and
        the node is created with its answer (parents too).  ``action`` names
        the change in the give-up message."""
        if retries_max < 0:
            raise ValueError(f"retries_max must be >= 0, got {retries_max}")
        conflicts = _CREATE_CONFLICTS if create_missing else _CAS_CONFLICTS
        tries = 1 if expected_version is not None else retries_max + 1
        for attempt in range(tries):
            current, version = self._read(path, decode, create_missing, missing_error)
            if expected_version is not None and version != expected_version:
                found = "no node" if version is None else version
                raise MetadataVersionError(f"{path}: expected version {expected_version}, "
                                           f"found {found}")
            updated = transform(current)
            if updated is NO_CHANGE:
                return Updated(current, version, changed=False)
            try:
                return Updated(updated, self._write(path, encode(updated), version), True)
            except conflicts as exc:
                if expected_version is not None:
                    raise
                if attempt + 1 == tries:
                    doing = f" {action}" if action else ""
                    raise MetadataVersionError(
                        f"{path}: gave up{doing} after {retries_max} conflicts") from exc
                self._back_off(attempt)
        raise AssertionError("unreachable: the last try returns or raises")

    def _read(self, path, decode, create_missing, missing_error) -> tuple[Any, int | None]:
        try:
            data, version = self.store.get(path)
        except NoNodeError as exc:
            if create_missing:
                return None, None
            if missing_error is not None:
                raise missing_error(exc) from exc
            raise
        return decode(data), version

    def _write(self, path: str, data: bytes, version: int | None) -> int:
        if version is None:  # read as missing: create, and lose to a concurrent creator
            self.store.create(path, data, make_parents=True)
            return 0  # a created node's version
        return self.store.set(path, data, version)

    def _back_off(self, attempt: int) -> None:
        cap_ms = backoff_cap_ms(attempt, self._backoff_ms_base, self._backoff_ms_max)
        self._sleep(self._rng.random() * cap_ms / 1000)
