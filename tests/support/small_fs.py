"""A small ext4 file system of its own for a test: an image file, a loop
device, ``mkfs.ext4``, ``mount``; unmounted, detached and removed
afterwards, also on failure.  Needs root.

The image lives in memory (a tmpfs, ``/dev/shm``, all its room taken up
front) when there is room, else beside the test as a sparse file.  Either
way what a test sees is the ext4 file system above the loop device: its
O_DIRECT, fsync and ENOSPC are ext4's; only the loop device's own writes
and flushes cost no disk time in memory (the full-disk and kill -9 crash
tests spent most of their time there).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

MiB = 1 << 20
MEMORY_DIR = Path("/dev/shm")
COMMAND_TIMEOUT_S = 120


class SmallFsError(Exception):
    """A command that makes or removes the file system failed."""


def run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, check=True, capture_output=True, text=True,
                              timeout=COMMAND_TIMEOUT_S).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", "") or exc
        raise SmallFsError(f"{' '.join(cmd)}: {detail}") from exc


def _memory_image(folder: Path, size_mb: int) -> Path | None:
    """A ``size_mb`` file in ``folder`` with all its room allocated, or None
    when the tmpfs has not that much room."""
    image = folder / "small.img"
    fd = os.open(image, os.O_CREAT | os.O_WRONLY, 0o600)
    try:
        os.posix_fallocate(fd, 0, size_mb * MiB)
        return image
    except OSError:
        return None
    finally:
        os.close(fd)


@contextlib.contextmanager
def image_file(root: Path, size_mb: int):
    """The image's file: in memory when there is room, else under ``root``."""
    if MEMORY_DIR.is_dir() and os.access(MEMORY_DIR, os.W_OK):
        folder = Path(tempfile.mkdtemp(prefix="bk-small-fs-", dir=MEMORY_DIR))
        try:
            image = _memory_image(folder, size_mb)
            if image is not None:
                yield image
                return
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    image = root / "small.img"
    run(["truncate", "-s", f"{size_mb}M", str(image)])
    yield image


@contextlib.contextmanager
def ext4_fs(root: Path, size_mb: int, *, mount_name: str = "small"):
    """A ``size_mb`` ext4 file system (no blocks reserved for root: a root
    process meets ENOSPC where ``df`` says 100%) mounted at ``root /
    mount_name``; ``SmallFsError`` if a step fails."""
    mount = root / mount_name
    mount.mkdir()
    with image_file(root, size_mb) as image:
        device = run(["losetup", "--find", "--show", str(image)]).strip()
        try:
            # nodiscard: mkfs leaves the image's room allocated (a discard
            # would punch holes in the tmpfs file the writes then need back)
            run(["mkfs.ext4", "-q", "-m", "0", "-E", "nodiscard", device])
            run(["mount", device, str(mount)])
            try:
                yield mount
            finally:
                run(["umount", str(mount)])
        finally:
            subprocess.run(["losetup", "-d", device], check=False, capture_output=True)
