"""The options of the ``bookkeeper`` source, checked once on the driver.

Every bad option is a ``ValueError`` naming the option and the fix, raised
before anything connects.  Option names are case-insensitive (as in Spark).

| option | default | meaning |
|---|---|---|
| ``config`` / ``metadata`` | (one is required) | appliance TOML path, or metadata URI |
| ``ledgers`` | every CLOSED ledger | comma-separated ids; OPEN ones are read up to their LAC |
| ``password`` | empty | the ledgers' password (UTF-8) |
| ``startingEntry`` | ``earliest`` (0) | first entry read, inclusive: id or ``{"ledger": id}`` |
| ``endingEntry`` | ``latest`` | last entry read, inclusive: id or ``{"ledger": id}`` JSON |
| ``maxEntriesPerPartition`` | 250000 | a larger range is split (each task costs tens of ms) |
| ``minPartitions`` | driver's CPUs | split further until there are this many (default: |
|  |  | not below 10000 rows each: a log's entry counts its records) |
| ``readTimeoutMs`` | 5000 | deadline of one batched read before failing over |
| ``log`` | (none) | read this log's records instead of ledgers (schema |
|  |  | ``dlsn string, txid long, payload binary``); not with ``ledgers`` or |
|  |  | the entry bounds |
| ``segments`` | every live one | with ``log``: comma-separated segment numbers to |
|  |  | read, the others left out (``appliance.spark.native.read_log`` reads |
|  |  | the cold ones with Spark's own Parquet reader) |
| ``includeLogSegments`` | ``false`` | without ``ledgers``: also read the ledgers that |
|  |  | hold logs' segments (left out by default, as ``bkctl ledger list``) |
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from appliance.protocol import limits
from appliance.protocol.logs import check_log_name


@dataclass(frozen=True)
class ScanOptions:
    target: str  # config path or metadata URI, as given
    is_config: bool
    ledgers: tuple[int, ...] | None  # None: every CLOSED ledger
    password: bytes = b""
    starting: Mapping[int, int] | int = 0  # per-ledger map, or one id for all
    ending: Mapping[int, int] | int = limits.ID_MAX
    max_entries_per_partition: int = limits.SPARK_ENTRIES_PER_PARTITION_MAX
    min_partitions: int | None = None  # None: the driver's CPUs, pieces >= 10000 rows
    read_timeout_ms: int = 5000
    log: str | None = None  # a log's records instead of ledgers
    segments: frozenset[int] | None = None  # a log's segments to read; None: every one
    include_log_segments: bool = False  # the default selection: logs' segment ledgers too

    def start_for(self, ledger_id: int) -> int:
        if isinstance(self.starting, int):
            return self.starting
        return self.starting.get(ledger_id, 0)

    def end_for(self, ledger_id: int) -> int:
        if isinstance(self.ending, int):
            return self.ending
        return self.ending.get(ledger_id, limits.ID_MAX)

    @property
    def where(self) -> str:
        return f"{'config' if self.is_config else 'metadata'} {self.target}"


def parse_options(raw: Mapping[str, str]) -> ScanOptions:
    opts = {str(k).lower(): v for k, v in raw.items()}
    config, metadata = opts.pop("config", None), opts.pop("metadata", None)
    if (config is None) == (metadata is None):
        raise ValueError("bookkeeper source: set exactly one of option 'config' (the "
                         "appliance's TOML file) or 'metadata' (its metadata URI)")
    opts.pop("path", None)  # load(path) is not used by this source
    out = ScanOptions(
        target=str(config if config is not None else metadata),
        is_config=config is not None,
        ledgers=_ledgers(opts.pop("ledgers", None)),
        password=str(opts.pop("password", "")).encode("utf-8"),
        starting=_bound("startingEntry", opts.pop("startingentry", None), "earliest", 0),
        ending=_bound("endingEntry", opts.pop("endingentry", None), "latest", limits.ID_MAX),
        max_entries_per_partition=_positive("maxEntriesPerPartition",
                                            opts.pop("maxentriesperpartition", None),
                                            limits.SPARK_ENTRIES_PER_PARTITION_MAX),
        min_partitions=_positive("minPartitions", opts.pop("minpartitions", None), None),
        read_timeout_ms=_positive("readTimeoutMs", opts.pop("readtimeoutms", None), 5000),
        log=_log_name(opts.pop("log", None)),
        segments=_segments(opts.pop("segments", None)),
        include_log_segments=_bool("includeLogSegments", opts.pop("includelogsegments", None),
                                   False),
    )
    if out.log is not None and (out.ledgers is not None or out.starting != 0
                                or out.ending != limits.ID_MAX):
        raise ValueError("bookkeeper source: option log reads a whole log; do not combine it "
                         "with ledgers, startingEntry or endingEntry")
    if out.segments is not None and out.log is None:
        raise ValueError("bookkeeper source: option segments names segments of a log: "
                         "set option log too")
    if (out.min_partitions or 0) > limits.SPARK_PARTITIONS_MAX:
        raise ValueError(f"option minPartitions must be <= {limits.SPARK_PARTITIONS_MAX}, got "
                         f"{out.min_partitions}")
    if opts:
        raise ValueError(f"bookkeeper source: unknown option(s) {sorted(opts)}; known: config, "
                         "metadata, ledgers, log, segments, password, startingEntry, "
                         "endingEntry, maxEntriesPerPartition, minPartitions, readTimeoutMs, "
                         "includeLogSegments")
    return out


def _int(name: str, text) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise ValueError(f"option {name} must be an integer, got {text!r}") from None
    if not 0 <= value <= limits.ID_MAX:
        raise ValueError(f"option {name} must be in [0, 2^63-1], got {value}")
    return value


def _positive(name: str, text, default: int | None) -> int | None:
    if text is None:
        return default
    value = _int(name, text)
    if value < 1:
        raise ValueError(f"option {name} must be >= 1, got {value}")
    return value


def _bool(name: str, text, default: bool) -> bool:
    if text is None:
        return default
    value = str(text).strip().lower()
    if value not in ("true", "false"):
        raise ValueError(f"option {name} must be true or false, got {text!r}")
    return value == "true"


def _ledgers(text) -> tuple[int, ...] | None:
    if text is None:
        return None
    parts = [p for p in str(text).replace(" ", "").split(",") if p]
    if not parts:
        raise ValueError("option ledgers is empty: name ledger ids like '3,4,5', or leave it "
                         "out to read every closed ledger")
    return tuple(sorted({_int("ledgers", p) for p in parts}))


def _segments(text) -> frozenset[int] | None:
    if text is None:
        return None
    parts = [p for p in str(text).replace(" ", "").split(",") if p]
    if not parts:
        raise ValueError("option segments is empty: name segment numbers like '3,4', or "
                         "leave it out to read every segment of the log")
    return frozenset(_int("segments", p) for p in parts)


def _bound(name: str, text, keyword: str, default: int):
    if text is None or str(text).strip().lower() == keyword:
        return default
    text = str(text).strip()
    if not text.startswith("{"):
        return _int(name, text)
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"option {name}: not an id, '{keyword}' or a JSON object: "
                         f"{exc}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"option {name} must be a JSON object of ledger id -> entry id")
    return {_int(f"{name} (ledger id)", k): _int(f"{name} (entry id)", v)
            for k, v in doc.items()}


def _log_name(text) -> str | None:
    if text is None:
        return None

    try:
        return check_log_name(str(text))
    except ValueError as exc:
        raise ValueError(f"option log: {exc}") from None
