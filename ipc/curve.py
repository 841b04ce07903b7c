"""ZeroMQ CURVE on tcp endpoints: key files, key directories, the bookie's
ZAP handler and the client socket options (docs/SECURITY.md, "Network:
CURVE").

What it guarantees:

* ``load_key_pair(path)`` returns a host's key pair from a zmq.auth secret
  certificate (``NAME.key_secret``, written by ``bkctl keys generate``) or
  raises ``ConfigError`` with one line: the file is missing, unreadable,
  holds no secret key, or is readable by other accounts (group or world
  bits set).
* ``KeyDirectory`` is a set of public keys read from the ``*.key`` files
  of one directory (at most ``keys_max``).  It re-checks the directory at
  most once per ``recheck_interval_s`` (injected clock) and re-reads it
  only when a file was added, removed or changed, so an operator adds or
  revokes a key by adding or removing a file, without a restart.  A file
  that does not parse is skipped with one warning per change.
* ``ZapHandler`` answers ZeroMQ's ZAP requests (RFC 27) on the bookie's own
  poll loop: a CURVE client is accepted only when its public key is in the
  authorized directory (or is the bookie's own key: the same host).  Every
  refusal is counted; it is logged once per (peer address, key) per
  ``log_interval_s``, the table of recent refusals bounded by
  ``refusals_tracked_max``.  Any other mechanism is refused.
* ``is_tcp(endpoint)``: CURVE applies to ``tcp://`` endpoints only; ``ipc://``
  keeps filesystem permissions (owner-only socket files).

Faults survived: a malformed ZAP request gets a 400 and a warning, never an
exception out of the loop; a key directory that vanishes or cannot be read
authorizes nobody (fail closed) and says so once per change.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import zmq
from zmq.auth import load_certificate
from zmq.utils import z85

from appliance.protocol import limits
from appliance.protocol.errors import ConfigError

log = logging.getLogger(__name__)

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
KEY_Z85_CHARS = 40
RECHECK_INTERVAL_S = 1.0  # a key directory is looked at no more often than this
REFUSAL_LOG_INTERVAL_S = 60.0  # one log line per (address, key) per interval


@dataclass(frozen=True)
class KeyPair:
    """A CURVE key pair, Z85-encoded (40 bytes each)."""

    public: bytes
    secret: bytes


def is_tcp(endpoint: str) -> bool:
    return endpoint.startswith("tcp://")


def load_key_pair(path: str | os.PathLike, what: str = "security.key_file") -> KeyPair:
    """The key pair in a ``.key_secret`` certificate; ``ConfigError`` (one
    line naming ``what`` and the fix) when it cannot be used."""
    path = Path(path)
    fix = "run `bkctl keys generate NAME` and point key_file at NAME.key_secret"
    try:
        st = os.stat(path)
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read {path} ({exc.strerror}); fix: {fix}") from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"{what}: {path} is readable by other accounts (mode "
                          f"{stat.S_IMODE(st.st_mode):o}); fix: chmod 600 {path}")
    try:
        public, secret = load_certificate(path)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{what}: cannot read {path} ({exc}); fix: {fix}") from None
    if not secret:
        raise ConfigError(f"{what}: {path} holds no secret key (is it the public .key "
                          f"file?); fix: point it at the .key_secret file")
    if len(public) != KEY_Z85_CHARS or len(secret) != KEY_Z85_CHARS:
        raise ConfigError(f"{what}: {path} holds a malformed key; fix: {fix}")
    return KeyPair(public, secret)


def load_public_key(path: str | os.PathLike) -> bytes:
    """The public key of a ``.key`` (or ``.key_secret``) certificate."""
    public, _ = load_certificate(path)
    if len(public) != KEY_Z85_CHARS:
        raise ValueError(f"{path}: malformed public key")
    return public


class KeyDirectory:
    """The public keys of a directory's ``*.key`` files (see module doc)."""

    def __init__(self, directory: str | os.PathLike, *, keys_max: int = limits.CURVE_KEYS_MAX,
                 recheck_interval_s: float = RECHECK_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic):
        self.directory = Path(directory)
        self.keys_max = keys_max
        self.recheck_interval_s = recheck_interval_s
        self.clock = clock
        self._keys: frozenset[bytes] = frozenset()
        self._signature: object = None
        self._checked_at = float("-inf")

    def keys(self) -> frozenset[bytes]:
        """The current keys (re-checked at most once per interval)."""
        now = self.clock()
        if now - self._checked_at >= self.recheck_interval_s:
            self._checked_at = now
            self._refresh()
        return self._keys

    def __contains__(self, public_key: bytes) -> bool:
        return public_key in self.keys()

    def _refresh(self) -> None:
        signature, files = self._scan()
        if signature == self._signature:
            return
        self._signature = signature
        keys = set()
        for path in files:
            try:
                keys.add(load_public_key(path))
            except (OSError, ValueError) as exc:
                log.warning("%s: skipping %s: %s", self.directory, path.name, exc)
        self._keys = frozenset(keys)
        log.info("%s: %d public key(s)", self.directory, len(keys))

    def _scan(self) -> tuple[object, list[Path]]:
        try:
            entries = sorted((e for e in os.scandir(self.directory)
                              if e.name.endswith(".key") and e.is_file()), key=lambda e: e.name)
            if len(entries) > self.keys_max:
                log.warning("%s holds %d key files; only the first %d are read",
                            self.directory, len(entries), self.keys_max)
                entries = entries[:self.keys_max]
            signature = tuple((e.name, e.stat().st_mtime_ns, e.stat().st_size) for e in entries)
        except OSError as exc:
            if self._signature != ("error", exc.errno):
                log.warning("cannot list %s (%s): no key accepted from it",
                            self.directory, exc.strerror)
            return ("error", exc.errno), []
        return signature, [Path(e.path) for e in entries]


class ZapHandler:
    """A ZAP endpoint (``inproc://zeromq.zap.01``) in ``context``, answered
    from the owner's poll loop: register ``socket`` for POLLIN and call
    ``handle_ready()`` when it is readable.  Only one per context."""

    def __init__(self, context: zmq.Context, authorized: KeyDirectory, own_key: bytes, *,
                 log_interval_s: float = REFUSAL_LOG_INTERVAL_S,
                 refusals_tracked_max: int = limits.CURVE_REFUSALS_TRACKED_MAX,
                 clock: Callable[[], float] = time.monotonic):
        self.authorized = authorized
        self.own_key = own_key
        self.log_interval_s = log_interval_s
        self.refusals_tracked_max = refusals_tracked_max
        self.clock = clock
        self.counters = {"accepted": 0, "refused": 0, "refusals_logged": 0}
        self._logged_at: dict[tuple[str, bytes], float] = {}
        self.socket = context.socket(zmq.REP)
        self.socket.setsockopt(zmq.LINGER, 0)
        try:
            self.socket.bind(ZAP_ENDPOINT)
        except zmq.ZMQError as exc:
            self.socket.close(linger=0)
            raise ConfigError(f"cannot start the CURVE authenticator ({exc}): another one "
                              "runs in this ZeroMQ context; fix: one bookie per context") from None

    def handle_ready(self) -> None:
        """Answer the ZAP requests waiting (at most a bounded number)."""
        for _ in range(limits.CURVE_ZAP_REQUESTS_PER_WAKEUP_MAX):
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                answer = self._answer(frames)
            except Exception:  # fail closed, keep serving: a bug here refuses, never stops
                log.exception("ZAP request failed: refused")
                answer = [b"1.0", frames[1] if len(frames) > 1 else b"", b"500",
                          b"authenticator failure", b"", b""]
            self.socket.send_multipart(answer)

    def _answer(self, frames: list[bytes]) -> list[bytes]:
        if len(frames) < 6 or frames[0] != b"1.0":
            log.warning("malformed ZAP request (%d frames): refused", len(frames))
            rid = frames[1] if len(frames) > 1 else b""
            return [b"1.0", rid, b"400", b"malformed ZAP request", b"", b""]
        rid, address, mechanism = frames[1], frames[3].decode(errors="replace"), frames[5]
        credentials = frames[6] if len(frames) > 6 else b""
        key = z85.encode(credentials) if len(credentials) == 32 else b""
        if mechanism == b"CURVE" and key and (key == self.own_key or key in self.authorized):
            self.counters["accepted"] += 1
            return [b"1.0", rid, b"200", b"OK", key, b""]
        self.counters["refused"] += 1
        self._log_refusal(address, key, mechanism.decode(errors="replace"))
        return [b"1.0", rid, b"400", b"client key not authorized", b"", b""]

    def _log_refusal(self, address: str, key: bytes, mechanism: str) -> None:
        now = self.clock()
        peer = (address, key)
        if now - self._logged_at.get(peer, float("-inf")) < self.log_interval_s:
            return
        if len(self._logged_at) >= self.refusals_tracked_max:
            self._forget_before(now - self.log_interval_s)
        self._logged_at[peer] = now
        self.counters["refusals_logged"] += 1
        shown = key.decode() if key else f"none ({mechanism})"
        log.warning("CURVE: refused a client at %s with key %s: not in %s (%d refusal(s) so "
                    "far; logged once per peer per %.0f s)", address, shown,
                    self.authorized.directory, self.counters["refused"], self.log_interval_s)

    def _forget_before(self, cutoff: float) -> None:
        for peer in [p for p, at in self._logged_at.items() if at < cutoff]:
            del self._logged_at[peer]
        while len(self._logged_at) >= self.refusals_tracked_max:  # still full: oldest first
            del self._logged_at[min(self._logged_at, key=self._logged_at.get)]

    def close(self) -> None:
        self.socket.close(linger=0)


def configure_server(sock: zmq.Socket, keys: KeyPair) -> None:
    """Make ``sock`` (before bind) a CURVE server with ``keys``."""
    sock.setsockopt(zmq.CURVE_SERVER, 1)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.public)
    sock.setsockopt(zmq.CURVE_SECRETKEY, keys.secret)
    sock.setsockopt(zmq.ZAP_DOMAIN, b"appliance")


def configure_client(sock: zmq.Socket, keys: KeyPair, server_key: bytes) -> None:
    """Make ``sock`` (before connect) a CURVE client of the server ``server_key``."""
    sock.setsockopt(zmq.CURVE_SERVERKEY, server_key)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.public)
    sock.setsockopt(zmq.CURVE_SECRETKEY, keys.secret)
