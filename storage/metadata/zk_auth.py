"""ZooKeeper digest credentials: the ``user:password`` file a config names in
``[metadata] auth_file``, and the ACL every metadata node is created with.

Guarantees:

* ``read_credentials(path)`` returns (user, password) or raises
  ``ConfigError`` with one line naming the file and the fix: the file is
  missing or unreadable, is readable or writable by group or others (a
  password file must be owner-only: ``chmod 600``), or does not hold exactly
  one ``user:password`` line (both parts non-empty, no whitespace).
* ``owner_acl(user, password)`` is the ACL the ZooKeeper backend puts on
  every node it creates (the chroot and its parents included): all
  permissions for that digest identity and nothing for anyone else.  Read
  is owner-only too, because ledger metadata holds password records.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from kazoo.security import make_digest_acl

from appliance.protocol import limits
from appliance.protocol.errors import ConfigError


def read_credentials(path: str | os.PathLike) -> tuple[str, str]:
    """(user, password) from an owner-only file holding ``user:password``."""
    path = Path(path)
    where = f"metadata.auth_file {path}"
    try:
        mode = path.stat().st_mode
        with open(path, "rb") as fh:
            raw = fh.read(limits.METADATA_ZK_AUTH_FILE_BYTES_MAX + 1)
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read it ({exc.strerror or exc}); fix: write "
                          "user:password into it and chmod 600 it") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"{where}: is open to other users (mode {stat.S_IMODE(mode):o}); "
                          f"fix: chmod 600 {path}")
    lines = [ln.strip() for ln in raw.decode("utf-8", "replace").splitlines() if ln.strip()]
    user, colon, password = lines[0].partition(":") if len(lines) == 1 else ("", "", "")
    if len(raw) > limits.METADATA_ZK_AUTH_FILE_BYTES_MAX or not colon or not user or not password \
            or any(ch.isspace() for ch in lines[0]):
        raise ConfigError(f"{where}: must hold one line user:password (no spaces); fix: "
                          "write e.g. appliance:<a long random password> into it")
    return user, password


def owner_acl(user: str, password: str) -> list:
    """Every permission for the digest identity ``user``, none for the world."""
    return [make_digest_acl(user, password, all=True)]
