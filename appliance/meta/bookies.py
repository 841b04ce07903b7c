"""The bookie registry and cookies, on any ``MetadataStore``.

Guarantees:

* A registered bookie is an ephemeral node ``/bookies/available/<id>`` on the
  store's session holding its endpoint, read-only flag and info: it vanishes
  when the bookie closes its store or dies (within the session timeout), so
  ``available()`` lists live bookies only.
* If the store loses its session while the bookie lives (a long stall), the
  registry re-creates its registrations on the new session by itself.
* A bookie restarting before its previous session expired waits (up to
  ``stale_wait_ms``) for the old registration to vanish instead of failing.
* The read-only flag and cookies change through the one read / transform /
  CAS loop of ``update_loop.py``.
* Cookies (``/bookies/cookies/<id>``) are persistent, versioned and written
  by CAS.  Every record is in the checksummed envelope of ``records.py``;
  a damaged one raises ``CorruptMetadataError`` naming the path
  (``available()`` skips it with a warning, so one bad record does not hide
  the other bookies).
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable

from appliance.errors import (
    CorruptMetadataError,
    MetadataError,
    NodeExistsError,
    NoNodeError,
)
from appliance.meta.records import (
    decode_json_record,
    decode_record,
    encode_json_record,
    encode_record,
)
from appliance.meta.update_loop import MetadataUpdateLoop
from appliance.protocol import limits
from appliance.protocol.placement import DEFAULT_RACK, Location
from storage.metadata.api import ANY_VERSION, MetadataStore

log = logging.getLogger(__name__)

AVAILABLE_ROOT = "/bookies/available"
COOKIES_ROOT = "/bookies/cookies"
# Create attempts while a previous registration of the same id goes away.


def check_bookie_id(bookie_id: object) -> str:
    if not isinstance(bookie_id, str):
        raise TypeError(f"bookie_id must be a str, got {type(bookie_id).__name__}")
    chars_max = limits.METADATA_BOOKIE_ID_CHARS_MAX
    if not bookie_id or len(bookie_id) > chars_max or "/" in bookie_id \
            or bookie_id in (".", "..") or not bookie_id.isprintable():
        raise ValueError(f"bookie_id must be 1..{chars_max} printable characters "
                         f"without '/': {bookie_id!r}")
    return bookie_id


def _decode(data: bytes, path: str) -> dict:
    return decode_json_record(data, path, "a bookie registration", ("endpoint",))


def publish_ephemeral(store: MetadataStore, path: str, record: bytes,
                      stale_wait_ms: int) -> None:
    """Create the ephemeral node ``path`` holding ``record`` on ``store``'s
    session (updated in place if this session holds it already); waits up to
    ``stale_wait_ms`` for a node of an earlier (dead) session to expire,
    else ``NodeExistsError``."""
    deadline = time.monotonic() + stale_wait_ms / 1000
    for _ in range(limits.METADATA_PUBLISH_TRIES_MAX):
        try:
            store.create(path, record, ephemeral=True, make_parents=True)
            return
        except NodeExistsError:
            pass
        try:
            if store.ephemeral_owner(path) == store.session_id:
                store.set(path, record, ANY_VERSION)  # ours: update in place
                return
            _, version = store.get(path)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            store.wait_for_change(path, version, remaining)
        except NoNodeError:
            continue  # the old registration expired: create ours
    raise NodeExistsError(f"{path}: registered by another live session (waited "
                          f"{stale_wait_ms} ms for it to expire)")


class BookieRegistry:
    """Registrations and cookies on one store; ``sleep`` and ``rng`` (the
    back-off after a CAS conflict) are injectable."""

    def __init__(self, store: MetadataStore, *, stale_wait_ms: int | None = None,
                 sleep: Callable[[float], None] = time.sleep,
                 rng: random.Random | None = None):
        self.store = store
        self._loop = MetadataUpdateLoop(store, sleep=sleep, rng=rng)
        # How long register() waits for a previous session's registration to
        # expire: longer rides out slow expiry, shorter fails faster.
        self.stale_wait_ms = stale_wait_ms if stale_wait_ms is not None \
            else 2 * store.session_timeout_ms
        self._mine: dict[str, dict] = {}
        self._lock = threading.Lock()
        store.add_session_listener(self._reregister)

    # -- registration ----------------------------------------------------------
    def register(self, bookie_id: str, endpoint: str, info: dict | None = None,
                 read_only: bool = False) -> None:
        """Announce a live bookie (ephemeral, on this store's session)."""
        path = f"{AVAILABLE_ROOT}/{check_bookie_id(bookie_id)}"
        if not isinstance(endpoint, str) or not endpoint:
            raise ValueError(f"endpoint must be a non-empty str, got {endpoint!r}")
        doc = {"endpoint": endpoint, "read_only": bool(read_only), "info": dict(info or {})}
        json.dumps(doc)  # TypeError now, naming nothing stored, if info is not JSON
        with self._lock:
            self._mine[bookie_id] = doc
        self._publish(path, doc)

    def _publish(self, path: str, doc: dict) -> None:
        publish_ephemeral(self.store, path, encode_json_record(doc), self.stale_wait_ms)

    def _reregister(self) -> None:
        """Session listener: the old session's ephemeral nodes are gone."""
        with self._lock:
            mine = dict(self._mine)
        for bookie_id, doc in mine.items():
            try:
                self._publish(f"{AVAILABLE_ROOT}/{bookie_id}", doc)
                log.info("re-registered bookie %s on session %s", bookie_id,
                         self.store.session_id)
            except MetadataError as exc:
                log.error("could not re-register bookie %s: %s", bookie_id, exc)

    def unregister(self, bookie_id: str) -> None:
        """Remove the registration (idempotent)."""
        path = f"{AVAILABLE_ROOT}/{check_bookie_id(bookie_id)}"
        with self._lock:
            self._mine.pop(bookie_id, None)
        try:
            self.store.delete(path)
        except NoNodeError:
            pass

    def set_read_only(self, bookie_id: str, read_only: bool) -> None:
        """Flip the read-only flag of a registered bookie (CAS loop)."""
        path = f"{AVAILABLE_ROOT}/{check_bookie_id(bookie_id)}"

        def not_registered(exc: Exception) -> Exception:
            return NoNodeError(f"{path}: bookie {bookie_id} is not registered")

        self._loop.update(path, lambda doc: {**doc, "read_only": bool(read_only)},
                          decode=lambda data: _decode(data, path), encode=encode_json_record,
                          retries_max=limits.METADATA_BOOKIE_UPDATE_RETRIES_MAX,
                          missing_error=not_registered)
        with self._lock:
            if bookie_id in self._mine:
                self._mine[bookie_id]["read_only"] = bool(read_only)

    # -- queries ---------------------------------------------------------------
    def get(self, bookie_id: str) -> dict:
        """One registration: {"endpoint", "read_only", "info"}; ``NoNodeError``
        if not registered, ``CorruptMetadataError`` naming the path if damaged."""
        path = f"{AVAILABLE_ROOT}/{check_bookie_id(bookie_id)}"
        data, _ = self.store.get(path)
        return _public(_decode(data, path))

    def available(self) -> dict[str, dict]:
        """Live bookies: id -> {"endpoint", "read_only", "info"}."""
        try:
            names = self.store.children(AVAILABLE_ROOT)
        except NoNodeError:
            return {}
        result = {}
        for name in names:
            try:
                result[name] = self.get(name)
            except NoNodeError:
                continue  # went away since the listing
            except CorruptMetadataError as exc:
                log.warning("skipping bookie %s: %s", name, exc)
        return result

    def wait_for_change(self, known: set[str] | list[str], timeout_s: float) -> list[str] | None:
        """Block until the set of registered bookie ids differs from ``known``;
        the new sorted list, or ``None`` on timeout."""
        if not self.store.exists(AVAILABLE_ROOT):
            try:
                self.store.create(AVAILABLE_ROOT, make_parents=True)
            except NodeExistsError:
                pass
        return self.store.wait_for_children_change(AVAILABLE_ROOT, known, timeout_s)

    # -- cookies ---------------------------------------------------------------
    def write_cookie(self, bookie_id: str, data: bytes, expected_version: int | None = None) -> int:
        """Store a bookie's cookie; the new version.  ``expected_version=None``
        creates it (``NodeExistsError`` if one exists); an int replaces the
        cookie only at that version (``MetadataVersionError`` otherwise)."""
        path = f"{COOKIES_ROOT}/{check_bookie_id(bookie_id)}"
        if not isinstance(data, bytes):
            raise TypeError(f"cookie data must be bytes, got {type(data).__name__}")
        if expected_version == ANY_VERSION:
            raise ValueError("write_cookie replaces a cookie only at a known version")

        def put(current: bytes | None) -> bytes:
            if expected_version is None and current is not None:
                raise NodeExistsError(f"{path}: a cookie exists; pass its version to "
                                      "replace it")
            return data

        # The stored cookie is not decoded: only its presence and version count,
        # so a damaged one can still be replaced at its version.
        return self._loop.update(path, put, decode=lambda record: record, encode=encode_record,
                                 retries_max=limits.METADATA_CREATE_RACE_RETRIES_MAX,
                                 expected_version=expected_version,
                                 create_missing=expected_version is None).version

    def read_cookie(self, bookie_id: str) -> tuple[bytes, int] | None:
        """(cookie bytes, version), or ``None`` if the bookie has none."""
        path = f"{COOKIES_ROOT}/{check_bookie_id(bookie_id)}"
        try:
            data, version = self.store.get(path)
        except NoNodeError:
            return None
        return decode_record(data, path), version

    def delete_cookie(self, bookie_id: str, expected_version: int) -> None:
        """Remove a cookie at a known version (an admin action)."""
        self.store.delete(f"{COOKIES_ROOT}/{check_bookie_id(bookie_id)}", expected_version)

    def close(self) -> None:
        """Stop re-registering on session loss (the store stays open)."""
        self.store.remove_session_listener(self._reregister)


def _public(doc: dict) -> dict:
    return {"endpoint": doc["endpoint"], "read_only": bool(doc.get("read_only")),
            "info": doc.get("info", {})}


def bookie_locations(live: dict[str, dict]) -> dict:
    """Bookie id -> ``placement.Location`` from ``BookieRegistry.available()``
    (the ``host`` / ``rack`` a bookie publishes in its info; one that
    publishes no host is left out: placement counts it as its own host)."""
    out = {}
    for bookie_id, doc in live.items():
        info = doc.get("info") or {}
        host, rack = info.get("host"), info.get("rack") or DEFAULT_RACK
        if isinstance(host, str) and host and isinstance(rack, str):
            out[bookie_id] = Location(host, rack)
    return out
