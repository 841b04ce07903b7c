"""The interleaved entry log hands its buffer to the writer at a random fill
between half and all of ``entry_log_buffer_bytes``: bookies that receive the
same bytes must not write their entry logs at the same moment (their journal
syncs would all wait behind those writes together).  Nothing appended is
lost or moved by it."""

from __future__ import annotations

import numpy as np

from storage.codec import RECORD_HEADER_BYTES, build_block, verify_record
from storage.entry_log import EntryLogger

from .conftest import small_options

KiB = 1024


def test_handoffs_fall_between_half_and_all_of_the_buffer_and_vary(tmp_path):
    opts = small_options(entry_log_buffer_bytes=32 * KiB,
                         entry_log_rotate_bytes=64 * 1024 * KiB).validate()
    dirs = [tmp_path / "b0", tmp_path / "b1"]
    for d in dirs:
        d.mkdir()
    logs = [EntryLogger(str(d), opts, bytes(16), True, 1) for d in dirs]
    try:
        placed, sizes = [], [[], []]
        for entry in range(600):
            data = bytes([entry % 251]) * 500
            block, offsets = build_block(entry + 1, np.array([7], np.uint64),
                                         np.array([entry], np.uint64), [data],
                                         np.array([len(data)], np.int64))
            for i, log in enumerate(logs):  # the same bytes to both, as to an ensemble
                writes, nbytes = log.stats["entry_log_writes"], log.stats["entry_log_bytes"]
                log_id, base = log.append_block(block)
                if log.stats["entry_log_writes"] != writes:
                    sizes[i].append(log.stats["entry_log_bytes"] - nbytes)
                if i == 0:
                    placed.append((log_id, base + int(offsets[0]), entry, data))
        for handed in sizes:
            assert len(handed) >= 10
            assert all(16 * KiB - len(block) < s <= 32 * KiB for s in handed)
            assert len(set(handed)) > 1  # not one fixed size
        assert sizes[0] != sizes[1]  # fed the same bytes, they hand off apart
        logs[0].sync()
        for log_id, offset, entry, data in placed:
            raw = logs[0].read_record(log_id, offset, RECORD_HEADER_BYTES + len(data))
            assert bytes(verify_record(raw, 7, entry, len(data), "test")) == data
    finally:
        for log in logs:
            log.close()
