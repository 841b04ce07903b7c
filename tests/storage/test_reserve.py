"""The RESERVE room of a bookie's directories: taken at open, given back
when an open finds the disk full (which then retries once and says so),
taken again on request; a journal segment's unused preallocated tail is cut
at the next open."""

from __future__ import annotations

import errno
import os

from appliance.protocol import limits
from storage import LedgerStorage, StorageOptions
from storage import storage_files as sf
from storage.journal_scan import list_segments, segment_path

OPTS = StorageOptions(checkpoint_interval_s=3600.0, journal_segment_bytes=16 << 20,
                      add_batch_bytes_max=8 << 20)


def _dirs(tmp_path):
    journal, ledgers = tmp_path / "journal", tmp_path / "ledgers"
    LedgerStorage.format("b1", journal, ledgers, OPTS)
    return journal, ledgers


def _reserve(directory) -> int:
    path = directory / sf.RESERVE_NAME
    return path.stat().st_blocks * 512 if path.exists() else 0


def test_open_keeps_a_reserve_in_each_directory(tmp_path):
    journal, ledgers = _dirs(tmp_path)
    with LedgerStorage.open("b1", journal, ledgers, OPTS) as st:
        assert not st.reserves_released
        assert _reserve(journal) >= limits.STORAGE_RESERVE_BYTES
        assert _reserve(ledgers) >= limits.STORAGE_RESERVE_BYTES


def test_an_open_that_finds_the_disk_full_gives_the_reserve_back_and_retries(tmp_path,
                                                                            monkeypatch):
    journal, ledgers = _dirs(tmp_path)
    LedgerStorage.open("b1", journal, ledgers, OPTS).close()  # reserves taken
    real = sf.recover_into
    calls = []

    def full_unless_released(st, reserve=True):
        calls.append(reserve)
        if reserve:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(st, reserve)

    monkeypatch.setattr(sf, "recover_into", full_unless_released)
    with LedgerStorage.open("b1", journal, ledgers, OPTS) as st:
        assert calls == [True, False] and st.reserves_released
        assert _reserve(journal) == 0 and _reserve(ledgers) == 0
        st.add_entry(1, 0, b"x" * 100)
        st.flush()
        assert st.restore_reserves()
        assert _reserve(journal) >= limits.STORAGE_RESERVE_BYTES


def test_the_last_segments_unused_tail_is_cut_at_the_next_open(tmp_path):
    journal, ledgers = _dirs(tmp_path)
    with LedgerStorage.open("b1", journal, ledgers, OPTS) as st:
        st.add_entry(1, 0, b"x" * 100)
        st.flush()
        first = list_segments(str(journal))[-1]
        assert os.path.getsize(segment_path(str(journal), first)) == OPTS.journal_segment_bytes
    with LedgerStorage.open("b1", journal, ledgers, OPTS) as st:
        assert st.read_entry(1, 0) == b"x" * 100
        # the clean close left it as the checkpoint mark: replayed from, not freed
        assert os.path.getsize(segment_path(str(journal), first)) < OPTS.journal_segment_bytes
