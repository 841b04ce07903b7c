"""The ZooKeeper-shaped metadata store API every backend implements.

Guarantees (both backends, checked by ``tests/metadata``):

* A node is a path with bytes and a version.  ``create`` gives version 0,
  every ``set`` adds one.  ``set``/``delete`` with an ``expected_version``
  are compare-and-swap: they apply only if the node still has that version,
  else raise ``MetadataVersionError``; for a given version exactly one writer
  wins.  ``ANY_VERSION`` (-1) skips the check.
* A node's parent must exist (``NoNodeError``), a node with children cannot
  be deleted (``NotEmptyError``), an ephemeral node cannot have children.
* Sequential nodes get a 10-digit, zero-padded suffix, unique and increasing
  under one parent (not necessarily consecutive).
* Ephemeral nodes belong to the store's session and disappear when it is
  closed, or when its owner dies: within ``session_timeout_ms`` of the
  owner's death (SQLite: lease; ZooKeeper: server-side session timeout).
  If a live store loses its session (stalled for longer than the timeout),
  it opens a new one and calls the session listeners, so owners can
  re-create their ephemeral nodes.
* ``wait_for_change`` / ``wait_for_children_change`` block until the node
  (or its children) differs from what the caller knows, or the timeout
  passes (``None``; a read already in flight may add its own bounded
  operation timeout).
* Errors are the ``appliance.protocol.errors`` metadata classes; messages name the
  path, or the endpoint when the store is unreachable
  (``MetadataUnavailableError``).  Operations on a closed store raise
  ``ClientClosedError``.  Bad arguments raise ``ValueError``/``TypeError``
  before anything is sent.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable

from appliance.protocol import limits
from appliance.protocol.errors import ClientClosedError

log = logging.getLogger(__name__)

ANY_VERSION = -1
DATA_BYTES_MAX = limits.METADATA_DATA_BYTES_MAX  # public (storage.metadata); the value: limits
SEQUENCE_DIGITS = 10

SessionListener = Callable[[], None]


def validate_path(path: object) -> str:
    """An absolute, normalised node path, or ``ValueError`` naming it."""
    if not isinstance(path, str):
        raise TypeError(f"path must be a str, got {type(path).__name__}")
    if not path.startswith("/"):
        raise ValueError(f"path must start with '/': {path!r}")
    if len(path) > limits.METADATA_PATH_CHARS_MAX:
        raise ValueError(f"path longer than {limits.METADATA_PATH_CHARS_MAX} characters: "
                         f"{path[:40]!r}...")
    if path == "/":
        return path
    parts = path[1:].split("/")
    for part in parts:
        if part in ("", ".", "..") or not part.isprintable():
            raise ValueError(f"bad path {path!r}: empty, '.', '..' or unprintable component")
    return path


def parent_of(path: str) -> str:
    if path == "/":
        raise ValueError("the root has no parent")
    head = path.rsplit("/", 1)[0]
    return head or "/"


def join(parent: str, name: str) -> str:
    return f"{parent.rstrip('/')}/{name}"


def check_data(data: object) -> bytes:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(f"data must be bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) > limits.METADATA_DATA_BYTES_MAX:  # the message names the public constant
        raise ValueError(f"data is {len(data)} bytes; DATA_BYTES_MAX is "
                         f"{limits.METADATA_DATA_BYTES_MAX}")
    return data


def check_version(expected_version: object) -> int:
    if not isinstance(expected_version, int) or isinstance(expected_version, bool):
        raise TypeError(f"expected_version must be an int, got {type(expected_version).__name__}")
    if expected_version < ANY_VERSION:
        raise ValueError(f"expected_version must be >= -1, got {expected_version}")
    return expected_version


def check_timeout(timeout_s: object) -> float:
    if not isinstance(timeout_s, int | float) or isinstance(timeout_s, bool):
        raise TypeError(f"timeout_s must be a number, got {type(timeout_s).__name__}")
    if timeout_s < 0:
        raise ValueError(f"timeout_s must be >= 0, got {timeout_s}")
    return float(timeout_s)


class MetadataStore(ABC):
    """A compare-and-swap tree of nodes with sessions.  Thread-safe; use one
    per process (it holds one session) and close it (or use ``with``)."""

    def __init__(self, uri: str, session_timeout_ms: int):
        if session_timeout_ms <= 0:
            raise ValueError(f"session_timeout_ms must be > 0, got {session_timeout_ms}")
        self.uri = uri
        self.session_timeout_ms = session_timeout_ms
        self._closed = False
        self._listeners: list[SessionListener] = []
        self._listeners_lock = threading.Lock()

    # -- public API: validation here, the work in the backend ---------------
    def create(self, path: str, data: bytes = b"", *, sequential: bool = False,
               ephemeral: bool = False, make_parents: bool = False) -> str:
        """Create a node; return its path (with the suffix if sequential).
        ``make_parents`` creates missing ancestors as empty persistent nodes."""
        path = validate_path(path)
        if path == "/":
            raise ValueError("the root always exists")
        self._check_open()
        return self._create(path, check_data(data), bool(sequential), bool(ephemeral),
                            bool(make_parents))

    def get(self, path: str) -> tuple[bytes, int]:
        """(data, version), or ``NoNodeError``."""
        path = validate_path(path)
        self._check_open()
        return self._get(path)

    def set(self, path: str, data: bytes, expected_version: int) -> int:
        """Replace the data if the version is still ``expected_version``;
        return the new version.  ``MetadataVersionError`` on conflict."""
        path = validate_path(path)
        data, expected_version = check_data(data), check_version(expected_version)
        self._check_open()
        return self._set(path, data, expected_version)

    def delete(self, path: str, expected_version: int = ANY_VERSION) -> None:
        path = validate_path(path)
        if path == "/":
            raise ValueError("the root cannot be deleted")
        expected_version = check_version(expected_version)
        self._check_open()
        self._delete(path, expected_version)

    def exists(self, path: str) -> bool:
        path = validate_path(path)
        self._check_open()
        return self._exists(path)

    def ephemeral_owner(self, path: str) -> str | None:
        """The ``session_id`` owning an ephemeral node; ``None`` if persistent."""
        path = validate_path(path)
        self._check_open()
        return self._ephemeral_owner(path)

    def sync(self, path: str = "/") -> None:
        """Bring this session up to date: reads issued after it returns see
        every write acknowledged (to anyone) before it was called.  A no-op
        where every read is already current (SQLite); ZooKeeper's ``sync``
        (a follower may otherwise serve reads behind the leader)."""
        path = validate_path(path)
        self._check_open()
        self._sync(path)

    def _sync(self, path: str) -> None:  # noqa: B027 - optional for backends
        return None

    def children(self, path: str) -> list[str]:
        """Names (not paths) of the direct children, sorted."""
        path = validate_path(path)
        self._check_open()
        return sorted(self._children(path))

    def wait_for_change(self, path: str, known_version: int,
                        timeout_s: float) -> tuple[bytes, int] | None:
        """Block until the node's version is not ``known_version`` and return
        (data, version); ``None`` if the timeout passes first; ``NoNodeError``
        if the node does not exist (or is deleted while waiting)."""
        path = validate_path(path)
        known_version, timeout_s = check_version(known_version), check_timeout(timeout_s)
        self._check_open()
        return self._wait_for_change(path, known_version, timeout_s)

    def wait_for_children_change(self, path: str, known: list[str] | set[str],
                                 timeout_s: float) -> list[str] | None:
        """Block until the set of child names differs from ``known``; return
        the new sorted list, or ``None`` on timeout."""
        path = validate_path(path)
        known_set, timeout_s = set(known), check_timeout(timeout_s)
        self._check_open()
        result = self._wait_for_children_change(path, known_set, timeout_s)
        return None if result is None else sorted(result)

    @property
    @abstractmethod
    def session_id(self) -> str:
        """The current session (ephemeral nodes belong to it)."""

    def add_session_listener(self, listener: SessionListener) -> None:
        """Call ``listener()`` (from a background thread) after the session was
        lost and replaced: every ephemeral node of this store is gone."""
        with self._listeners_lock:
            self._listeners.append(listener)

    def remove_session_listener(self, listener: SessionListener) -> None:
        with self._listeners_lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def close(self) -> None:
        """End the session (its ephemeral nodes go at once) and free resources.
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._close()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.uri}>"

    # -- helpers for backends -------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError(f"metadata store {self.uri} is closed")

    def _notify_session_lost(self) -> None:
        """Run the listeners in a fresh thread (never in a backend's I/O thread)."""
        with self._listeners_lock:
            listeners = list(self._listeners)
        if not listeners or self._closed:
            return

        def run() -> None:
            for listener in listeners:
                try:
                    listener()
                except Exception:  # a listener's failure must not stop the others
                    log.exception("session listener %r failed on %s", listener, self.uri)

        threading.Thread(target=run, name="metadata-session-listeners", daemon=True).start()

    # -- backend operations ---------------------------------------------------
    @abstractmethod
    def _create(self, path: str, data: bytes, sequential: bool, ephemeral: bool,
                make_parents: bool) -> str: ...

    @abstractmethod
    def _get(self, path: str) -> tuple[bytes, int]: ...

    @abstractmethod
    def _set(self, path: str, data: bytes, expected_version: int) -> int: ...

    @abstractmethod
    def _delete(self, path: str, expected_version: int) -> None: ...

    @abstractmethod
    def _exists(self, path: str) -> bool: ...

    @abstractmethod
    def _ephemeral_owner(self, path: str) -> str | None: ...

    @abstractmethod
    def _children(self, path: str) -> list[str]: ...

    @abstractmethod
    def _wait_for_change(self, path: str, known_version: int,
                         timeout_s: float) -> tuple[bytes, int] | None: ...

    @abstractmethod
    def _wait_for_children_change(self, path: str, known: set[str],
                                  timeout_s: float) -> list[str] | None: ...

    @abstractmethod
    def _close(self) -> None: ...
