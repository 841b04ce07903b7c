"""The host checks the supervisor runs before starting anything: the
metadata credentials file, every data path a directory that exists or can
be created, allowed CPUs, O_DIRECT support of each data directory's
filesystem (unless ``storage.direct_io = false``), usable CURVE keys.
Unlike loading, these touch the disk."""

from __future__ import annotations

import mmap
import os
import uuid
from collections.abc import Callable
from pathlib import Path

from appliance.config.refusal import Refusal, as_config_error
from appliance.config.schema import ApplianceConfig
from appliance.curve import check_security
from storage.metadata.zk_auth import read_credentials


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
        read_credentials(config.metadata.auth_file)  # refused here, before any process
    try:
        _check_paths(config)
        check_security(config)  # CURVE keys usable (ConfigError, one line)
        if config.storage.direct_io:
            for i, b in enumerate(config.bookies):
                for name in ("journal_dir", "ledger_dir"):
                    reason = probe_direct_io(getattr(b, name), open_fn)
                    if reason:
                        raise Refusal(f"bookies[{i}].{name}", f"{getattr(b, name)} does not "
                                       f"support direct I/O: {reason}",
                                       "put it on a filesystem that supports O_DIRECT (ext4, "
                                       "xfs) or set [storage] direct_io = false")
    except Refusal as r:
        raise as_config_error(config.path, r) from None


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
            raise Refusal(f"bookies[{i}].cpus", f"CPUs {bad} are not available here "
                           f"(allowed: {sorted(allowed)})", "list only available CPUs")
    for key, path, is_dir in paths:
        if path.exists() and is_dir and not path.is_dir():
            raise Refusal(key, f"{path} exists and is not a directory",
                           "point it at a directory or remove the file")
        base = nearest_existing(path if is_dir else path.parent)
        if not base.is_dir() or not os.access(base, os.W_OK | os.X_OK):
            raise Refusal(key, f"{path} cannot be created: {base} is not a writable directory",
                           "fix the permissions or choose another location")
