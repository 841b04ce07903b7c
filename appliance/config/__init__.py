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
Rooms: ``schema`` (the sections and their keys), ``loading``
(``load_config``, ``resolve_target``), ``rules`` (the rules between keys),
``host_checks`` (``check_host``: imported from there by what starts
processes, so a client never loads what it needs, such as kazoo for the
ZooKeeper credentials file), ``refusal`` (the one-line error).
"""

from appliance.config.loading import load_config, parse_host_port, resolve_target
from appliance.config.schema import (
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

HOST_CHECKS = ("check_host", "nearest_existing", "probe_direct_io")


def __getattr__(name: str):
    """``check_host`` and the direct-I/O probe, importable from here as
    documented (docs/CONFIG.md), loaded on first use."""
    if name in HOST_CHECKS:
        # on use: host_checks reads ZooKeeper credentials files (kazoo), which
        # no client needs; a client imports appliance.config
        from appliance.config import host_checks

        return getattr(host_checks, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "SECTIONS", "ApplianceConfig", "AutoRecoveryConfig", "BookieConfig", "ClientConfig",
    "ColdStorageConfig", "LogConfig", "MetadataConfig", "SecurityConfig", "ServerConfig",
    "StorageConfig", "SupervisorConfig", "load_config", "parse_host_port", "resolve_target",
    *HOST_CHECKS,
]
