"""Cookies and format: a missing, swapped, foreign or mixed cookie is refused
with a message naming the directory; format refuses to overwrite data; a
filesystem refusing O_DIRECT is refused unless direct_io = false."""

from __future__ import annotations

import logging
import os

import pytest

from appliance.errors import ConfigError, CookieMismatchError
from storage import LedgerStorage, aligned_io

from .conftest import small_options


def _open(journal_dir, ledger_dir, bookie_id="bookie-1", **overrides):
    return LedgerStorage.open(bookie_id, journal_dir, ledger_dir, small_options(**overrides))


def test_cookie_identity_is_exposed(opener, dirs):
    st = opener()
    assert len(st.instance_id) == 32
    assert st.cookie["bookie_id"] == "bookie-1"
    assert st.cookie["ledger_dir"] == os.path.abspath(dirs[1])


def test_missing_cookie_is_refused(dirs):
    os.unlink(os.path.join(dirs[1], "COOKIE"))
    with pytest.raises(CookieMismatchError, match="ledger_dir .* has no cookie"):
        _open(*dirs)


def test_swapped_directories_are_refused(dirs):
    with pytest.raises(CookieMismatchError, match="swapped"):
        _open(dirs[1], dirs[0])


def test_foreign_bookie_is_refused(dirs):
    with pytest.raises(CookieMismatchError, match="belongs to bookie 'bookie-1'"):
        _open(*dirs, bookie_id="bookie-2")


def test_directories_from_different_formats_are_refused(tmp_path, dirs):
    other_journal = tmp_path / "other-journal"
    LedgerStorage.format("bookie-1", other_journal, tmp_path / "other-ledgers", small_options())
    with pytest.raises(CookieMismatchError, match="different formats"):
        _open(other_journal, dirs[1])


def test_corrupt_cookie_is_refused(dirs):
    path = os.path.join(dirs[0], "COOKIE")
    with open(path, "r+b") as f:
        f.seek(20)
        f.write(b"#")
    with pytest.raises(CookieMismatchError, match="corrupt"):
        _open(*dirs)


def test_format_refuses_non_empty_dirs_unless_forced(dirs):
    st = _open(*dirs)
    st.add_entry(1, 0, b"data")
    st.close()
    with pytest.raises(ConfigError, match="not empty"):
        LedgerStorage.format("bookie-1", *dirs, small_options())
    LedgerStorage.format("bookie-1", *dirs, small_options(), force=True)
    st = _open(*dirs)
    try:
        assert st.ledgers() == []
    finally:
        st.close()


def test_format_force_keeps_foreign_files_and_refuses(dirs):
    with open(os.path.join(dirs[1], "notes.txt"), "w") as f:
        f.write("not ours")
    with pytest.raises(ConfigError, match="notes.txt"):
        LedgerStorage.format("bookie-1", *dirs, small_options(), force=True)
    assert os.path.exists(os.path.join(dirs[1], "notes.txt"))


def test_same_directory_for_both_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="same directory"):
        LedgerStorage.format("bookie-1", tmp_path / "d", tmp_path / "d", small_options())


def test_refused_o_direct_stops_the_open_with_the_fix(dirs, monkeypatch):
    monkeypatch.setattr(aligned_io, "probe_direct_io", lambda directory: False)
    with pytest.raises(ConfigError, match="refuses O_DIRECT.*direct_io = false"):
        _open(*dirs)


def test_direct_io_off_warns_once_and_works(dirs, monkeypatch, caplog):
    monkeypatch.setattr(aligned_io, "probe_direct_io", lambda directory: False)
    monkeypatch.setattr(aligned_io, "_warned_buffered", set())
    caplog.set_level(logging.WARNING, logger="storage.aligned_io")
    for _ in range(2):
        st = _open(*dirs, direct_io=False)
        try:
            st.wait_durable(st.add_entry(1, 0, b"buffered"), timeout_s=10)
            assert st.read_entry(1, 0) == b"buffered"
        finally:
            st.close()
    warnings = [r for r in caplog.records if "direct_io = false" in r.getMessage()]
    assert len(warnings) == 2  # once per directory (journal, ledger), not per open


def test_probe_detects_this_filesystem(tmp_path):
    # The machines this runs on (ext4 on NVMe/virtio) accept O_DIRECT; the probe
    # must say so by really writing, and leave nothing behind.
    assert aligned_io.probe_direct_io(str(tmp_path)) is True
    assert os.listdir(tmp_path) == []


def test_bad_options_are_refused_with_the_key():
    with pytest.raises(ConfigError, match="entry_log_rotate_bytes"):
        small_options(entry_log_rotate_bytes=5 * 1024**3).validate()
    with pytest.raises(ConfigError, match="journal_group_wait_us"):
        small_options(journal_group_wait_us=-1).validate()
    small_options(journal_group_wait_us=0).validate()  # 0: no wait (the default)
    with pytest.raises(ConfigError, match="journal_write_data"):
        small_options(journal_write_data="yes").validate()
