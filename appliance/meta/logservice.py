"""The log service's records in the metadata store: live log servers and the
ownership lease of each log.

* ``/logservice/servers/<id>``: an ephemeral node on the server's session
  holding its endpoint and pid.  It vanishes when the server closes its
  store or dies (within the session timeout: a SQLite session is a lease
  row with an expiry renewed by a heartbeat, a ZooKeeper one a real
  session), so ``servers()`` lists live servers only.
* ``/logservice/owners/<log>``: the ownership lease, an ephemeral node on
  the owner's session holding its id and endpoint.  ``acquire`` is a create
  (the store's compare-and-set: it fails while another session holds it);
  the lease ends by ``release`` (delete, by its holder only) or by the
  expiry of the holder's session.  A new owner takes the log only after
  either.  Safety does not rest on the lease alone: the new owner's log
  writer fences the previous owner's segment (``appliance.logs.writer``),
  so an owner that outlived its lease cannot add another record.

Records are in the checksummed envelope of ``records.py``; a damaged one is
skipped by ``servers()`` (with a warning) and read as no owner by
``owner()``.
"""

from __future__ import annotations

import logging

from appliance.errors import (
    CorruptMetadataError,
    MetadataVersionError,
    NodeExistsError,
    NoNodeError,
)
from appliance.meta.bookies import check_bookie_id, publish_ephemeral
from appliance.meta.records import decode_json_record, encode_json_record
from appliance.protocol.logs import check_log_name

log = logging.getLogger(__name__)

SERVERS_ROOT = "/logservice/servers"
OWNERS_ROOT = "/logservice/owners"


def _decode(data: bytes, path: str) -> dict:
    return decode_json_record(data, path, "a log service record", ("endpoint",))


class LogServiceRegistry:
    """Server registrations and ownership leases on one store (the calling
    process's session)."""

    def __init__(self, store):
        self.store = store

    # -- servers ---------------------------------------------------------------------
    def register(self, server_id: str, endpoint: str, info: dict, stale_wait_ms: int) -> None:
        """Announce a live server; waits up to ``stale_wait_ms`` for a
        registration of the same id by an earlier (dead) session to expire."""
        path = f"{SERVERS_ROOT}/{check_bookie_id(server_id)}"
        publish_ephemeral(self.store, path, encode_json_record({"endpoint": endpoint, **info}),
                          stale_wait_ms)

    def unregister(self, server_id: str) -> None:
        try:
            self.store.delete(f"{SERVERS_ROOT}/{check_bookie_id(server_id)}")
        except NoNodeError:
            pass

    def forget_dead_server(self, server_id: str) -> list[str]:
        """A server known dead (its supervisor saw its process exit: dead,
        not silent): delete its registration and every lease its session
        holds now, instead of when that session expires, so its logs move to
        a live server at once and its restart registers at once.  Only nodes
        of the dead session go (a restarted server's are kept); safety never
        rested on the lease (the next owner's writer fences the segment).
        Returns the logs whose lease went."""
        path = f"{SERVERS_ROOT}/{check_bookie_id(server_id)}"
        session = self._owner_session(path)
        if session is None:
            return []  # not registered (or already expired): its leases went with it
        try:
            names = self.store.children(OWNERS_ROOT)
        except NoNodeError:
            names = []
        released = [name for name in names
                    if self._delete_if_owned(f"{OWNERS_ROOT}/{name}", session)]
        self._delete_if_owned(path, session)
        return released

    def _owner_session(self, path: str) -> str | None:
        try:
            return self.store.ephemeral_owner(path)
        except NoNodeError:
            return None

    def _delete_if_owned(self, path: str, session: str) -> bool:
        """Delete ``path`` if it is an ephemeral node of ``session``."""
        try:
            _, version = self.store.get(path)
            if self.store.ephemeral_owner(path) != session:
                return False
            self.store.delete(path, version)
            return True
        except (NoNodeError, MetadataVersionError):
            return False  # gone meanwhile, or another session's now

    @staticmethod
    def server_record(server_id: str, data: bytes) -> dict:
        """A registration's record from its bytes (``CorruptMetadataError``
        if damaged): {"endpoint", "pid", ...}."""
        return _decode(data, f"{SERVERS_ROOT}/{server_id}")

    def servers(self) -> dict[str, dict]:
        """Live servers: id -> {"endpoint", "pid", ...}."""
        try:
            names = self.store.children(SERVERS_ROOT)
        except NoNodeError:
            return {}
        out = {}
        for name in names:
            path = f"{SERVERS_ROOT}/{name}"
            try:
                out[name] = _decode(self.store.get(path)[0], path)
            except NoNodeError:
                continue
            except CorruptMetadataError as exc:
                log.warning("skipping log server %s: %s", name, exc)
        return out

    # -- ownership leases -----------------------------------------------------------------
    def owner(self, log_name: str) -> dict | None:
        """The lease of ``log_name``: {"server", "endpoint"}, or None."""
        path = f"{OWNERS_ROOT}/{check_log_name(log_name)}"
        try:
            return _decode(self.store.get(path)[0], path)
        except NoNodeError:
            return None
        except CorruptMetadataError as exc:
            log.warning("%s", exc)
            return None

    def acquire(self, log_name: str, server_id: str, endpoint: str) -> bool:
        """Take the lease (True), or find it held by another session (False)."""
        path = f"{OWNERS_ROOT}/{check_log_name(log_name)}"
        try:
            self.store.create(path, encode_json_record({"server": server_id, "endpoint": endpoint}),
                              ephemeral=True, make_parents=True)
            return True
        except NodeExistsError:
            return self.holds(log_name)

    def holds(self, log_name: str) -> bool:
        """Does this process's session hold the lease of ``log_name``?"""
        path = f"{OWNERS_ROOT}/{check_log_name(log_name)}"
        return self.store.ephemeral_owner(path) == self.store.session_id

    def release(self, log_name: str) -> None:
        """End the lease if this session holds it."""
        path = f"{OWNERS_ROOT}/{check_log_name(log_name)}"
        try:
            if self.holds(log_name):
                self.store.delete(path)
        except NoNodeError:
            pass
