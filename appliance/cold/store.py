"""The cold tier's files through pyarrow's filesystems (``pyarrow.fs``):
a local directory (``file:///abs``) or an S3-compatible object store
(``s3://bucket/prefix?endpoint_override=...``).

Layout: ``<root>/<log>/<seq>-<ledger>-<token>.parquet``.  The token makes
every write a new name: a file is part of a log only once the log's
metadata names it (the mover's CAS), so a crash at any point leaves at most
an unnamed file, which ``orphans`` lists once it is older than the grace.

Durability: a local file is written, fsynced and its directory fsynced
before ``write`` returns; an S3 object exists only once its upload
completed (``close`` of the output stream), which is S3's durability.

Credentials (S3): ``[cold_storage] credentials_file`` (owner-only, one line
``access_key:secret_key``) or pyarrow's defaults (``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` in the environment, the machine's role); never on
a command line.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import pyarrow.fs as pafs

from appliance.errors import ConfigError
from appliance.protocol import limits

SUFFIX = ".parquet"
S3_OPTIONS = ("endpoint_override", "scheme", "region")  # in an s3:// URI's query


def read_s3_credentials(path: str | os.PathLike) -> tuple[str, str]:
    """(access_key, secret_key) from an owner-only ``access:secret`` file."""
    where = f"cold_storage.credentials_file {path}"
    try:
        mode = os.stat(path).st_mode
        with open(path, "rb") as fh:
            raw = fh.read(limits.COLD_CREDENTIALS_FILE_BYTES_MAX + 1)
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read it ({exc.strerror or exc}); fix: write "
                          "access_key:secret_key into it and chmod 600 it") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"{where}: is open to other users (mode {stat.S_IMODE(mode):o}); "
                          f"fix: chmod 600 {path}")
    lines = [ln.strip() for ln in raw.decode("utf-8", "replace").splitlines() if ln.strip()]
    access, colon, secret = lines[0].partition(":") if len(lines) == 1 else ("", "", "")
    if len(raw) > limits.COLD_CREDENTIALS_FILE_BYTES_MAX or not (colon and access and secret):
        raise ConfigError(f"{where}: must hold one line access_key:secret_key")
    return access, secret


class ColdStore:
    """The configured cold tier: where new files go, and how to open any
    file a segment names (``open``)."""

    def __init__(self, uri: str, credentials_file: str | os.PathLike = ""):
        if not uri:
            raise ConfigError("cold storage is off: set [cold_storage] uri in the config")
        self.uri = uri.rstrip("/")
        self._credentials_file = credentials_file
        self.fs, self.root = self._filesystem(self.uri)
        self.local = isinstance(self.fs, pafs.LocalFileSystem)

    @classmethod
    def from_config(cls, cold_config) -> ColdStore:
        return cls(cold_config.uri, cold_config.credentials_file)

    def _filesystem(self, uri: str):
        parts = urlsplit(uri)
        try:
            if parts.scheme != "s3":
                fs, path = pafs.FileSystem.from_uri(uri)
                return fs, path.rstrip("/")
            options = dict(parse_qsl(parts.query))
            unknown = sorted(set(options) - set(S3_OPTIONS))
            if unknown:
                raise ValueError(f"unknown option(s) {', '.join(unknown)}; known: "
                                 f"{', '.join(S3_OPTIONS)}")
            if self._credentials_file:
                options["access_key"], options["secret_key"] = \
                    read_s3_credentials(self._credentials_file)
            return pafs.S3FileSystem(**options), (parts.netloc + parts.path).rstrip("/")
        except (OSError, ValueError, TypeError) as exc:
            raise ConfigError(f"cold storage {self.public(uri)}: {exc}") from None

    @staticmethod
    def public(uri: str) -> str:
        """A URI without its query (credentials never printed)."""
        return urlunsplit(urlsplit(uri)._replace(query=""))

    # -- names ------------------------------------------------------------------------
    def new_path(self, log_name: str, seq: int, ledger_id: int) -> str:
        return f"{self.root}/{log_name}/{seq}-{ledger_id}-{secrets.token_hex(6)}{SUFFIX}"

    def uri_of(self, path: str) -> str:
        """The URI recorded in the segment's metadata for a path of this store."""
        if self.local:
            return Path(path).as_uri()
        bucket, _, key = path.partition("/")
        return urlunsplit((urlsplit(self.uri).scheme, bucket, "/" + key if key else "", "", ""))

    def open(self, uri: str):
        """(filesystem, path) of a file a segment names: this store's own
        filesystem when the URI is under it (credentials and endpoint from
        the config), else pyarrow's default for that URI."""
        mine = self.uri_of(self.root)
        if uri.startswith(mine + "/"):
            return self.fs, self.root + uri[len(mine):]
        fs, path = pafs.FileSystem.from_uri(uri)
        return fs, path

    # -- files ------------------------------------------------------------------------
    def write(self, path: str, data: bytes) -> None:
        """Create ``path`` holding ``data``; durable when it returns.  Local
        files and folders are owner-only (docs/SECURITY.md), as the
        bookies' data."""
        if not self.local:
            self.fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
            with self.fs.open_output_stream(path) as sink:  # the upload completes on close
                sink.write(data)
            return
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        fd = os.open(os.path.dirname(path), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def delete(self, uri: str) -> bool:
        """Remove a file a segment named; False if it was not there."""
        fs, path = self.open(uri)
        try:
            fs.delete_file(path)
        except FileNotFoundError:
            return False
        return True

    def log_folders(self) -> list[str]:
        """The names of the logs that have a folder here."""
        selector = pafs.FileSelector(self.root, allow_not_found=True)
        return sorted(info.base_name for info in self.fs.get_file_info(selector)
                      if info.type == pafs.FileType.Directory)

    def files(self, log_name: str) -> list[tuple[str, float]]:
        """(uri, modification time in s) of every file under the log's folder."""
        selector = pafs.FileSelector(f"{self.root}/{log_name}", allow_not_found=True)
        out = []
        for info in self.fs.get_file_info(selector):
            if info.type == pafs.FileType.File:
                mtime = info.mtime.timestamp() if info.mtime is not None else 0.0
                out.append((self.uri_of(info.path), mtime))
        return out
