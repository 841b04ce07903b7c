"""What only the SQLite backend has: URIs and files, row checksums, the
file lock, and lease arithmetic on an injected clock."""

from __future__ import annotations

import sqlite3
import threading

import pytest

from appliance.errors import (
    ConfigError,
    CorruptMetadataError,
    MetadataUnavailableError,
    NoNodeError,
)
from storage.metadata import open_store, parse_uri
from storage.metadata.sqlite_store import SqliteStore
from tests.support.launch import wait_for


class FakeClock:
    def __init__(self, now_ms: int = 1_000_000):
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


def test_uri_paths_resolve_against_base_dir(tmp_path):
    assert parse_uri("sqlite:///meta.db", base_dir=tmp_path) == ("sqlite",
                                                                 {"db_path": tmp_path / "meta.db"})
    assert parse_uri("sqlite:////abs/dir/m.db", base_dir=tmp_path)[1]["db_path"].as_posix() \
        == "/abs/dir/m.db"
    with open_store("sqlite:///sub.db", base_dir=tmp_path) as store:
        store.create("/x", b"1")
    assert (tmp_path / "sub.db").exists()
    with open_store(f"sqlite:///{tmp_path}/sub.db") as store:  # same file, absolute
        assert store.get("/x") == (b"1", 0)


@pytest.mark.parametrize("uri", ["sqlite://", "sqlite:///", "sqlite://host/x.db",
                                 "sqlite:///:memory:", "sqlite:///m.db?mode=ro", "mysql://x",
                                 "zk://", "zk://host", "zk://h:99999/x", "zk://h:1/a//b"])
def test_bad_uris_are_config_errors_naming_the_uri(uri):
    with pytest.raises(ConfigError, match="metadata uri"):
        parse_uri(uri)


def test_missing_directory_is_a_clear_error(tmp_path):
    with pytest.raises(MetadataUnavailableError, match="does not exist"):
        open_store("sqlite:///no/such/dir/m.db", base_dir=tmp_path)


def test_file_that_is_not_a_database_is_refused_naming_it(tmp_path):
    path = tmp_path / "junk.db"
    path.write_bytes(b"this is not sqlite" * 400)
    with pytest.raises(CorruptMetadataError, match="junk.db"):
        open_store(f"sqlite:///{path}")


def test_flipped_row_is_detected_by_its_checksum(tmp_path):
    db = tmp_path / "m.db"
    with SqliteStore(db) as store:
        store.create("/victim", b"important")
        store.create("/bystander", b"fine")
        with sqlite3.connect(db) as raw:
            raw.execute("UPDATE nodes SET data = ? WHERE path = '/victim'", (b"importanT",))
        raw.close()
        with pytest.raises(CorruptMetadataError, match="/victim"):
            store.get("/victim")
        with pytest.raises(CorruptMetadataError, match="/victim"):
            store.set("/victim", b"x", 0)
        assert store.get("/bystander") == (b"fine", 0)


def test_settings_are_wal_and_full_sync(tmp_path):
    with SqliteStore(tmp_path / "m.db") as store:
        conn = store._conn
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == store.busy_timeout_ms


def test_writer_blocked_past_busy_timeout_gets_unavailable_and_writes_nothing(tmp_path):
    db = tmp_path / "m.db"
    with SqliteStore(db, busy_timeout_ms=100, heartbeat=False) as store:
        blocker = sqlite3.connect(db, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(MetadataUnavailableError, match="busy"):
                store.create("/x", b"")
            assert store.exists("/") and not store.exists("/x")  # readers are not blocked
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        store.create("/x", b"")


def test_lease_expiry_is_decided_by_the_reader_clock(tmp_path):
    clock = FakeClock()
    db = tmp_path / "m.db"
    owner = SqliteStore(db, session_timeout_ms=1_000, clock_ms=clock, heartbeat=False)
    reader = SqliteStore(db, session_timeout_ms=1_000, clock_ms=clock, heartbeat=False)
    try:
        owner.create("/e", b"", ephemeral=True)
        clock.now_ms += 999
        assert reader.exists("/e")
        owner.renew_session()  # a heartbeat extends the lease to now + timeout
        clock.now_ms += 999
        assert reader.exists("/e")
        clock.now_ms += 1  # exactly one timeout after the last renewal: gone
        assert not reader.exists("/e")
        with pytest.raises(NoNodeError):
            reader.get("/e")
        assert reader.children("/") == []
        reader.create("/e", b"taken over", ephemeral=True)  # the next writer purges the row
        assert reader.get("/e") == (b"taken over", 0)
    finally:
        owner.close()
        reader.close()


def test_expired_owner_gets_a_new_session_and_is_told(tmp_path):
    clock = FakeClock()
    db = tmp_path / "m.db"
    with SqliteStore(db, clock_ms=clock, heartbeat=False) as owner:
        told = threading.Event()
        owner.add_session_listener(told.set)
        owner.create("/e", b"", ephemeral=True)
        first = owner.session_id
        clock.now_ms += owner.session_timeout_ms  # stalled for a whole timeout
        owner.renew_session()  # a late heartbeat must not resurrect the lease
        assert owner.session_id != first
        wait_for(told.is_set, timeout_s=10, what="session listener")
        assert not owner.exists("/e")


def test_leases_of_a_previous_boot_are_dead(tmp_path):
    db = tmp_path / "m.db"
    before = SqliteStore(db, boot_id="boot-1", heartbeat=False)
    before.create("/e", b"", ephemeral=True)
    before.create("/p", b"")
    after = SqliteStore(db, boot_id="boot-2", heartbeat=False)
    try:
        assert not after.exists("/e") and after.exists("/p")
    finally:
        after.close()
        before.close()


def test_store_closed_from_another_thread_stops_a_waiter(tmp_path):
    store = SqliteStore(tmp_path / "m.db")
    store.create("/w", b"")
    errors = []

    def wait():
        try:
            store.wait_for_change("/w", 0, 60)
        except Exception as exc:  # expected: ClientClosedError
            errors.append(exc)

    thread = threading.Thread(target=wait)
    thread.start()
    store.close()
    thread.join(30)
    assert not thread.is_alive()
    assert [type(e).__name__ for e in errors] == ["ClientClosedError"]


def test_store_does_not_import_pandas_but_leaves_it_importable(tmp_path):
    """Opening a SQLite store in a fresh process must not pull in pandas (the
    spark extra installs it; sqlite-utils would import it: ~70 MB per client),
    and the application can still import pandas itself afterwards."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from storage.metadata import open_store\n"
        f"s = open_store('sqlite:///{tmp_path}/md.db')\n"
        "s.create('/x', b'1')\n"
        "assert s.get('/x')[0] == b'1'\n"
        "print('pandas' in sys.modules)\n"
        "s.close()\n"
        "try:\n"
        "    import pandas\n"
        "    print('importable', pandas.__name__)\n"
        "except ImportError as exc:\n"
        "    print('missing', exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout.split("\n")
    assert out[0] == "False"
    import importlib.util
    if importlib.util.find_spec("pandas") is not None:
        assert out[1] == "importable pandas"


def test_only_the_first_open_imports_sqlite_utils(tmp_path):
    """sqlite-utils creates the schema; every later open (each client's)
    only reads its version, so a client's heap, which every full garbage
    collection scans, does not carry sqlite-utils' ~12,000 objects."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from storage.metadata import open_store\n"
        f"s = open_store('sqlite:///{tmp_path}/md.db')\n"
        "if not s.exists('/x'):\n"
        "    s.create('/x', b'1')\n"
        "print(s.get('/x')[0] == b'1', 'sqlite_utils' in sys.modules)\n"
        "s.close()\n"
    )
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=120, check=True).stdout.split() for _ in range(2)]
    assert runs == [["True", "True"], ["True", "False"]]


def test_a_store_of_another_schema_version_is_refused_naming_it(tmp_path):
    from appliance.errors import MetadataError

    with open_store(f"sqlite:///{tmp_path}/md.db") as store:
        store.create("/x", b"1")
    conn = sqlite3.connect(tmp_path / "md.db")
    conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema'")
    conn.commit()
    conn.close()
    with pytest.raises(MetadataError, match="schema version 99"):
        open_store(f"sqlite:///{tmp_path}/md.db")
