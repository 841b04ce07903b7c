"""The config's schema: one frozen dataclass per TOML section, each key
with its default (``appliance.protocol.limits`` for every limit) and its
allowed range.  Pure data: nothing here reads a file.  Every key, its
default and what it trades off: ``docs/CONFIG.md``."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field
from pathlib import Path

from appliance.protocol import limits
from appliance.protocol.entry import ENTRY_OVERHEAD_MAX
from ipc.frames import WireLimits
from storage.options import StorageOptions

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
    # Every interval (0 = off) a bookie looks at up to scrub_ledgers_per_pass
    # ledgers for entries of its share left short by a writer that is gone,
    # and repairs them from peers; shorter heals sooner for more metadata reads.
    scrub_interval_ms: int = _key(limits.BOOKIE_SCRUB_INTERVAL_MS, 0, 86_400_000)
    scrub_ledgers_per_pass: int = _key(limits.BOOKIE_SCRUB_LEDGERS_MAX, 1, 10_000_000)
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
    # a read unanswered this long is also sent to the next replica (0: off);
    # shorter: stalls cost less, more duplicate reads when all are slow
    speculative_read_timeout_ms: int = _key(limits.CLIENT_SPECULATIVE_READ_TIMEOUT_MS, 0,
                                            3_600_000)
    # a bookie with bookie_quarantine_strikes failed or outrun reads within
    # 10 s is asked last and kept out of new ensembles this long (0: never)
    bookie_quarantine_ms: int = _key(limits.CLIENT_BOOKIE_QUARANTINE_MS, 0, 86_400_000)
    bookie_quarantine_strikes: int = _key(limits.CLIENT_BOOKIE_QUARANTINE_STRIKES, 1, 1_000_000)
    add_retries_max: int = _key(limits.CLIENT_ADD_RETRIES_MAX, 0, 100)
    # The delayed ensemble change (appliance.protocol.writer_heal; see CONFIG.md):
    # no spare for a failed bookie keeps it while the ack quorum holds, and
    # what it missed is re-sent once it answers (records kept: heal_bytes_max)
    delay_ensemble_change: bool = _key(True)
    heal_bytes_max: int = _key(limits.CLIENT_HEAL_BYTES_MAX, 0, 2**40)
    heal_close_wait_ms: int = _key(limits.CLIENT_HEAL_CLOSE_WAIT_MS, 0, 3_600_000)
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
    # Log servers `bkctl up` starts beside the bookies (the log service: many
    # producers per log); 0 turns the service off.  More spreads the logs'
    # writing over more processes (CPU); each costs a process and a session.
    servers: int = _key(2, 0, 64)
    # With tcp bookie endpoints the log servers serve on tcp too, at the
    # address of this config's first tcp bookie, so producers on other hosts
    # reach them: log server N on port port_base + N - 1 (0: the ports right
    # after this config's highest bookie port).  With ipc bookies they serve
    # on ipc:// in the run folder and this key is not used.
    port_base: int = _key(0, 0, 65535)
    # host:port where each log server serves Prometheus /metrics (port 0: a
    # free port each; the URL is in bkctl status --json); "" = off.  An
    # unauthenticated HTTP port: bind it to 127.0.0.1 unless scraped remotely.
    metrics_address: str = _key("")
    # Bytes of recent acknowledged records a log server keeps per owned log
    # that tailing readers read (docs/LOGS.md, "Tailing readers"): readers
    # within it are served from memory, so many readers cost the bookies
    # about what one costs; more serves readers further behind, for memory.
    read_cache_bytes: int = _key(limits.LOG_READ_CACHE_BYTES, 64 * 1024, 1024 * MiB)
    # Readers (Log.reader) of a log a log server owns read its recent
    # records from the owner's cache (false: always from the bookies).
    read_via_service: bool = _key(True)
    # A log server's group commit: records that arrive while one of the log's
    # entries awaits its ack wait for that ack, or this long, whichever comes
    # first, and leave together as one entry.  Longer: fuller entries (less
    # bookie CPU per record); shorter: less waiting per write.  0 = never wait.
    service_linger_us: int = _key(limits.LOG_SERVICE_LINGER_US, 0, 1_000_000)
    # ... while fewer than this many of the log's entries await their ack
    # (then the next leaves when one is acknowledged).  1 = one at a time.
    service_entries_inflight: int = _key(limits.LOG_SERVICE_ENTRIES_INFLIGHT, 1, 1_000)
    # With no entry in flight, records wait at most this long for the producers
    # the log server just answered (they write again at once when they write
    # synchronously), so they share one entry.  Longer: fuller entries; shorter:
    # less waiting after a producer stops.  0 = send at once.
    service_gather_us: int = _key(limits.LOG_SERVICE_GATHER_US, 0, 1_000_000)
    # A log server's control entry of an owned log (control_interval_ms is an
    # exclusive writer's): once the log was idle this long after an entry was
    # acknowledged.  Readers through the service and Spark's source never wait
    # for it (they ask the owner how far the log is acknowledged); readers with
    # via_service=false see the last records within it.  Shorter: a fresher
    # tail for them; costs an entry per pause of every owned log.  0 = none
    # (the ledger's explicit LAC only).
    service_control_interval_ms: int = _key(limits.LOG_SERVICE_CONTROL_INTERVAL_MS, 0,
                                            3_600_000)


@dataclass(frozen=True)
class ColdStorageConfig:
    """``[cold_storage]``: where sealed log segments move (``appliance.cold``).
    ``uri`` "" = off; a relative directory is made absolute from the config's
    folder (``file:///abs``); ``s3://bucket/prefix`` may carry pyarrow's
    options (``?endpoint_override=host:port&scheme=http&region=...``)."""

    uri: str = _key("")
    # Sealed segments older than this move by themselves (0: only by
    # command).  Sooner frees the bookies' NVMe sooner; later keeps recent
    # segments' reads on the bookies.
    offload_after_ms: int = _key(limits.COLD_STORAGE_OFFLOAD_AFTER_MS, 0, 2**50)
    # How long the bookies keep a moved segment's ledger: readers that
    # opened it before the move finish there; longer costs NVMe space.
    delete_after_ms: int = _key(limits.COLD_STORAGE_DELETE_AFTER_MS, 0, 2**50)
    # A file no segment names (a mover crashed before recording it) is
    # removed once this old: longer than any one segment's upload.
    orphan_grace_ms: int = _key(limits.COLD_STORAGE_ORPHAN_GRACE_MS, 0, 2**50)
    # How often the auditor looks for segments to move and ledgers to delete
    # (one metadata read and one listing of the cold folder per log).
    check_interval_ms: int = _key(60_000, 100, 86_400_000)
    # s3:// only: an owner-only file holding access_key:secret_key (else
    # the AWS_* environment variables or the machine's role).
    credentials_file: Path = _key("")


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
    cold_storage: ColdStorageConfig = ColdStorageConfig()

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

    def log_server_ids(self) -> list[str]:
        """The ids of the log servers ``bkctl up`` runs (``[log] servers``):
        ``logserver-N``; with zk:// metadata (an appliance of several hosts)
        after the bookies' host label (``host1-logserver-N``), so the hosts'
        ids differ."""
        host = next((b.host for b in self.bookies if b.host), "") \
            if self.metadata.uri.startswith("zk://") else ""
        prefix = re.sub(r"[^A-Za-z0-9_.-]", "_", host) + "-" if host else ""
        return [f"{prefix}logserver-{i}" for i in range(1, self.log.servers + 1)]

    def log_server_endpoint(self, server_id: str) -> str:
        """A log server's ZeroMQ endpoint: ipc:// in the run folder, or tcp
        when the bookies are on tcp (``[log] port_base``)."""
        ports = self.log_server_ports()
        if ports is None or server_id not in self.log_server_ids():
            return f"ipc://{self.run_path / (server_id + '.sock')}"
        address = tcp_address(next(b.endpoint for b in self.bookies
                                   if b.endpoint.startswith("tcp://")))
        return f"tcp://{address}:{ports[self.log_server_ids().index(server_id)]}"

    def log_server_ports(self) -> list[int] | None:
        """The tcp ports of ``log_server_ids()`` in order, or None when the
        bookies are not on tcp (the log servers are then on ipc)."""
        bookie_ports = [tcp_port(b.endpoint) for b in self.bookies
                        if b.endpoint.startswith("tcp://")]
        if not bookie_ports:
            return None
        first = self.log.port_base or max(bookie_ports) + 1
        return list(range(first, first + self.log.servers))

    def bookie(self, bookie_id: str) -> BookieConfig:
        for b in self.bookies:
            if b.id == bookie_id:
                return b
        raise KeyError(bookie_id)

    def wire_limits(self):
        """The wire limits every bookie and client of this config enforce."""
        return WireLimits(entry_bytes_max=self.storage.entry_bytes_max + ENTRY_OVERHEAD_MAX,
                          batch_entries_max=self.server.batch_entries_max,
                          batch_bytes_max=self.server.batch_bytes_max)


def tcp_address(endpoint: str) -> str:
    """``tcp://10.0.0.5:3181`` -> ``10.0.0.5`` (brackets of IPv6 kept)."""
    return endpoint[len("tcp://"):].rsplit(":", 1)[0]


def tcp_port(endpoint: str) -> int:
    """``tcp://10.0.0.5:3181`` -> 3181 (0 for a wildcard port)."""
    port = endpoint.rsplit(":", 1)[1]
    return int(port) if port.isdigit() else 0


SECTIONS = {"metadata": MetadataConfig, "bookies": BookieConfig, "storage": StorageConfig,
            "server": ServerConfig, "client": ClientConfig, "supervisor": SupervisorConfig,
            "autorecovery": AutoRecoveryConfig, "log": LogConfig, "security": SecurityConfig,
            "cold_storage": ColdStorageConfig}
