"""The appliance config: one TOML file per deployment, loaded into frozen
dataclasses and refused early with one clear line when it is wrong.

Guarantees:

* ``load_config(path)`` either returns a fully validated ``ApplianceConfig``
  or raises ``ConfigError`` with ONE line of the form
  ``<file>: <key>: <problem>; fix: <what to do>`` (e.g.
  ``bookies[2].journal_dir``; ``bookies`` are counted from 0).  It checks
  unknown keys (suggesting the closest), missing required keys, types and
  ranges, duplicate bookie ids / endpoints / directories (also nested or
  symlinked ones), endpoint schemes, the metadata URI scheme, quorums
  against the number of bookies, and the [storage] cross-field rules.
* Relative paths (``*_dir``, ``ipc://rel``, ``sqlite:///rel``) resolve against
  the folder of the config file; ``sqlite:////abs`` and ``ipc:///abs`` are
  absolute.  Resolved values are stored, so every process agrees.
* ``load_config`` touches no file but the config itself.  ``check_host``
  does the host checks the supervisor runs before starting anything: every
  directory exists or can be created, allowed CPUs, and O_DIRECT support of
  each data directory's filesystem (unless ``storage.direct_io = false``).

Every key, its default and what it trades off: ``docs/CONFIG.md``.  The
default of every limit (``*_max``, timeouts, retries) is read from
``appliance.protocol.limits``, the one place it is defined.
"""

from __future__ import annotations

import difflib
import mmap
import os
import re
import socket
import tomllib
import uuid
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from types import MappingProxyType

from appliance.errors import ConfigError
from appliance.protocol import limits

MiB = 1024 * 1024
BOOKIE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,252}$")  # a host or rack name


def _key(default=MISSING, low: float | None = None, high: float | None = None,
         choices: tuple | None = None):
    """A config key: its default (MISSING = required) and its allowed range."""
    return field(default=default, metadata={"low": low, "high": high, "choices": choices})


# -- sections ---------------------------------------------------------------------
@dataclass(frozen=True)
class MetadataConfig:
    uri: str = _key()
    session_timeout_ms: int = _key(limits.METADATA_SESSION_TIMEOUT_MS, 1_000, 600_000)
    connect_timeout_ms: int = _key(limits.METADATA_CONNECT_TIMEOUT_MS, 100, 600_000)
    # zk:// only: an owner-only file holding user:password (ZooKeeper digest
    # auth); every metadata node is then readable and writable by it alone.
    auth_file: Path = _key("")

    def store_options(self) -> dict:
        """The ``open_store`` keywords of this section (the URI aside)."""
        options = {"session_timeout_ms": self.session_timeout_ms,
                   "connect_timeout_ms": self.connect_timeout_ms}
        if self.auth_file:
            options["auth_file"] = str(self.auth_file)
        return options


@dataclass(frozen=True)
class BookieConfig:
    id: str = _key()
    journal_dir: Path = _key()
    ledger_dir: Path = _key()
    endpoint: str = _key()
    cpus: tuple[int, ...] = _key(())
    metrics_address: str = _key("")
    # Placement labels (appliance.protocol.placement): write sets spread over
    # distinct hosts (and racks).  host "" = this machine's hostname.
    host: str = _key("")
    rack: str = _key("default-rack")


@dataclass(frozen=True)
class ServerConfig:
    drain_messages_max: int = _key(limits.SERVER_DRAIN_MESSAGES_MAX, 1, 65_536)
    batch_entries_max: int = _key(limits.SERVER_BATCH_ENTRIES_MAX, 1, 65_536)
    batch_bytes_max: int = _key(limits.SERVER_BATCH_BYTES_MAX, 1, 2**31)
    long_polls_max: int = _key(limits.SERVER_LONG_POLLS_MAX, 0, 1_000_000)
    wait_lac_timeout_ms_max: int = _key(limits.SERVER_WAIT_LAC_TIMEOUT_MS_MAX, 1, 3_600_000)
    queue_messages_max: int = _key(limits.SERVER_QUEUE_MESSAGES_MAX, 1, 1_000_000)
    disk_usage_max: float = _key(0.95, 0.01, 1.0)
    disk_usage_resume: float = _key(0.90, 0.01, 1.0)
    disk_check_interval_ms: int = _key(5_000, 10, 3_600_000)
    gc_interval_ms: int = _key(60_000, 100, 86_400_000)
    # A ledger whose metadata no longer names this bookie (in a fragment that
    # holds entries) is deleted here after being seen so this long (0 = never).
    overreplicated_grace_ms: int = _key(600_000, 0, 30 * 86_400_000)
    cookie_auto_fix: bool = _key(False)
    cluster_key_file: Path = _key("")
    socket_group: str = _key("")
    # A read of a ledger whose key the bookie holds must carry that key
    # (false: reads without a key are served, as BookKeeper does).
    reads_need_key: bool = _key(True)


@dataclass(frozen=True)
class ClientConfig:
    ensemble: int = _key(3, 1, 1024)
    write_quorum: int = _key(3, 1, 1024)
    ack_quorum: int = _key(2, 1, 1024)
    digest: str = _key("crc32c", choices=("crc32c", "hmac-sha256"))
    add_timeout_ms: int = _key(limits.CLIENT_ADD_TIMEOUT_MS, 1, 3_600_000)
    read_timeout_ms: int = _key(limits.CLIENT_READ_TIMEOUT_MS, 1, 3_600_000)
    add_retries_max: int = _key(limits.CLIENT_ADD_RETRIES_MAX, 0, 100)
    inflight_adds_max: int = _key(limits.CLIENT_INFLIGHT_ADDS_MAX, 1, 1_000_000)
    inflight_bytes_max: int = _key(limits.CLIENT_INFLIGHT_BYTES_MAX, 1, 2**40)
    inflight_per_bookie_max: int = _key(limits.CLIENT_INFLIGHT_PER_BOOKIE_MAX, 1, 1_000_000)
    add_batch_entries_max: int = _key(limits.CLIENT_ADD_BATCH_ENTRIES_MAX, 1, 65_536)
    add_linger_us: int = _key(2_000, 0, 60_000_000)
    add_batches_inflight: int = _key(1, 1, 1_000)
    add_messages_inflight: int = _key(1, 0, 1_000)  # per bookie; 0: no hold (see CONFIG.md)
    add_batch_bytes_max: int = _key(limits.CLIENT_ADD_BATCH_BYTES_MAX, 1, 2**31)
    read_batch_entries_max: int = _key(limits.CLIENT_READ_BATCH_ENTRIES_MAX, 1, 65_536)
    read_batch_bytes_max: int = _key(limits.CLIENT_READ_BATCH_BYTES_MAX, 1, 2**31)
    explicit_lac_interval_ms: int = _key(1_000, 0, 3_600_000)
    reconnect_ivl_ms: int = _key(100, 1, 60_000)
    reconnect_ivl_max_ms: int = _key(limits.CLIENT_RECONNECT_IVL_MAX_MS, 1, 600_000)
    placement: str = _key("host", choices=("host", "rack", "none"))
    # 0: leave the process's garbage collector as it is; N: connect() sets
    # Python's youngest-generation threshold to N (process-wide; see CONFIG.md)
    gc_threshold: int = _key(0, 0, 10_000_000)
    # 0: leave the process's thread switch interval as it is; N: connect()
    # raises Python's sys.setswitchinterval to N microseconds (process-wide)
    switch_interval_us: int = _key(0, 0, 1_000_000)


@dataclass(frozen=True)
class SupervisorConfig:
    restart_backoff_min_ms: int = _key(100, 1, 600_000)
    restart_backoff_max_ms: int = _key(limits.SUPERVISOR_RESTART_BACKOFF_MAX_MS, 1, 3_600_000)
    restarts_max: int = _key(limits.SUPERVISOR_RESTARTS_MAX, 0, 1_000_000)
    restart_window_ms: int = _key(60_000, 1, 86_400_000)
    ping_interval_ms: int = _key(1_000, 10, 600_000)
    ping_timeout_ms: int = _key(limits.SUPERVISOR_PING_TIMEOUT_MS, 10, 600_000)
    start_timeout_ms: int = _key(limits.SUPERVISOR_START_TIMEOUT_MS, 100, 86_400_000)
    stop_timeout_ms: int = _key(limits.SUPERVISOR_STOP_TIMEOUT_MS, 100, 3_600_000)
    # Where the supervisor keeps its state file and the bookies' logs
    # ("" = a folder ".<config name>.run" beside the config file).
    run_dir: Path = _key("")


@dataclass(frozen=True)
class AutoRecoveryConfig:
    enabled: bool = _key(True)
    lost_bookie_delay_ms: int = _key(30_000, 0, 86_400_000)
    check_interval_ms: int = _key(60_000, 100, 86_400_000)
    open_ledger_grace_ms: int = _key(30_000, 0, 86_400_000)


@dataclass(frozen=True)
class LogConfig:
    """``[log]``: the log layer's writer (seed 003).  Segments use the
    ``[client]`` quorums."""

    flush_bytes: int = _key(128 * 1024, 1, 64 * MiB)
    flush_interval_us: int = _key(1_000, 0, 60_000_000)
    control_interval_ms: int = _key(2, 0, 3_600_000)
    segment_bytes_max: int = _key(limits.LOG_SEGMENT_BYTES_MAX, 0, 2**50)
    segment_records_max: int = _key(limits.LOG_SEGMENT_RECORDS_MAX, 0, 2**50)
    segment_age_ms: int = _key(3_600_000, 0, 30 * 86_400_000)


@dataclass(frozen=True)
class SecurityConfig:
    """``[security]``: ZeroMQ CURVE on tcp endpoints (``appliance.curve``)."""

    curve: bool = _key(False)
    key_file: Path = _key("")
    authorized_keys_dir: Path = _key("")
    trusted_keys_dir: Path = _key("")


@dataclass(frozen=True)
class StorageConfig:
    """``[storage]``: the fields of ``storage.options.StorageOptions`` (read
    as ``config.storage.direct_io``)."""

    values: Mapping[str, object] = field(default_factory=dict)

    def __getattr__(self, name: str):
        if name == "values":
            raise AttributeError(name)
        try:
            return self.values[name]
        except KeyError:
            raise AttributeError(name) from None

    def to_options(self):
        from storage.options import StorageOptions

        return StorageOptions(**self.values).validate()


@dataclass(frozen=True)
class ApplianceConfig:
    path: Path
    base_dir: Path
    metadata: MetadataConfig
    bookies: tuple[BookieConfig, ...]
    storage: StorageConfig
    server: ServerConfig
    client: ClientConfig
    supervisor: SupervisorConfig
    autorecovery: AutoRecoveryConfig = AutoRecoveryConfig()
    log: LogConfig = LogConfig()
    security: SecurityConfig = SecurityConfig()

    @property
    def run_path(self) -> Path:
        """The supervisor's run folder (state file, bookie logs)."""
        if self.supervisor.run_dir:
            return Path(self.supervisor.run_dir)
        return self.base_dir / f".{self.path.stem}.run"

    @property
    def cluster_key_path(self) -> Path:
        """The cluster private key (``appliance.meta.custody``)."""
        if self.server.cluster_key_file:
            return Path(self.server.cluster_key_file)
        return self.run_path / "cluster.key"

    def bookie(self, bookie_id: str) -> BookieConfig:
        for b in self.bookies:
            if b.id == bookie_id:
                return b
        raise KeyError(bookie_id)

    def wire_limits(self):
        """The wire limits every bookie and client of this config enforce."""
        from appliance.protocol.entry import ENTRY_OVERHEAD_MAX
        from ipc.frames import WireLimits

        return WireLimits(entry_bytes_max=self.storage.entry_bytes_max + ENTRY_OVERHEAD_MAX,
                          batch_entries_max=self.server.batch_entries_max,
                          batch_bytes_max=self.server.batch_bytes_max)


SECTIONS = {"metadata": MetadataConfig, "bookies": BookieConfig, "storage": StorageConfig,
            "server": ServerConfig, "client": ClientConfig, "supervisor": SupervisorConfig,
            "autorecovery": AutoRecoveryConfig, "log": LogConfig, "security": SecurityConfig}


# -- errors -------------------------------------------------------------------------
def parse_host_port(text: str) -> tuple[str, int]:
    """``host:port`` -> (host, port); ValueError naming the problem."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{text!r} is not host:port (e.g. 127.0.0.1:0)")
    return host.strip("[]"), int(port)


class _Refusal(Exception):
    def __init__(self, key: str, problem: str, fix: str):
        super().__init__(key, problem, fix)
        self.key, self.problem, self.fix = key, problem, fix


def _suggest(name: str, known, fmt: str = "{}") -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    listing = ", ".join(fmt.format(k) for k in known)
    return f"did you mean {fmt.format(close[0])}?" if close else f"use one of {listing}"


# -- loading ------------------------------------------------------------------------
def load_config(path: str | os.PathLike) -> ApplianceConfig:
    """Read and validate a config file; ``ConfigError`` (one line) if it is wrong."""
    path = Path(path).expanduser().absolute()
    try:
        with open(path, "rb") as fh:
            doc = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found; fix: pass --config PATH or set "
                          "BKCTL_CONFIG") from None
    except (OSError, tomllib.TOMLDecodeError) as exc:
        one_line = " ".join(str(exc).split())
        raise ConfigError(f"{path}: cannot read TOML ({one_line}); fix: correct the syntax "
                          "at that line") from None
    try:
        return _build(path, doc)
    except _Refusal as r:
        raise ConfigError(f"{path}: {r.key}: {r.problem}; fix: {r.fix}") from None


def _build(path: Path, doc: dict) -> ApplianceConfig:
    base = path.parent
    for name in doc:
        if name not in SECTIONS:
            raise _Refusal(name, "unknown section", _suggest(name, SECTIONS, "[{}]"))
    if "metadata" not in doc:
        raise _Refusal("metadata", "missing section",
                       'add [metadata] with uri = "sqlite:///metadata.db"')
    metadata = _section(doc, "metadata", MetadataConfig, base)
    metadata = replace(metadata, uri=_metadata_uri(metadata.uri, base))
    if metadata.auth_file and not metadata.uri.startswith("zk://"):
        raise _Refusal("metadata.auth_file", "applies to ZooKeeper (zk://) metadata only",
                       "remove auth_file or use a zk:// uri")
    config = ApplianceConfig(
        path=path, base_dir=base, metadata=metadata, bookies=_bookies(doc, base),
        storage=_storage(doc.get("storage", {})),
        server=_section(doc, "server", ServerConfig, base),
        client=_section(doc, "client", ClientConfig, base),
        supervisor=_section(doc, "supervisor", SupervisorConfig, base),
        autorecovery=_section(doc, "autorecovery", AutoRecoveryConfig, base),
        log=_section(doc, "log", LogConfig, base),
        security=_section(doc, "security", SecurityConfig, base))
    _check_distinct(config.bookies)
    _check_cross(config)
    return config


def _section(doc: dict, name: str, cls, base: Path):
    table = doc.get(name, {})
    if not isinstance(table, dict):
        raise _Refusal(name, "must be a table", f"write it as [{name}] followed by keys")
    return cls(**_read_table(table, cls, name, base))


def _read_table(table: dict, cls, where: str, base: Path) -> dict:
    known = {f.name: f for f in fields(cls)}
    for name in table:
        if name not in known:
            raise _Refusal(f"{where}.{name}", "unknown key", _suggest(name, known))
    values = {}
    for name, f in known.items():
        if name not in table:
            if f.default is MISSING:
                table_name = "that [[bookies]] table" if "[" in where else f"[{where}]"
                raise _Refusal(f"{where}.{name}", "missing required key",
                               f"add {name} = ... to {table_name}")
            continue
        values[name] = _convert(f"{where}.{name}", table[name], f.type, f.metadata, base)
    return values


def _convert(key: str, value, kind: str, meta: Mapping, base: Path):
    if kind in ("int", "float"):
        ok = isinstance(value, int | float) if kind == "float" else isinstance(value, int)
        if not ok or isinstance(value, bool):
            raise _Refusal(key, f"must be {'a number' if kind == 'float' else 'an integer'}, "
                           f"got {value!r}", "write a number without quotes")
        _check_range(key, value, meta)
        return float(value) if kind == "float" else value
    if kind == "bool":
        if not isinstance(value, bool):
            raise _Refusal(key, f"must be true or false, got {value!r}",
                           "write true or false without quotes")
        return value
    if kind == "tuple[int, ...]":
        if not isinstance(value, list) or not all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
            raise _Refusal(key, f"must be a list of CPU numbers, got {value!r}",
                           "write e.g. [0, 1]")
        if len(set(value)) != len(value):
            raise _Refusal(key, f"lists a CPU twice: {value}", "list each CPU once")
        return tuple(value)
    if not isinstance(value, str) or not value.strip():
        raise _Refusal(key, f"must be a non-empty string, got {value!r}", "quote the value")
    if meta.get("choices") and value not in meta["choices"]:
        raise _Refusal(key, f"{value!r} is not supported",
                       "use one of " + ", ".join(meta["choices"]))
    if kind == "Path":
        return Path(os.path.abspath(base / Path(value).expanduser()))
    return value


def _check_range(key: str, value, meta: Mapping) -> None:
    low, high = meta.get("low"), meta.get("high")
    if (low is not None and value < low) or (high is not None and value > high):
        raise _Refusal(key, f"{value} is out of range", f"use a value in [{low}, {high}]")


# -- metadata -----------------------------------------------------------------------
def _metadata_uri(uri: str, base: Path) -> str:
    """The URI with a relative SQLite path made absolute (``sqlite:////abs``)."""
    from storage.metadata import parse_uri

    if not uri.startswith(("sqlite://", "zk://")):
        raise _Refusal("metadata.uri", f"{uri!r} has an unsupported scheme",
                       'use "sqlite:///rel/path.db", "sqlite:////abs/path.db" or '
                       '"zk://host:port[,host:port]/chroot"')
    try:
        kind, parts = parse_uri(uri, base)
    except ConfigError as exc:
        raise _Refusal("metadata.uri", str(exc).rstrip("."), "correct the URI") from None
    if kind == "sqlite":
        return "sqlite:///" + os.path.abspath(parts["db_path"])
    return uri


# -- bookies ------------------------------------------------------------------------
def _bookies(doc: dict, base: Path) -> tuple[BookieConfig, ...]:
    tables = doc.get("bookies")
    if tables is None:
        raise _Refusal("bookies", "no bookies configured",
                       "add a [[bookies]] table with id, journal_dir, ledger_dir, endpoint")
    if not isinstance(tables, list) or not tables or not all(
            isinstance(t, dict) for t in tables):
        raise _Refusal("bookies", "must be an array of tables",
                       "write each bookie as its own [[bookies]] table")
    out = []
    for i, table in enumerate(tables):
        where = f"bookies[{i}]"
        values = _read_table(table, BookieConfig, where, base)
        if not BOOKIE_ID.match(values["id"]):
            raise _Refusal(f"{where}.id", f"{values['id']!r} is not a valid id",
                           "use 1-64 letters, digits, '.', '_' or '-', starting with a "
                           "letter or digit")
        values["endpoint"] = _endpoint(f"{where}.endpoint", values["endpoint"], base)
        if values.get("metrics_address"):
            try:
                parse_host_port(values["metrics_address"])
            except ValueError as exc:
                raise _Refusal(f"{where}.metrics_address", str(exc),
                               "set host:port (port 0 picks a free one) or leave it empty "
                               "(no metrics)") from None
        for name in ("host", "rack"):
            if name in values and not LABEL.match(values[name]):
                raise _Refusal(f"{where}.{name}", f"{values[name]!r} is not a valid {name}",
                               "use 1-253 of A-Z a-z 0-9 . _ : / -, starting alphanumeric")
        values["host"] = values.get("host") or socket.gethostname()
        out.append(BookieConfig(**values))
    return tuple(out)


def _endpoint(key: str, endpoint: str, base: Path) -> str:
    if endpoint.startswith("ipc://"):
        rest = endpoint[len("ipc://"):]
        if not rest or rest.endswith("/"):
            raise _Refusal(key, f"{endpoint!r} names no socket file",
                           'use "ipc://data/bookie-1.sock"')
        path = os.path.abspath(base / Path(rest).expanduser())
        if len(path.encode()) > limits.IPC_PATH_BYTES_MAX:
            raise _Refusal(key, f"the socket path {path} is over {limits.IPC_PATH_BYTES_MAX} bytes",
                           "use a shorter path or a tcp:// endpoint")
        return "ipc://" + path
    if endpoint.startswith("tcp://"):
        host, colon, port = endpoint[len("tcp://"):].rpartition(":")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise _Refusal(key, f"{endpoint!r} is not tcp://host:port",
                           'use e.g. "tcp://127.0.0.1:3181" (port 1-65535)')
        return endpoint
    raise _Refusal(key, f"{endpoint!r} has an unsupported scheme",
                   'use "ipc://path.sock" or "tcp://host:port"')


def _check_distinct(bookies: tuple[BookieConfig, ...]) -> None:
    seen_ids: dict[str, int] = {}
    seen_endpoints: dict[str, int] = {}
    racks: dict[str, tuple[str, int]] = {}  # one host sits in one rack (placement)
    dirs: list[tuple[str, Path]] = []
    for i, b in enumerate(bookies):
        rack, first = racks.setdefault(b.host, (b.rack, i))
        if rack != b.rack:
            raise _Refusal(f"bookies[{i}].rack", f"host {b.host!r} is in rack {rack!r} at "
                           f"bookies[{first}]", "give every bookie of one host the same rack")
        if b.id in seen_ids:
            raise _Refusal(f"bookies[{i}].id", f"{b.id!r} is also bookies[{seen_ids[b.id]}]",
                           "give every bookie its own id")
        seen_ids[b.id] = i
        if b.endpoint in seen_endpoints:
            raise _Refusal(f"bookies[{i}].endpoint", f"{b.endpoint} is also used by "
                           f"bookies[{seen_endpoints[b.endpoint]}]",
                           "give every bookie its own endpoint")
        seen_endpoints[b.endpoint] = i
        for name in ("journal_dir", "ledger_dir"):
            key, real = f"bookies[{i}].{name}", Path(os.path.realpath(getattr(b, name)))
            for other_key, other in dirs:
                if real == other or real in other.parents or other in real.parents:
                    raise _Refusal(key, f"{getattr(b, name)} overlaps {other_key} ({other})",
                                   "give every journal_dir and ledger_dir its own folder, "
                                   "neither inside the other")
            dirs.append((key, real))


# -- storage and cross-section rules ----------------------------------------------------
_STORAGE_REFUSAL = re.compile(r"^\[storage\] (\w+) = (.*) is invalid: (.*)$")


def _storage_fields() -> dict:
    from storage.options import StorageOptions

    return {f.name: f for f in fields(StorageOptions)}


def _storage(table) -> StorageConfig:
    if not isinstance(table, dict):
        raise _Refusal("storage", "must be a table", "write it as [storage] followed by keys")
    known = _storage_fields()
    values = {}
    for name, value in table.items():
        if name not in known:
            raise _Refusal(f"storage.{name}", "unknown key", _suggest(name, known))
        values[name] = _convert(f"storage.{name}", value, known[name].type, {"low": 0},
                                Path("."))
    defaults = {n: f.default for n, f in known.items() if f.default is not MISSING}
    merged = {**defaults, **values}
    try:
        StorageConfig(merged).to_options()
    except ConfigError as exc:  # "[storage] key = value is invalid: set it to ..."
        match = _STORAGE_REFUSAL.match(str(exc))
        if match is None:
            raise _Refusal("storage", str(exc), "correct the [storage] table") from None
        key, value, fix = match.groups()
        raise _Refusal(f"storage.{key}", f"{value} is invalid", fix) from None
    return StorageConfig(MappingProxyType(merged))


def _check_cross(c: ApplianceConfig) -> None:
    cl, n = c.client, len(c.bookies)
    # With zk:// metadata other hosts' bookies join the ensembles too: the
    # count is checked when a ledger is created (NotEnoughBookiesError).
    if cl.ensemble > n and not c.metadata.uri.startswith("zk://"):
        raise _Refusal("client.ensemble", f"{cl.ensemble} is more than the {n} configured "
                       "bookies", "lower client.ensemble (and write_quorum, ack_quorum) or "
                       "add [[bookies]]")
    if cl.write_quorum > cl.ensemble:
        raise _Refusal("client.write_quorum", f"{cl.write_quorum} is above ensemble "
                       f"({cl.ensemble})", "keep ensemble >= write_quorum >= ack_quorum")
    if cl.ack_quorum > cl.write_quorum:
        raise _Refusal("client.ack_quorum", f"{cl.ack_quorum} is above write_quorum "
                       f"({cl.write_quorum})", "keep ensemble >= write_quorum >= ack_quorum")
    pairs = [
        ("client.add_batch_entries_max", cl.add_batch_entries_max,
         "server.batch_entries_max", c.server.batch_entries_max),
        ("client.read_batch_entries_max", cl.read_batch_entries_max,
         "server.batch_entries_max", c.server.batch_entries_max),
        ("client.add_batch_bytes_max", cl.add_batch_bytes_max,
         "server.batch_bytes_max", c.server.batch_bytes_max),
        ("storage.entry_bytes_max", c.storage.entry_bytes_max,
         "server.batch_bytes_max", c.server.batch_bytes_max),
        ("client.reconnect_ivl_ms", cl.reconnect_ivl_ms,
         "client.reconnect_ivl_max_ms", cl.reconnect_ivl_max_ms),
        ("server.disk_usage_resume", c.server.disk_usage_resume,
         "server.disk_usage_max", c.server.disk_usage_max),
        ("supervisor.restart_backoff_min_ms", c.supervisor.restart_backoff_min_ms,
         "supervisor.restart_backoff_max_ms", c.supervisor.restart_backoff_max_ms),
    ]
    for key, value, limit_key, limit in pairs:
        if value > limit:
            raise _Refusal(key, f"{value} is above {limit_key} ({limit})",
                           f"lower {key} or raise {limit_key}")
    if c.security.curve and not c.security.key_file:
        raise _Refusal("security.key_file", "required when curve = true",
                       'run `bkctl keys generate NAME` and set key_file = "NAME.key_secret"')


# -- host checks (the supervisor runs these before starting anything) ---------------------
def nearest_existing(path: Path) -> Path:
    """``path`` or its closest existing ancestor."""
    path = Path(os.path.abspath(path))
    while not path.exists():
        path = path.parent
    return path


def probe_direct_io(directory: Path, open_fn: Callable[..., int] = os.open) -> str | None:
    """None if a 4 KiB O_DIRECT write works in ``directory`` (or its nearest
    existing ancestor), else the reason.  The probe file is removed."""
    if not hasattr(os, "O_DIRECT"):
        return "this platform has no O_DIRECT"
    probe = nearest_existing(directory) / f".bk-direct-io-probe-{uuid.uuid4().hex[:12]}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_DIRECT
    try:
        fd = open_fn(probe, flags, 0o600)
    except OSError as exc:
        return f"open with O_DIRECT failed ({exc.strerror or exc})"
    try:
        with mmap.mmap(-1, 4096) as aligned:  # page-aligned buffer
            os.write(fd, aligned)
    except OSError as exc:
        return f"an aligned O_DIRECT write failed ({exc.strerror or exc})"
    finally:
        os.close(fd)
        probe.unlink(missing_ok=True)
    return None


def check_host(config: ApplianceConfig, *,
               open_fn: Callable[..., int] = os.open) -> None:
    """Refuse (ConfigError, one line) what this host cannot run: a
    metadata.auth_file that is missing, open to others or malformed, a data
    path that is not a directory or cannot be created, a CPU this process may not
    use, a data directory without O_DIRECT (unless storage.direct_io = false),
    unusable CURVE keys ([security], ``appliance.curve``)."""
    if config.metadata.auth_file:
        from storage.metadata.zk_auth import read_credentials

        read_credentials(config.metadata.auth_file)  # refused here, before any process
    try:
        _check_paths(config)
        from appliance.curve import check_security

        check_security(config)  # CURVE keys usable (ConfigError, one line)
        if config.storage.direct_io:
            for i, b in enumerate(config.bookies):
                for name in ("journal_dir", "ledger_dir"):
                    reason = probe_direct_io(getattr(b, name), open_fn)
                    if reason:
                        raise _Refusal(f"bookies[{i}].{name}", f"{getattr(b, name)} does not "
                                       f"support direct I/O: {reason}",
                                       "put it on a filesystem that supports O_DIRECT (ext4, "
                                       "xfs) or set [storage] direct_io = false")
    except _Refusal as r:
        raise ConfigError(f"{config.path}: {r.key}: {r.problem}; fix: {r.fix}") from None


def _check_paths(config: ApplianceConfig) -> None:
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    paths = []
    if config.metadata.uri.startswith("sqlite://"):
        paths.append(("metadata.uri", Path(config.metadata.uri[len("sqlite:///"):]), False))
    for i, b in enumerate(config.bookies):
        paths += [(f"bookies[{i}].journal_dir", b.journal_dir, True),
                  (f"bookies[{i}].ledger_dir", b.ledger_dir, True)]
        if b.endpoint.startswith("ipc://"):
            paths.append((f"bookies[{i}].endpoint", Path(b.endpoint[len("ipc://"):]), False))
        bad = [cpu for cpu in b.cpus if allowed is not None and cpu not in allowed]
        if bad:
            raise _Refusal(f"bookies[{i}].cpus", f"CPUs {bad} are not available here "
                           f"(allowed: {sorted(allowed)})", "list only available CPUs")
    for key, path, is_dir in paths:
        if path.exists() and is_dir and not path.is_dir():
            raise _Refusal(key, f"{path} exists and is not a directory",
                           "point it at a directory or remove the file")
        base = nearest_existing(path if is_dir else path.parent)
        if not base.is_dir() or not os.access(base, os.W_OK | os.X_OK):
            raise _Refusal(key, f"{path} cannot be created: {base} is not a writable directory",
                           "fix the permissions or choose another location")


# -- what a client connects to ---------------------------------------------------------
def resolve_target(path_or_uri: str | os.PathLike) -> tuple[str, Path, ApplianceConfig | None]:
    """(metadata URI, base dir, config or None) for ``appliance.connect``:
    a metadata URI (``sqlite://``, ``zk://``; a relative SQLite path resolves
    against the working directory) or the path of a config file."""
    text = os.fspath(path_or_uri)
    if isinstance(text, str) and "://" in text:
        base = Path.cwd()
        try:
            return _metadata_uri(text, base), base, None
        except _Refusal as r:
            raise ConfigError(f"{text}: {r.problem}; fix: {r.fix}") from None
    config = load_config(text)
    return config.metadata.uri, config.base_dir, config
