"""The SQLite metadata backend: one file shared by every process on the host.

Guarantees:

* Durability: WAL journal with ``synchronous=FULL``; a call that returned has
  its change on disk.  A process killed at any point leaves either the whole
  change or none of it (SQLite transactions).
* CAS: every write runs in ``BEGIN IMMEDIATE`` (one writer at a time across
  processes); the version check and the update happen in that transaction.
* Integrity: every row carries a CRC32C over its path, version and data,
  checked on every read; a mismatch raises ``CorruptMetadataError`` naming
  the path.  A file that is not a SQLite database raises it naming the file.
* Sessions: a session is a lease row (``expires_ms``) renewed by a heartbeat
  thread every ``session_timeout_ms / 3``.  Readers treat a node whose
  owner's lease has passed as gone; the next writer deletes it.  Bound: an
  ephemeral node of a process that dies (even ``kill -9``) is gone for every
  reader at most ``session_timeout_ms`` after its death.  Leases are measured
  on CLOCK_BOOTTIME with the kernel's boot id, so wall-clock jumps do not
  expire or extend them and leases of a previous boot are dead.
* Contention: a writer waits for the file lock up to ``busy_timeout_ms``,
  then gets ``MetadataUnavailableError`` (nothing was written).

Limits: single host (SQLite over a network filesystem is not safe).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import crc32c

from appliance.protocol import limits
from appliance.protocol.errors import (
    ClientClosedError,
    CorruptMetadataError,
    MetadataError,
    MetadataUnavailableError,
    MetadataVersionError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
)
from storage.metadata.api import ANY_VERSION, SEQUENCE_DIGITS, MetadataStore, parent_of

log = logging.getLogger(__name__)


def _sqlite_utils():
    """Import sqlite-utils without letting it import pandas.

    sqlite-utils imports pandas whenever it is installed (the spark extra
    brings it) only to convert DataFrames, which this store never does; that
    import costs every client and bookie ~70 MB of memory and ~0.3-1 s of
    start-up.  pandas is hidden for the duration of the import only, so an
    application that imports pandas itself, before or after, gets it.
    """
    if "sqlite_utils" in sys.modules or "pandas" in sys.modules:
        import sqlite_utils
        return sqlite_utils
    sys.modules["pandas"] = None  # type: ignore[assignment]
    try:
        import sqlite_utils
    finally:
        if sys.modules.get("pandas", 0) is None:
            del sys.modules["pandas"]
    return sqlite_utils

SCHEMA_VERSION = 1
# How often a waiter re-reads a node: lower notices changes sooner, costs CPU.
POLL_INTERVAL_MS_DEFAULT = 10

_VISIBLE = "(n.owner IS NULL OR (s.boot_id = :boot AND s.expires_ms > :now))"


def boottime_ms() -> int:
    """Milliseconds on a clock that NTP does not move and that counts suspend."""
    clock = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)
    return time.clock_gettime_ns(clock) // 1_000_000


def kernel_boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "no-boot-id"


def row_crc(path: str, version: int, data: bytes) -> int:
    return crc32c.crc32c(data, crc32c.crc32c(f"{path}\x00{version}\x00".encode()))


class SqliteStore(MetadataStore):
    def __init__(self, db_path: str | Path, *, uri: str | None = None,
                 session_timeout_ms: int = limits.METADATA_SESSION_TIMEOUT_MS,
                 busy_timeout_ms: int = limits.METADATA_SQLITE_BUSY_TIMEOUT_MS,
                 poll_interval_ms: int = POLL_INTERVAL_MS_DEFAULT,
                 clock_ms: Callable[[], int] = boottime_ms,
                 boot_id: str | None = None, heartbeat: bool = True):
        self.db_path = Path(db_path)
        super().__init__(uri or f"sqlite:///{self.db_path}", session_timeout_ms)
        self.busy_timeout_ms = busy_timeout_ms
        self.poll_interval_ms = poll_interval_ms
        self._clock_ms = clock_ms
        self._boot_id = boot_id or kernel_boot_id()
        self._lock = threading.RLock()
        self._conn_closed = False
        if not self.db_path.parent.is_dir():
            raise MetadataUnavailableError(
                f"{self.uri}: directory {self.db_path.parent} does not exist")
        self._conn = self._connect()
        try:
            self._init_schema()
            with self._write_txn() as conn:
                self._session = self._new_session(conn)
        except BaseException:
            self._conn.close()
            raise
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None
        if heartbeat:
            self._heartbeat = threading.Thread(target=self._heartbeat_loop, daemon=True,
                                               name=f"sqlite-session-{self._session}")
            self._heartbeat.start()

    # -- connection and schema ------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        with self._errors(str(self.db_path)):
            # owner only: SQLite gives its -wal and -shm files the database's mode
            os.close(os.open(self.db_path, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600))
            conn = sqlite3.connect(self.db_path, isolation_level=None, check_same_thread=False,
                                   timeout=self.busy_timeout_ms / 1000)
            try:
                conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_ms)}")
                mode = self._enable_wal(conn)
                if mode.lower() != "wal":
                    raise MetadataUnavailableError(f"{self.uri}: cannot enable WAL (got {mode})")
                conn.execute("PRAGMA synchronous = FULL")
            except BaseException:
                conn.close()
                raise
        return conn

    def _enable_wal(self, conn: sqlite3.Connection) -> str:
        """Switch to WAL.  Several processes opening a new file at once race
        on the switch, and SQLite answers "locked" at once there (the busy
        handler does not cover it): retry within ``busy_timeout_ms``."""
        deadline = time.monotonic() + self.busy_timeout_ms / 1000
        delay_s = 0.001
        while True:
            try:
                mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
                if mode.lower() == "wal":
                    return mode
                return conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(delay_s)
                delay_s = min(delay_s * 2, 0.05)

    def _schema_present(self) -> bool:
        """The schema this code reads is in place (every open after the
        first): a read, without the write lock.  Another version raises."""
        try:
            row = self._conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return False
            raise
        if row is None:
            return False
        self._check_version(row[0])
        return True

    def _check_version(self, value: str) -> None:
        if value != str(SCHEMA_VERSION):
            raise MetadataError(f"{self.db_path}: schema version {value}, this code "
                                f"reads {SCHEMA_VERSION}")

    def _init_schema(self) -> None:
        """Create the tables on the first open.  Later opens only read the
        schema version: sqlite-utils (~12,000 objects the garbage collector
        scans in every full collection of a client's heap, and ~80 modules)
        is imported only to create it."""
        with self._errors("schema check"):
            if self._schema_present():
                return
        with self._write_txn(purge=False) as conn:
            db = _sqlite_utils().Database(conn, execute_plugins=False)
            db["meta"].create({"key": str, "value": str}, pk="key", if_not_exists=True)
            db["nodes"].create(
                {"path": str, "parent": str, "data": bytes, "version": int, "cseq": int,
                 "owner": int, "ctime_ms": int, "mtime_ms": int, "crc": int},
                pk="path", not_null={"parent", "data", "version", "cseq", "crc"},
                if_not_exists=True)
            # AUTOINCREMENT: a session id is never handed out twice, so a stalled
            # process can never renew (or own nodes of) someone else's session.
            conn.execute("CREATE TABLE IF NOT EXISTS sessions (id INTEGER PRIMARY KEY "
                         "AUTOINCREMENT, boot_id TEXT NOT NULL, expires_ms INTEGER NOT NULL, "
                         "pid INTEGER)")
            conn.execute("CREATE INDEX IF NOT EXISTS nodes_parent ON nodes(parent)")
            conn.execute("CREATE INDEX IF NOT EXISTS nodes_owner ON nodes(owner)")
            conn.execute("CREATE INDEX IF NOT EXISTS sessions_expires ON sessions(expires_ms)")
            row = conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
            if row is None:
                conn.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
                self._insert_node(conn, "/", b"", owner=None)
            else:  # another process made it since the check above
                self._check_version(row[0])

    @contextlib.contextmanager
    def _errors(self, what: str):
        """Map sqlite3 errors to the metadata error classes, naming ``what``."""
        try:
            yield
        except sqlite3.OperationalError as exc:
            text = str(exc)
            if "locked" in text or "busy" in text:
                raise MetadataUnavailableError(
                    f"{self.uri}: database busy for more than {self.busy_timeout_ms} ms "
                    f"({what}: {text})") from exc
            raise MetadataUnavailableError(f"{self.uri}: {what}: {text}") from exc
        except sqlite3.DatabaseError as exc:
            if type(exc) is not sqlite3.DatabaseError:  # IntegrityError etc.: a bug here
                raise
            # "file is not a database", "database disk image is malformed"
            raise CorruptMetadataError(f"{self.db_path}: {what}: {exc}") from exc

    def _connection(self) -> sqlite3.Connection:
        """The connection, under ``self._lock``; ``ClientClosedError`` once closed."""
        if self._conn_closed:
            raise ClientClosedError(f"metadata store {self.uri} is closed")
        return self._conn

    @contextlib.contextmanager
    def _write_txn(self, purge: bool = True):
        with self._lock, self._errors("write"):
            conn = self._connection()
            conn.execute("BEGIN IMMEDIATE")
            try:
                if purge:
                    self._purge_expired(conn)
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    @contextlib.contextmanager
    def _read_txn(self, what: str):
        with self._lock, self._errors(what):
            conn = self._connection()
            conn.execute("BEGIN")
            try:
                yield conn, {"boot": self._boot_id, "now": self._clock_ms()}
            finally:
                if conn.in_transaction:
                    conn.execute("COMMIT")

    # -- sessions -------------------------------------------------------------
    def _new_session(self, conn: sqlite3.Connection) -> int:
        cur = conn.execute(
            "INSERT INTO sessions (boot_id, expires_ms, pid) VALUES (?, ?, ?)",
            (self._boot_id, self._clock_ms() + self.session_timeout_ms, os.getpid()))
        return int(cur.lastrowid)

    def _purge_expired(self, conn: sqlite3.Connection) -> None:
        cur = conn.execute("DELETE FROM sessions WHERE expires_ms <= ? OR boot_id != ?",
                           (self._clock_ms(), self._boot_id))
        if cur.rowcount:
            conn.execute("DELETE FROM nodes WHERE owner IS NOT NULL "
                         "AND owner NOT IN (SELECT id FROM sessions)")

    def _ensure_session(self, conn: sqlite3.Connection) -> int:
        """Inside a write transaction (after the purge): our session, renewed,
        or a new one if the lease had run out (listeners are told)."""
        cur = conn.execute("UPDATE sessions SET expires_ms = ? WHERE id = ?",
                           (self._clock_ms() + self.session_timeout_ms, self._session))
        if cur.rowcount == 1:
            return self._session
        old, self._session = self._session, self._new_session(conn)
        log.warning("%s: session %s expired (lease not renewed within %d ms); new session %s",
                    self.uri, old, self.session_timeout_ms, self._session)
        self._lost_pending = True
        return self._session

    _lost_pending = False

    def renew_session(self) -> None:
        """Extend the lease (the heartbeat calls this every timeout / 3)."""
        self._check_open()
        with self._write_txn() as conn:
            self._ensure_session(conn)
        self._fire_if_lost()

    def _fire_if_lost(self) -> None:
        if self._lost_pending:
            self._lost_pending = False
            self._notify_session_lost()

    def _heartbeat_loop(self) -> None:
        interval_s = self.session_timeout_ms / 3000
        while not self._stop.wait(interval_s):
            try:
                self.renew_session()
            except Exception as exc:  # keep beating; the next try may succeed
                if self._closed:
                    return
                log.warning("%s: session heartbeat failed: %s", self.uri, exc)

    @property
    def session_id(self) -> str:
        return f"sqlite-{self._session}"  # ids are AUTOINCREMENT: never reused

    # -- rows -----------------------------------------------------------------
    def _insert_node(self, conn, path: str, data: bytes, owner: int | None) -> None:
        now = int(time.time() * 1000)
        parent = "" if path == "/" else parent_of(path)
        conn.execute(
            "INSERT INTO nodes (path, parent, data, version, cseq, owner, ctime_ms, mtime_ms, crc)"
            " VALUES (?, ?, ?, 0, 0, ?, ?, ?, ?)",
            (path, parent, data, owner, now, now, row_crc(path, 0, data)))

    def _row(self, conn, path: str) -> tuple[bytes, int, int | None, int] | None:
        """(data, version, owner, cseq) of a node, checksum verified.  Call
        inside a write transaction (after the purge: every row is live)."""
        row = conn.execute("SELECT data, version, owner, cseq, crc FROM nodes WHERE path = ?",
                           (path,)).fetchone()
        if row is None:
            return None
        self._verify(path, row[0], row[1], row[4])
        return bytes(row[0]), row[1], row[2], row[3]

    def _verify(self, path: str, data: bytes, version: int, crc: int) -> None:
        if row_crc(path, version, bytes(data)) != crc:
            raise CorruptMetadataError(f"{path}: checksum mismatch in {self.db_path}")

    # -- operations -----------------------------------------------------------
    def _create(self, path, data, sequential, ephemeral, make_parents) -> str:
        with self._write_txn() as conn:
            parent = parent_of(path)
            prow = self._row(conn, parent)
            if prow is None:
                if not make_parents:
                    raise NoNodeError(f"{parent}: no such node (parent of {path})")
                self._make_parents(conn, parent)
                prow = self._row(conn, parent)
            if prow[2] is not None:
                raise MetadataError(f"{parent}: an ephemeral node cannot have children")
            if sequential:
                path = f"{path}{prow[3]:0{SEQUENCE_DIGITS}d}"
                conn.execute("UPDATE nodes SET cseq = cseq + 1 WHERE path = ?", (parent,))
            if self._row(conn, path) is not None:
                raise NodeExistsError(f"{path}: node exists")
            owner = self._ensure_session(conn) if ephemeral else None
            self._insert_node(conn, path, data, owner)
        self._fire_if_lost()
        return path

    def _make_parents(self, conn, path: str) -> None:
        missing = []
        while self._row(conn, path) is None:
            missing.append(path)
            path = parent_of(path)
        if self._row(conn, path)[2] is not None:
            raise MetadataError(f"{path}: an ephemeral node cannot have children")
        for p in reversed(missing):
            self._insert_node(conn, p, b"", owner=None)

    def _get(self, path: str) -> tuple[bytes, int]:
        with self._read_txn(f"get {path}") as (conn, now):
            row = conn.execute(
                "SELECT n.data, n.version, n.crc FROM nodes n LEFT JOIN sessions s "
                f"ON s.id = n.owner WHERE n.path = :path AND {_VISIBLE}",
                {"path": path, **now}).fetchone()
        if row is None:
            raise NoNodeError(f"{path}: no such node")
        self._verify(path, row[0], row[1], row[2])
        return bytes(row[0]), row[1]

    def _set(self, path, data, expected_version) -> int:
        with self._write_txn() as conn:
            row = self._row(conn, path)
            if row is None:
                raise NoNodeError(f"{path}: no such node")
            if expected_version not in (ANY_VERSION, row[1]):
                raise MetadataVersionError(
                    f"{path}: expected version {expected_version}, found {row[1]}")
            version = row[1] + 1
            conn.execute(
                "UPDATE nodes SET data = ?, version = ?, mtime_ms = ?, crc = ? WHERE path = ?",
                (data, version, int(time.time() * 1000), row_crc(path, version, data), path))
        return version

    def _delete(self, path, expected_version) -> None:
        with self._write_txn() as conn:
            row = self._row(conn, path)
            if row is None:
                raise NoNodeError(f"{path}: no such node")
            if expected_version not in (ANY_VERSION, row[1]):
                raise MetadataVersionError(
                    f"{path}: expected version {expected_version}, found {row[1]}")
            if conn.execute("SELECT 1 FROM nodes WHERE parent = ? LIMIT 1", (path,)).fetchone():
                raise NotEmptyError(f"{path}: node has children")
            conn.execute("DELETE FROM nodes WHERE path = ?", (path,))

    def _exists(self, path: str) -> bool:
        with self._read_txn(f"exists {path}") as (conn, now):
            row = conn.execute(
                f"SELECT 1 FROM nodes n LEFT JOIN sessions s ON s.id = n.owner "
                f"WHERE n.path = :path AND {_VISIBLE}", {"path": path, **now}).fetchone()
        return row is not None

    def _ephemeral_owner(self, path: str) -> str | None:
        with self._read_txn(f"owner {path}") as (conn, now):
            row = conn.execute(
                f"SELECT n.owner FROM nodes n LEFT JOIN sessions s ON s.id = n.owner "
                f"WHERE n.path = :path AND {_VISIBLE}", {"path": path, **now}).fetchone()
        if row is None:
            raise NoNodeError(f"{path}: no such node")
        return None if row[0] is None else f"sqlite-{row[0]}"

    def _children(self, path: str) -> list[str]:
        with self._read_txn(f"children {path}") as (conn, now):
            query = (f"SELECT n.path FROM nodes n LEFT JOIN sessions s ON s.id = n.owner "
                     f"WHERE n.{{col}} = :path AND {_VISIBLE}")
            if conn.execute(query.format(col="path"), {"path": path, **now}).fetchone() is None:
                raise NoNodeError(f"{path}: no such node")
            rows = conn.execute(query.format(col="parent"), {"path": path, **now}).fetchall()
        return [r[0].rsplit("/", 1)[1] for r in rows]

    def _wait_for_change(self, path, known_version, timeout_s):
        deadline = time.monotonic() + timeout_s
        while True:
            data, version = self._get(path)
            if version != known_version:
                return data, version
            if not self._sleep_until(deadline):
                return None

    def _wait_for_children_change(self, path, known, timeout_s):
        deadline = time.monotonic() + timeout_s
        while True:
            names = self._children(path)
            if set(names) != known:
                return names
            if not self._sleep_until(deadline):
                return None

    def _sleep_until(self, deadline: float) -> bool:
        """Wait one poll interval (less if the deadline is nearer); False once
        the deadline has passed.  Returns early if the store is closed."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        self._stop.wait(min(remaining, self.poll_interval_ms / 1000))
        self._check_open()
        return True

    def _close(self) -> None:
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join(timeout=self.busy_timeout_ms / 1000 + 1)
        try:
            with self._write_txn() as conn:
                conn.execute("DELETE FROM nodes WHERE owner = ?", (self._session,))
                conn.execute("DELETE FROM sessions WHERE id = ?", (self._session,))
        except MetadataError as exc:  # the lease will expire on its own
            log.warning("%s: could not end session %s at close: %s", self.uri, self._session, exc)
        finally:
            with self._lock:
                self._conn_closed = True
                self._conn.close()
