"""CURVE settings of an appliance: what a bookie serves with, what a client
connects with, how keys are made (``[security]``, docs/SECURITY.md
"Network: CURVE").

Guarantees:

* ``server_curve(config, bookie_id)``: None unless ``security.curve`` is on
  and the bookie's endpoint is tcp; else its key pair (``key_file``) and its
  authorized client keys (``authorized_keys_dir``), or ``ConfigError`` with
  one line when either cannot be used (missing, unreadable, secret key
  readable by other accounts, not a directory).  ipc endpoints never use
  CURVE: filesystem permissions guard them.
* ``client_curve(...)``: the client's key pair and, when ``trusted_keys_dir``
  is set, the bookie keys it trusts; from the config, or from keyword
  arguments of ``appliance.connect`` (which win).
* ``bookie_server_key(...)``: the server key to verify a registered bookie
  by, or the reason it is refused (its key is not trusted, it publishes
  none, or it requires CURVE and this client has no key); ``bookie_routes``
  the same for every registered bookie at once.
* ``generate_keys(name, directory)``: a new key pair in zmq.auth's
  certificate format, the secret file 0600 in a 0700 directory, never
  overwriting a file; both files appear complete or not at all.
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from appliance.errors import (
    BKError,
    BookieUnavailableError,
    ConfigError,
    LogServiceUnavailableError,
    UnauthorizedError,
)
from ipc.curve import KeyDirectory, KeyPair, is_tcp, load_key_pair

KEY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


@dataclass(frozen=True)
class ClientCurve:
    """A client's CURVE settings: its keys, and the bookie keys it trusts
    (None: it trusts the key each bookie publishes in the registry)."""

    keys: KeyPair
    trusted: KeyDirectory | None = None


def server_curve(config, bookie_id: str) -> tuple[KeyPair, KeyDirectory] | None:
    """The bookie's CURVE keys and authorized clients (see module doc)."""
    return endpoint_curve(config, config.bookie(bookie_id).endpoint)


def endpoint_curve(config, endpoint: str) -> tuple[KeyPair, KeyDirectory] | None:
    """The CURVE keys and authorized clients of a server of ``config`` (a
    bookie or a log server: the same keys) serving on ``endpoint``."""
    security = config.security
    if not security.curve or not is_tcp(endpoint):
        return None
    keys = load_key_pair(security.key_file)
    _check_dir(security.authorized_keys_dir, "security.authorized_keys_dir",
               "a directory of the client public keys (.key files) to accept")
    return keys, KeyDirectory(security.authorized_keys_dir)


def client_curve(config=None, curve_key_file=None, trusted_keys_dir=None) -> ClientCurve | None:
    """The client's CURVE settings: keyword arguments first, then the config."""
    security = getattr(config, "security", None)
    if curve_key_file is None and security is not None and security.curve:
        curve_key_file = security.key_file
    if trusted_keys_dir is None and security is not None and security.trusted_keys_dir:
        trusted_keys_dir = security.trusted_keys_dir
    if curve_key_file is None:
        if trusted_keys_dir is not None:
            raise ValueError("trusted_keys_dir needs curve_key_file (or [security] curve)")
        return None
    keys = load_key_pair(curve_key_file, "curve_key_file" if security is None
                         or not security.curve else "security.key_file")
    trusted = None
    if trusted_keys_dir is not None:
        _check_dir(trusted_keys_dir, "trusted_keys_dir", "a directory of the bookie public "
                   "keys (.key files) this client trusts")
        trusted = KeyDirectory(trusted_keys_dir)
    return ClientCurve(keys, trusted)


def bookie_server_key(curve: ClientCurve | None, bookie_id: str, registration: dict):
    """The CURVE server key to reach a registered bookie with (None: plain),
    or raise: ``UnauthorizedError`` when the bookie requires CURVE and this
    client has no key, ``BookieUnavailableError`` when the bookie publishes
    no key or one this client does not trust."""
    return registered_server_key(curve, f"bookie {bookie_id}", registration["endpoint"],
                                 (registration.get("info") or {}).get("curve_public_key"),
                                 BookieUnavailableError)


def log_server_key(curve: ClientCurve | None, server_id: str, registration: dict,
                   endpoint: str | None = None):
    """``bookie_server_key`` for a registered log server (its registration
    in ``appliance.meta.logservice``: ``endpoint``, ``read_endpoint``,
    ``curve_public_key``), reached at ``endpoint`` (default: its write
    endpoint); ``LogServiceUnavailableError`` where a bookie's is
    ``BookieUnavailableError``."""
    return registered_server_key(curve, f"log server {server_id}",
                                 endpoint or registration["endpoint"],
                                 registration.get("curve_public_key"),
                                 LogServiceUnavailableError)


def registered_server_key(curve: ClientCurve | None, server: str, endpoint: str,
                          published: str | None, unavailable: type[BKError]):
    """The rule of ``bookie_server_key``, for ``server`` (its kind and id)
    at ``endpoint``, which publishes the key ``published``."""
    if not is_tcp(endpoint):
        return None
    if curve is None:
        if published:
            raise UnauthorizedError(
                f"{server} ({endpoint}) requires CURVE and this client has no key: "
                "set [security] curve = true and key_file, or connect(..., curve_key_file=...)")
        return None
    if not published:
        raise unavailable(f"{server} ({endpoint}) publishes no CURVE "
                          "server key while this client requires CURVE: refused")
    key = published.encode()
    if curve.trusted is not None and key not in curve.trusted:
        raise unavailable(
            f"{server} ({endpoint}) publishes CURVE key {published}, which is not in "
            f"trusted_keys_dir {curve.trusted.directory}: refused, treated as unavailable")
    return key


def bookie_routes(curve: ClientCurve | None, live: dict) -> tuple[dict, dict]:
    """(endpoints, CURVE server keys) of the registered bookies ``live`` a
    client with ``curve`` may reach (refused ones left out), for readers
    with sockets of their own (bulk reads, Spark tasks)."""
    endpoints, keys = {}, {}
    for bookie_id, info in live.items():
        try:
            key = bookie_server_key(curve, bookie_id, info)
        except (UnauthorizedError, BookieUnavailableError):
            continue
        endpoints[bookie_id] = info["endpoint"]
        if key is not None:
            keys[bookie_id] = key
    return endpoints, keys


def check_security(config) -> None:
    """For ``check_host``: every bookie's CURVE settings can be used."""
    for b in config.bookies:
        server_curve(config, b.id)
    client_curve(config)


def _check_dir(path, key: str, what: str) -> None:
    if not path or not Path(path).is_dir():
        raise ConfigError(f"{key}: {path or 'unset'} is not a directory; fix: set it to {what}")


def generate_keys(name: str, directory: str | os.PathLike) -> tuple[Path, Path, str]:
    """Write ``directory/name.key`` (public) and ``name.key_secret`` (0600);
    (public path, secret path, public key).  ``FileExistsError`` when either
    exists, ``ValueError`` for a bad name."""
    import zmq.auth

    if not KEY_NAME.match(name):
        raise ValueError(f"key name {name!r}: use 1-64 letters, digits, '.', '_' or '-'")
    directory = Path(directory)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    targets = (directory / f"{name}.key", directory / f"{name}.key_secret")
    for target in targets:
        if target.exists():
            raise FileExistsError(f"{target} exists: not overwritten (choose another name)")
    with tempfile.TemporaryDirectory(dir=directory, prefix=".keys-") as tmp:  # 0700
        public_file, secret_file = zmq.auth.create_certificates(tmp, name)
        os.chmod(secret_file, 0o600)
        os.chmod(public_file, 0o644)
        os.link(public_file, targets[0])  # fails if it appeared meanwhile: never overwrites
        try:
            os.link(secret_file, targets[1])
        except OSError:
            targets[0].unlink()
            raise
        public, _ = zmq.auth.load_certificate(targets[0])
    return targets[0], targets[1], public.decode()


def directory_open_to_others(directory: str | os.PathLike) -> bool:
    """True when group or others may enter ``directory``."""
    return bool(os.stat(directory).st_mode & (stat.S_IRWXG | stat.S_IRWXO))
