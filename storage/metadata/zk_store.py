"""The ZooKeeper metadata backend, through kazoo.

Guarantees: those of ZooKeeper itself (linearizable writes, durable once
acknowledged, versioned CAS, ephemeral nodes tied to a server-side session)
mapped onto the ``MetadataStore`` API and error classes.

Faults it survives, and how it reports the ones it cannot:

* No server answers at start: ``MetadataUnavailableError`` naming the hosts
  after ``connect_timeout_ms`` (never a hang).
* The connection drops: kazoo reconnects in the background; an operation
  that does not complete within ``op_timeout_ms`` raises
  ``MetadataUnavailableError``.  Its outcome is then unknown (a write may
  have been applied): callers re-read before retrying.
* Session expiry: kazoo opens a new session; the session listeners run so
  that owners re-create their ephemeral nodes.
* A chroot that does not exist yet is created at open.
* With ``auth_file`` (``zk_auth.read_credentials``), the session carries the
  digest identity and every node it creates (the chroot and its parents
  too) gets ``zk_auth.owner_acl``: a client without those credentials can
  neither read nor change the metadata, and gets ``MetadataAuthError``
  naming the path and the fix, never a generic error.
"""

from __future__ import annotations

import logging
import threading
import time

from kazoo import exceptions as kz
from kazoo.client import KazooClient, KazooState
from kazoo.retry import KazooRetry

from appliance.protocol import limits
from appliance.protocol.errors import (
    MetadataAuthError,
    MetadataError,
    MetadataUnavailableError,
    MetadataVersionError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
)
from storage.metadata.api import MetadataStore, parent_of
from storage.metadata.zk_auth import owner_acl, read_credentials

log = logging.getLogger(__name__)

# A waiter re-reads at least this often even without a watch event.
WATCH_REREAD_S = 1.0

class ZkStore(MetadataStore):
    def __init__(self, hosts: str, chroot: str = "", *, uri: str | None = None,
                 session_timeout_ms: int = limits.METADATA_SESSION_TIMEOUT_MS,
                 connect_timeout_ms: int = limits.METADATA_CONNECT_TIMEOUT_MS,
                 op_timeout_ms: int | None = None, auth_file: str | None = None):
        super().__init__(uri or f"zk://{hosts}{chroot}", session_timeout_ms)
        self.hosts = hosts
        self.chroot = chroot.rstrip("/")
        self.connect_timeout_ms = connect_timeout_ms
        # An operation that has not completed within a session timeout will
        # not complete on this session: give up and report it.
        self.op_timeout_ms = op_timeout_ms or session_timeout_ms
        self._lost = False
        retry = KazooRetry(max_tries=-1, delay=0.05,
                           max_delay=limits.METADATA_ZK_RECONNECT_DELAY_MAX_S)
        auth = {}
        if auth_file:
            user, password = read_credentials(auth_file)
            auth = {"auth_data": [("digest", f"{user}:{password}")],
                    "default_acl": owner_acl(user, password)}
        self._zk = KazooClient(hosts=hosts, timeout=session_timeout_ms / 1000,
                               connection_retry=retry, logger=log, **auth)
        try:
            self._zk.start(timeout=connect_timeout_ms / 1000)
        except Exception as exc:  # KazooTimeoutError, resolver errors, ...
            self._zk.stop()
            self._zk.close()
            raise MetadataUnavailableError(
                f"zk://{hosts}: no ZooKeeper server answered within "
                f"{connect_timeout_ms} ms ({type(exc).__name__}: {exc})") from exc
        self._zk.add_listener(self._on_state)
        if self.chroot:
            try:
                self._call(self._zk.ensure_path_async(self.chroot), self.chroot)
            except BaseException:
                self._stop_client()
                raise
            self._zk.chroot = self.chroot

    # -- plumbing -------------------------------------------------------------
    def _call(self, async_result, path: str, verb: str = ""):
        """Wait for a kazoo async result, mapping errors to ours."""
        try:
            return async_result.get(timeout=self.op_timeout_ms / 1000)
        except kz.NoNodeError as exc:
            raise NoNodeError(f"{path}: no such node{verb}") from exc
        except kz.NodeExistsError as exc:
            raise NodeExistsError(f"{path}: node exists") from exc
        except kz.BadVersionError as exc:
            raise MetadataVersionError(f"{path}: version is not the expected one") from exc
        except kz.NotEmptyError as exc:
            raise NotEmptyError(f"{path}: node has children") from exc
        except kz.NoChildrenForEphemeralsError as exc:
            raise MetadataError(f"{parent_of(path)}: an ephemeral node cannot have "
                                "children") from exc
        except self._zk.handler.timeout_exception as exc:
            raise MetadataUnavailableError(
                f"{self.uri}: no answer within {self.op_timeout_ms} ms for {path} "
                "(outcome unknown)") from exc
        except (kz.ConnectionLoss, kz.SessionExpiredError, kz.ConnectionClosedError,
                kz.OperationTimeoutError) as exc:
            raise MetadataUnavailableError(
                f"{self.uri}: {type(exc).__name__} during an operation on {path} "
                "(outcome unknown)") from exc
        except (kz.NoAuthError, kz.AuthFailedError) as exc:
            raise MetadataAuthError(
                f"{self.uri}: ZooKeeper refused {path} to this client ({type(exc).__name__}: "
                "no or wrong digest credentials); fix: set [metadata] auth_file to the "
                "file holding the appliance's user:password") from exc
        except kz.ZookeeperError as exc:
            raise MetadataError(f"{path}: ZooKeeper error {type(exc).__name__}: {exc}") from exc

    def _on_state(self, state: str) -> None:
        """kazoo's state listener (runs in kazoo's thread: must not block)."""
        if state == KazooState.LOST:
            self._lost = True
        elif state == KazooState.CONNECTED and self._lost:
            self._lost = False
            log.warning("%s: ZooKeeper session expired; new session %s", self.uri,
                        self.session_id)
            self._notify_session_lost()

    @property
    def session_id(self) -> str:
        client_id = self._zk.client_id
        return f"zk-{client_id[0]:x}" if client_id else "zk-none"

    # -- operations -----------------------------------------------------------
    def _create(self, path, data, sequential, ephemeral, make_parents) -> str:
        result = self._zk.create_async(path, data, ephemeral=ephemeral, sequence=sequential,
                                       makepath=make_parents)
        try:
            return self._call(result, path)
        except NoNodeError as exc:
            raise NoNodeError(f"{parent_of(path)}: no such node (parent of {path})") from exc

    def _get(self, path):
        data, stat = self._call(self._zk.get_async(path), path)
        return data, stat.version

    def _set(self, path, data, expected_version) -> int:
        stat = self._call(self._zk.set_async(path, data, expected_version), path)
        return stat.version

    def _delete(self, path, expected_version) -> None:
        self._call(self._zk.delete_async(path, expected_version), path)

    def _exists(self, path) -> bool:
        return self._call(self._zk.exists_async(path), path) is not None

    def _ephemeral_owner(self, path) -> str | None:
        stat = self._call(self._zk.exists_async(path), path)
        if stat is None:
            raise NoNodeError(f"{path}: no such node")
        return f"zk-{stat.ephemeralOwner:x}" if stat.ephemeralOwner else None

    def _sync(self, path) -> None:
        self._call(self._zk.sync_async(path), path)

    def _children(self, path) -> list[str]:
        return list(self._call(self._zk.get_children_async(path), path))

    def _wait_for_change(self, path, known_version, timeout_s):
        deadline, fired = time.monotonic() + timeout_s, threading.Event()

        def watch(_event) -> None:
            fired.set()

        while True:
            fired.clear()
            data, stat = self._call(self._zk.get_async(path, watch=watch), path)
            if stat.version != known_version:
                return data, stat.version
            if not self._wait_event(fired, deadline):
                return None

    def _wait_for_children_change(self, path, known, timeout_s):
        deadline, fired = time.monotonic() + timeout_s, threading.Event()

        def watch(_event) -> None:
            fired.set()

        while True:
            fired.clear()
            names = self._call(self._zk.get_children_async(path, watch=watch), path)
            if set(names) != known:
                return list(names)
            if not self._wait_event(fired, deadline):
                return None

    def _wait_event(self, fired: threading.Event, deadline: float) -> bool:
        """Wait for the watch (or at most ``WATCH_REREAD_S``, so that a watch
        lost with a session never stalls a waiter); False once the deadline
        has passed."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        fired.wait(min(remaining, WATCH_REREAD_S))
        self._check_open()
        return True

    def _stop_client(self) -> None:
        try:
            self._zk.stop()
        finally:
            self._zk.close()

    def _close(self) -> None:
        self._zk.remove_listener(self._on_state)
        self._stop_client()
