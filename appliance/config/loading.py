"""Loading a config file: TOML into the schema's dataclasses, each value
converted and range-checked, relative paths resolved against the config's
folder, then the rules between keys (``appliance.config.rules``).
``load_config`` touches no file but the config itself."""

from __future__ import annotations

import os
import re
import socket
import tomllib
from collections.abc import Mapping
from dataclasses import MISSING, fields, replace
from pathlib import Path
from types import MappingProxyType

from appliance.config.refusal import Refusal, as_config_error, suggest
from appliance.config.rules import check_cross, check_distinct
from appliance.config.schema import (
    BOOKIE_ID,
    LABEL,
    SECTIONS,
    ApplianceConfig,
    AutoRecoveryConfig,
    BookieConfig,
    ClientConfig,
    ColdStorageConfig,
    LogConfig,
    MetadataConfig,
    SecurityConfig,
    ServerConfig,
    StorageConfig,
    SupervisorConfig,
)
from appliance.errors import ConfigError
from appliance.protocol import limits
from storage.metadata import parse_uri
from storage.options import StorageOptions


def parse_host_port(text: str) -> tuple[str, int]:
    """``host:port`` -> (host, port); ValueError naming the problem."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{text!r} is not host:port (e.g. 127.0.0.1:0)")
    return host.strip("[]"), int(port)


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
    except Refusal as r:
        raise as_config_error(path, r) from None


def _build(path: Path, doc: dict) -> ApplianceConfig:
    base = path.parent
    for name in doc:
        if name not in SECTIONS:
            raise Refusal(name, "unknown section", suggest(name, SECTIONS, "[{}]"))
    if "metadata" not in doc:
        raise Refusal("metadata", "missing section",
                       'add [metadata] with uri = "sqlite:///metadata.db"')
    metadata = _section(doc, "metadata", MetadataConfig, base)
    metadata = replace(metadata, uri=_metadata_uri(metadata.uri, base))
    if metadata.auth_file and not metadata.uri.startswith("zk://"):
        raise Refusal("metadata.auth_file", "applies to ZooKeeper (zk://) metadata only",
                       "remove auth_file or use a zk:// uri")
    config = ApplianceConfig(
        path=path, base_dir=base, metadata=metadata, bookies=_bookies(doc, base),
        storage=_storage(doc.get("storage", {})),
        server=_section(doc, "server", ServerConfig, base),
        client=_section(doc, "client", ClientConfig, base),
        supervisor=_section(doc, "supervisor", SupervisorConfig, base),
        autorecovery=_section(doc, "autorecovery", AutoRecoveryConfig, base),
        log=_section(doc, "log", LogConfig, base),
        security=_section(doc, "security", SecurityConfig, base),
        cold_storage=_cold_storage(doc, base))
    if config.log.metrics_address:
        try:
            parse_host_port(config.log.metrics_address)
        except ValueError as exc:
            raise Refusal("log.metrics_address", str(exc),
                           "set host:port (port 0: each log server picks a free one) or "
                           "leave it empty (no metrics)") from None
    check_distinct(config.bookies)
    check_cross(config)
    return config


def _section(doc: dict, name: str, cls, base: Path):
    table = doc.get(name, {})
    if not isinstance(table, dict):
        raise Refusal(name, "must be a table", f"write it as [{name}] followed by keys")
    return cls(**_read_table(table, cls, name, base))


def _read_table(table: dict, cls, where: str, base: Path) -> dict:
    known = {f.name: f for f in fields(cls)}
    for name in table:
        if name not in known:
            raise Refusal(f"{where}.{name}", "unknown key", suggest(name, known))
    values = {}
    for name, f in known.items():
        if name not in table:
            if f.default is MISSING:
                table_name = "that [[bookies]] table" if "[" in where else f"[{where}]"
                raise Refusal(f"{where}.{name}", "missing required key",
                               f"add {name} = ... to {table_name}")
            continue
        values[name] = _convert(f"{where}.{name}", table[name], f.type, f.metadata, base)
    return values


def _convert(key: str, value, kind: str, meta: Mapping, base: Path):
    if kind in ("int", "float"):
        ok = isinstance(value, int | float) if kind == "float" else isinstance(value, int)
        if not ok or isinstance(value, bool):
            raise Refusal(key, f"must be {'a number' if kind == 'float' else 'an integer'}, "
                           f"got {value!r}", "write a number without quotes")
        _check_range(key, value, meta)
        return float(value) if kind == "float" else value
    if kind == "bool":
        if not isinstance(value, bool):
            raise Refusal(key, f"must be true or false, got {value!r}",
                           "write true or false without quotes")
        return value
    if kind == "tuple[int, ...]":
        if not isinstance(value, list) or not all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
            raise Refusal(key, f"must be a list of CPU numbers, got {value!r}",
                           "write e.g. [0, 1]")
        if len(set(value)) != len(value):
            raise Refusal(key, f"lists a CPU twice: {value}", "list each CPU once")
        return tuple(value)
    if not isinstance(value, str) or not value.strip():
        raise Refusal(key, f"must be a non-empty string, got {value!r}", "quote the value")
    if meta.get("choices") and value not in meta["choices"]:
        raise Refusal(key, f"{value!r} is not supported",
                       "use one of " + ", ".join(meta["choices"]))
    if kind == "Path":
        return Path(os.path.abspath(base / Path(value).expanduser()))
    return value


def _check_range(key: str, value, meta: Mapping) -> None:
    low, high = meta.get("low"), meta.get("high")
    if (low is not None and value < low) or (high is not None and value > high):
        raise Refusal(key, f"{value} is out of range", f"use a value in [{low}, {high}]")


def _cold_storage(doc: dict, base: Path) -> ColdStorageConfig:
    """``[cold_storage]``, ``uri = ""`` meaning off; a plain directory becomes
    an absolute ``file://`` URI (every process agrees on it)."""
    table = doc.get("cold_storage", {})
    if isinstance(table, dict) and table.get("uri") == "":
        table = {k: v for k, v in table.items() if k != "uri"}
    cold = _section({"cold_storage": table}, "cold_storage", ColdStorageConfig, base)
    uri = cold.uri
    if not uri:
        return cold
    scheme = uri.partition("://")[0] if "://" in uri else ""
    if scheme not in ("", "file", "s3"):
        raise Refusal("cold_storage.uri", f"{uri!r} has an unsupported scheme",
                       "use a directory, file:///path or s3://bucket/prefix")
    if not scheme:
        uri = (base / Path(uri).expanduser()).resolve().as_uri()
    if cold.credentials_file and scheme != "s3":
        raise Refusal("cold_storage.credentials_file", "applies to s3:// cold storage only",
                       "remove credentials_file or use an s3:// uri")
    return replace(cold, uri=uri)


# -- metadata -----------------------------------------------------------------------
def _metadata_uri(uri: str, base: Path) -> str:
    """The URI with a relative SQLite path made absolute (``sqlite:////abs``)."""
    if not uri.startswith(("sqlite://", "zk://")):
        raise Refusal("metadata.uri", f"{uri!r} has an unsupported scheme",
                       'use "sqlite:///rel/path.db", "sqlite:////abs/path.db" or '
                       '"zk://host:port[,host:port]/chroot"')
    try:
        kind, parts = parse_uri(uri, base)
    except ConfigError as exc:
        raise Refusal("metadata.uri", str(exc).rstrip("."), "correct the URI") from None
    if kind == "sqlite":
        return "sqlite:///" + os.path.abspath(parts["db_path"])
    return uri


# -- bookies ------------------------------------------------------------------------
def _bookies(doc: dict, base: Path) -> tuple[BookieConfig, ...]:
    tables = doc.get("bookies")
    if tables is None:
        raise Refusal("bookies", "no bookies configured",
                       "add a [[bookies]] table with id, journal_dir, ledger_dir, endpoint")
    if not isinstance(tables, list) or not tables or not all(
            isinstance(t, dict) for t in tables):
        raise Refusal("bookies", "must be an array of tables",
                       "write each bookie as its own [[bookies]] table")
    out = []
    for i, table in enumerate(tables):
        where = f"bookies[{i}]"
        values = _read_table(table, BookieConfig, where, base)
        if not BOOKIE_ID.match(values["id"]):
            raise Refusal(f"{where}.id", f"{values['id']!r} is not a valid id",
                           "use 1-64 letters, digits, '.', '_' or '-', starting with a "
                           "letter or digit")
        values["endpoint"] = _endpoint(f"{where}.endpoint", values["endpoint"], base)
        if values.get("metrics_address"):
            try:
                parse_host_port(values["metrics_address"])
            except ValueError as exc:
                raise Refusal(f"{where}.metrics_address", str(exc),
                               "set host:port (port 0 picks a free one) or leave it empty "
                               "(no metrics)") from None
        for name in ("host", "rack"):
            if name in values and not LABEL.match(values[name]):
                raise Refusal(f"{where}.{name}", f"{values[name]!r} is not a valid {name}",
                               "use 1-253 of A-Z a-z 0-9 . _ : / -, starting alphanumeric")
        values["host"] = values.get("host") or socket.gethostname()
        out.append(BookieConfig(**values))
    return tuple(out)


def _endpoint(key: str, endpoint: str, base: Path) -> str:
    if endpoint.startswith("ipc://"):
        rest = endpoint[len("ipc://"):]
        if not rest or rest.endswith("/"):
            raise Refusal(key, f"{endpoint!r} names no socket file",
                           'use "ipc://data/bookie-1.sock"')
        path = os.path.abspath(base / Path(rest).expanduser())
        if len(path.encode()) > limits.IPC_PATH_BYTES_MAX:
            raise Refusal(key, f"the socket path {path} is over {limits.IPC_PATH_BYTES_MAX} bytes",
                           "use a shorter path or a tcp:// endpoint")
        return "ipc://" + path
    if endpoint.startswith("tcp://"):
        host, colon, port = endpoint[len("tcp://"):].rpartition(":")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise Refusal(key, f"{endpoint!r} is not tcp://host:port",
                           'use e.g. "tcp://127.0.0.1:3181" (port 1-65535)')
        return endpoint
    raise Refusal(key, f"{endpoint!r} has an unsupported scheme",
                   'use "ipc://path.sock" or "tcp://host:port"')


# -- storage and cross-section rules ----------------------------------------------------
_STORAGE_REFUSAL = re.compile(r"^\[storage\] (\w+) = (.*) is invalid: (.*)$")


def _storage_fields() -> dict:
    return {f.name: f for f in fields(StorageOptions)}


def _storage(table) -> StorageConfig:
    if not isinstance(table, dict):
        raise Refusal("storage", "must be a table", "write it as [storage] followed by keys")
    known = _storage_fields()
    values = {}
    for name, value in table.items():
        if name not in known:
            raise Refusal(f"storage.{name}", "unknown key", suggest(name, known))
        values[name] = _convert(f"storage.{name}", value, known[name].type, {"low": 0},
                                Path("."))
    defaults = {n: f.default for n, f in known.items() if f.default is not MISSING}
    merged = {**defaults, **values}
    try:
        StorageConfig(merged).to_options()
    except ConfigError as exc:  # "[storage] key = value is invalid: set it to ..."
        match = _STORAGE_REFUSAL.match(str(exc))
        if match is None:
            raise Refusal("storage", str(exc), "correct the [storage] table") from None
        key, value, fix = match.groups()
        raise Refusal(f"storage.{key}", f"{value} is invalid", fix) from None
    return StorageConfig(MappingProxyType(merged))


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
        except Refusal as r:
            raise ConfigError(f"{text}: {r.problem}; fix: {r.fix}") from None
    config = load_config(text)
    return config.metadata.uri, config.base_dir, config
