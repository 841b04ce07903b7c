"""Direct-I/O plumbing: the O_DIRECT probe, page-aligned buffers, aligned writes,
and the fsync helpers every durable file goes through.

Guarantees: a write handed to ``write_aligned`` starts at a 4 KiB-aligned file
offset and covers whole 4 KiB pages (the tail is zero-padded), so it is
accepted by O_DIRECT.  Data already durable in a file is never overwritten:
callers always write at or past their last aligned end.  A filesystem that
refuses O_DIRECT is detected at open by a real aligned write in the target
directory, not guessed from its type; a full disk is not mistaken for one
that refuses O_DIRECT (``probe_direct_io``), and ``out_of_space`` tells a
full disk apart from a broken one in any error the storage records.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os

from appliance.protocol.errors import BookieIOError, ConfigError

from .options import ALIGN_BYTES

log = logging.getLogger(__name__)

_warned_buffered: set[str] = set()


def align_up(n: int) -> int:
    return -(-n // ALIGN_BYTES) * ALIGN_BYTES


FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def out_of_space(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or an error it was raised from) says the disk or the
    quota is full: a state that freeing space ends, unlike an I/O error."""
    seen = 0
    while exc is not None and seen < 8:  # a short chain; never loop on a cycle
        if isinstance(exc, OSError) and exc.errno in FULL_ERRNOS:
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def probe_direct_io(directory: str) -> bool:
    """True if ``directory``'s filesystem accepts an aligned O_DIRECT write.
    A full disk (no room for the probe's one page, or its file) says
    nothing against O_DIRECT: True, and the storage then finds the disk full
    itself (a bookie on a full disk boots read-only, it is not refused)."""
    path = os.path.join(directory, ".direct-io-probe")
    buf = mmap.mmap(-1, ALIGN_BYTES)
    try:
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC | os.O_DIRECT, FILE_MODE)
    except OSError as exc:
        buf.close()
        if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP):
            return False
        if exc.errno in FULL_ERRNOS:
            log.warning("%s is full (%s): direct I/O not probed", directory, exc)
            return True
        raise
    try:
        os.pwrite(fd, buf, 0)
        return True
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP):
            return False
        if exc.errno in FULL_ERRNOS:  # the O_DIRECT open was accepted; only room lacks
            log.warning("%s is full (%s): direct I/O probed by its open only", directory, exc)
            return True
        raise
    finally:
        os.close(fd)
        buf.close()
        os.unlink(path)


def decide_direct_io(directory: str, wanted: bool, key_hint: str) -> bool:
    """Whether to use O_DIRECT in ``directory``; refuse if wanted but impossible."""
    if wanted:
        if probe_direct_io(directory):
            return True
        raise ConfigError(
            f"{key_hint} {directory!r} is on a filesystem that refuses O_DIRECT: move it to "
            f"a filesystem with direct I/O (ext4, xfs on a real device) or set "
            f"direct_io = false in [storage] (buffered writes + fdatasync)")
    if directory not in _warned_buffered:
        _warned_buffered.add(directory)
        log.warning("direct_io = false: %s uses buffered writes + fdatasync "
                    "(durability unchanged, page cache pollution and latency jitter)", directory)
    return False


class AlignedBuffer:
    """A page-aligned, zero-initialised write buffer (anonymous mmap)."""

    def __init__(self, capacity_bytes: int):
        self.capacity_bytes = align_up(max(capacity_bytes, ALIGN_BYTES))
        self.mem = mmap.mmap(-1, self.capacity_bytes)
        self.view = memoryview(self.mem)
        self.used_bytes = 0

    def room(self) -> int:
        return self.capacity_bytes - self.used_bytes

    def append(self, data) -> int:
        """Copy ``data`` in; returns its offset in the buffer."""
        start = self.used_bytes
        end = start + len(data)
        self.view[start:end] = data
        self.used_bytes = end
        return start

    def padded(self) -> memoryview:
        """The used bytes, zero-padded up to a 4 KiB multiple."""
        end = align_up(self.used_bytes)
        if end > self.used_bytes:
            self.view[self.used_bytes:end] = bytes(end - self.used_bytes)
        return self.view[:end]

    def reset(self) -> None:
        self.used_bytes = 0

    def close(self) -> None:
        self.view.release()
        try:
            self.mem.close()
        except BufferError:
            pass  # a view is still held (e.g. by a failed write's traceback): freed by GC


FILE_MODE = 0o600  # every data, journal, index and marker file: owner only
DIR_MODE = 0o700  # and every directory the appliance creates


def make_dirs(path) -> None:
    """``os.makedirs`` with ``DIR_MODE`` for every directory it creates
    (``os.makedirs``' own mode applies only to the last one)."""
    path = os.path.abspath(os.fspath(path))
    missing = []
    while not os.path.isdir(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, DIR_MODE)
        except FileExistsError:
            continue
        os.chmod(directory, DIR_MODE)  # whatever the umask took away


def open_for_write(path: str, direct: bool, create: bool = True) -> int:
    flags = os.O_WRONLY | os.O_CLOEXEC | (os.O_CREAT | os.O_EXCL if create else 0)
    if direct:
        flags |= os.O_DIRECT
    try:
        return os.open(path, flags, FILE_MODE)
    except OSError as exc:
        raise BookieIOError(f"cannot open {path} for writing: {exc}") from exc


def write_aligned(fd: int, view: memoryview, offset: int, path: str) -> None:
    """pwrite all of ``view`` (aligned length) at ``offset`` (aligned)."""
    done = 0
    while done < len(view):
        try:
            n = os.pwrite(fd, view[done:], offset + done)
        except OSError as exc:
            raise BookieIOError(f"write to {path} at {offset + done} failed: {exc}") from exc
        if n <= 0:
            raise BookieIOError(f"write to {path} at {offset + done} wrote nothing")
        done += n


def fdatasync(fd: int, path: str) -> None:
    try:
        os.fdatasync(fd)
    except OSError as exc:
        # After a failed fsync the page state is unknown (fsyncgate): never retry.
        raise BookieIOError(f"fdatasync of {path} failed: {exc}") from exc


def fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file_atomic(path: str, chunks, fsync_parent: bool = True) -> None:
    """Write ``chunks`` to ``path`` via a temp file + fsync + rename (+ dir fsync)."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_CREAT | os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
    try:
        for chunk in chunks:
            view = memoryview(chunk)
            while len(view):
                n = os.write(fd, view)
                view = view[n:]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if fsync_parent:
        fsync_dir(os.path.dirname(path) or ".")


SCAN_WINDOW_BYTES = 8 * 1024 * 1024  # what a scan holds in memory (or one record)


class FileWindow:
    """Sliding read window over a file, so scans of 64 MiB segments or 1 GiB
    logs hold at most ``SCAN_WINDOW_BYTES`` (or one record) in memory."""

    def __init__(self, fd: int, size: int):
        self.fd, self.size = fd, size
        self.base, self.buf = 0, b""

    def get(self, pos: int, nbytes: int) -> tuple[bytes, int]:
        """(buffer, index of pos in it) holding ``nbytes`` from pos, or fewer at EOF."""
        if self.base <= pos and pos + nbytes <= self.base + len(self.buf):
            return self.buf, pos - self.base
        self.base = pos
        self.buf = os.pread(self.fd, max(SCAN_WINDOW_BYTES, nbytes), pos)
        return self.buf, 0
