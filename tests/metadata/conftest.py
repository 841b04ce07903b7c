"""The backend fixture: every contract test runs once on SQLite and once on
the real ZooKeeper of ``tests/support/zookeeper.py``, each in a fresh namespace."""

from __future__ import annotations

import sqlite3

import pytest
from kazoo.client import KazooClient

from storage.metadata import open_store

# Short sessions keep the expiry tests quick.  ZooKeeper's is longer: its
# client heartbeats over TCP and a busy 2-core machine must not expire it.
SESSION_TIMEOUT_MS = {"sqlite": 1_000, "zk": 2_000}
# Slack over the stated expiry bound for a loaded machine (scheduling, GC).
EXPIRY_SLACK_S = 5.0


class Backend:
    """Opens stores on one fresh namespace of one backend; closes them all."""

    def __init__(self, name: str, uri: str):
        self.name = name
        self.uri = uri
        self.session_timeout_ms = SESSION_TIMEOUT_MS[name]
        self._stores = []

    @property
    def expiry_bound_s(self) -> float:
        return self.session_timeout_ms / 1000 + EXPIRY_SLACK_S

    def open(self, **options):
        options.setdefault("session_timeout_ms", self.session_timeout_ms)
        store = open_store(self.uri, **options)
        self._stores.append(store)
        return store

    def expire_session(self, store) -> None:
        """End ``store``'s session behind its back, as a long stall would."""
        if self.name == "sqlite":
            session = int(store.session_id.removeprefix("sqlite-"))
            with sqlite3.connect(store.db_path) as conn:
                conn.execute("UPDATE sessions SET expires_ms = 0 WHERE id = ?", (session,))
            conn.close()
            return
        # ZooKeeper: attach to the same session and close it (the server ends it).
        session_id, password = store._zk.client_id
        other = KazooClient(hosts=store.hosts, client_id=(session_id, password))
        other.start(timeout=10)
        other.stop()
        other.close()

    def close_all(self) -> None:
        for store in self._stores:
            store.close()


@pytest.fixture(params=["sqlite", "zk"])
def backend(request, tmp_path):
    if request.param == "sqlite":
        uri = f"sqlite:///{tmp_path / 'metadata.db'}"
    else:
        uri = request.getfixturevalue("zookeeper").new_uri()
    b = Backend(request.param, uri)
    try:
        yield b
    finally:
        b.close_all()


@pytest.fixture
def store(backend):
    return backend.open()
