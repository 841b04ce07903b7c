"""Files bkctl itself creates are owner-only, whatever the caller's umask."""

from __future__ import annotations

import os
import stat

from cli.admin import _open_owner_only


def test_the_supervisor_log_is_created_and_kept_owner_only(tmp_path):
    path = tmp_path / "supervisor.log"
    old = os.umask(0o022)
    try:
        with _open_owner_only(path) as out:
            out.write(b"one\n")
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        path.chmod(0o644)  # left wider by an earlier run
        with _open_owner_only(path) as out:
            out.write(b"two\n")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_bytes() == b"one\ntwo\n"
