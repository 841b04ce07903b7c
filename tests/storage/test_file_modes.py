"""Local security: storage creates every directory 0700 and every file 0600,
whatever the process umask (here the common 022)."""

from __future__ import annotations

import os
import stat

from storage import LedgerStorage

from .conftest import small_options


def _modes(root) -> dict[str, int]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            out[os.path.relpath(path, root)] = stat.S_IMODE(os.lstat(path).st_mode)
    return out


def test_storage_files_and_directories_are_owner_only(tmp_path, log_mode):
    old = os.umask(0o022)
    try:
        journal, ledgers = tmp_path / "data" / "j", tmp_path / "data" / "l"
        opts = small_options()
        LedgerStorage.format("bookie-1", journal, ledgers, opts)
        st = LedgerStorage.open("bookie-1", journal, ledgers, opts)
        for i in range(200):
            st.add_entries([1, 2], [i, i], [os.urandom(2000), b"x"])
        st.flush()
        st.delete_ledger(2)
        st.compact(major=True)
        st.close()
    finally:
        os.umask(old)
    modes = _modes(tmp_path / "data")
    assert len(modes) >= 8, modes  # dirs, cookies, journal segments, logs, snapshot, locks
    assert stat.S_IMODE(os.stat(tmp_path / "data").st_mode) == 0o700
    too_open = {p: oct(m) for p, m in modes.items() if m & 0o077}
    assert too_open == {}, too_open
