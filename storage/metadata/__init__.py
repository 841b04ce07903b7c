"""The metadata store backends: a ZooKeeper-shaped compare-and-swap tree
(SQLite or a real ZooKeeper, chosen by URI).  The BookKeeper metadata model
on top (ledgers, bookie registry) is ``appliance.meta``.

    store = open_store("sqlite:///metadata.db", base_dir=config_dir)
    store = open_store("zk://127.0.0.1:2181,127.0.0.1:2182/appliance")

See ``api.py`` for the guarantees every backend gives, and
``docs/METADATA.md``.
"""

from __future__ import annotations

from pathlib import Path

from appliance.protocol import limits
from appliance.protocol.errors import ConfigError
from storage.metadata.api import ANY_VERSION, DATA_BYTES_MAX, MetadataStore, validate_path

SCHEMES = "sqlite:///relative.db, sqlite:////absolute.db or zk://host:port[,host:port]/chroot"

__all__ = ["ANY_VERSION", "DATA_BYTES_MAX", "MetadataStore", "open_store", "parse_uri"]


def parse_uri(uri: str, base_dir: str | Path | None = None) -> tuple[str, dict]:
    """("sqlite", {"db_path"}) or ("zk", {"hosts", "chroot"}); ``ConfigError``
    naming the URI and the accepted forms otherwise."""
    if not isinstance(uri, str):
        raise TypeError(f"metadata uri must be a str, got {type(uri).__name__}")
    if uri.startswith("sqlite://"):
        return "sqlite", {"db_path": _sqlite_path(uri, base_dir)}
    if uri.startswith("zk://"):
        hosts, chroot = _zk_parts(uri)
        return "zk", {"hosts": hosts, "chroot": chroot}
    raise ConfigError(f"metadata uri {uri!r} is not supported; use {SCHEMES}")


def _sqlite_path(uri: str, base_dir: str | Path | None) -> Path:
    rest = uri[len("sqlite://"):]
    if not rest.startswith("/") or len(rest) < 2 or rest.endswith("/"):
        raise ConfigError(f"metadata uri {uri!r}: a SQLite uri names a file: "
                          "sqlite:///relative.db or sqlite:////absolute.db")
    if "?" in rest or ":memory:" in rest:
        raise ConfigError(f"metadata uri {uri!r}: options and :memory: are not supported "
                          "(every process must share one file)")
    path = Path(rest[1:])
    if not path.is_absolute():
        path = Path(base_dir or Path.cwd()) / path
    return path


def _zk_parts(uri: str) -> tuple[str, str]:
    rest = uri[len("zk://"):]
    hosts, slash, chroot = rest.partition("/")
    chroot = "/" + chroot.rstrip("/") if slash else ""
    if chroot == "/":
        chroot = ""
    for host in hosts.split(","):
        name, colon, port = host.rpartition(":")
        if not colon or not name or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"metadata uri {uri!r}: each ZooKeeper host must be host:port "
                              f"(got {host!r})")
    if chroot:
        try:
            validate_path(chroot)
        except ValueError as exc:
            raise ConfigError(f"metadata uri {uri!r}: bad chroot ({exc})") from exc
    return hosts, chroot


def open_store(uri: str, *, base_dir: str | Path | None = None,
               session_timeout_ms: int = limits.METADATA_SESSION_TIMEOUT_MS,
               connect_timeout_ms: int = limits.METADATA_CONNECT_TIMEOUT_MS,
               **options) -> MetadataStore:
    """Open the store a URI names.  Relative SQLite paths resolve against
    ``base_dir`` (the config file's folder), else the working directory.

    ``session_timeout_ms`` trades how fast a dead process's ephemeral nodes
    (bookie registrations) disappear against how long a live but stalled
    process may pause before it loses them.  ``connect_timeout_ms`` bounds the
    wait for an unreachable ZooKeeper.  Backend options: SQLite
    ``busy_timeout_ms``, ``poll_interval_ms``; ZooKeeper ``op_timeout_ms``.
    """
    kind, parts = parse_uri(uri, base_dir)
    if kind == "sqlite":
        # each backend loads with its first store: a SQLite process never
        # imports kazoo, nor a ZooKeeper one sqlite-utils
        from storage.metadata.sqlite_store import SqliteStore

        return SqliteStore(parts["db_path"], session_timeout_ms=session_timeout_ms,
                           **options)
    from storage.metadata.zk_store import ZkStore  # see above

    return ZkStore(parts["hosts"], parts["chroot"], uri=uri,
                   session_timeout_ms=session_timeout_ms,
                   connect_timeout_ms=connect_timeout_ms, **options)
