"""Fixtures for the storage tests: formatted directories, small knobs that make
rotation, segment rolls and checkpoints happen within a few hundred KiB, and
an opener that closes (or aborts) every storage it opened, also on failure."""

from __future__ import annotations

import pytest

from storage import LedgerStorage, StorageOptions

KiB = 1024


# The entry-log managers every storage test runs against (the ``dirs`` fixture
# is parametrized over them, so each test using ``dirs``/``opener`` runs in
# both).  Per-ledger: a cap of 3 open logs and 8 KiB buffers, so cap
# rotations and oversized blocks happen in ordinary tests.
LOG_MODES = {
    "interleaved": {},
    "per_ledger": dict(entry_log_per_ledger=True, entry_logs_open_max=3,
                       entry_log_ledger_buffer_bytes=8 * KiB),
}
_current_mode: dict = {}


def small_options(**overrides) -> StorageOptions:
    """Small knobs in the entry-log mode of the running test (``log_mode``)."""
    overrides = {**_current_mode, **overrides}
    opts = StorageOptions(
        journal_group_wait_us=200,
        journal_group_bytes=64 * KiB,
        journal_segment_bytes=512 * KiB,
        entry_log_rotate_bytes=512 * KiB,
        entry_log_buffer_bytes=32 * KiB,
        add_batch_bytes_max=128 * KiB,
        entry_bytes_max=64 * KiB,
        checkpoint_interval_s=3600.0,
    )
    for key, value in overrides.items():
        setattr(opts, key, value)
    return opts


@pytest.fixture(params=sorted(LOG_MODES))
def log_mode(request):
    """The entry-log mode ``small_options`` uses for the rest of the test."""
    _current_mode.clear()
    _current_mode.update(LOG_MODES[request.param])
    yield request.param
    _current_mode.clear()


@pytest.fixture
def dirs(tmp_path, log_mode):
    journal_dir, ledger_dir = tmp_path / "journal", tmp_path / "ledgers"
    LedgerStorage.format("bookie-1", journal_dir, ledger_dir, small_options())
    return journal_dir, ledger_dir


@pytest.fixture
def opener(dirs):
    """``opener(**option_overrides)`` opens the formatted dirs; all closed at teardown."""
    opened: list[LedgerStorage] = []

    def _open(**overrides) -> LedgerStorage:
        st = LedgerStorage.open("bookie-1", *dirs, small_options(**overrides))
        opened.append(st)
        return st

    yield _open
    for st in opened:
        st.abort()
