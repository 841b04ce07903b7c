"""The few-entry fast paths (struct and scalars instead of numpy) give
exactly what the numpy paths give: the same block bytes and offsets, the
same index contents and counts, the same refusals."""

import random

import numpy as np
import pytest

from storage import codec
from storage import index as ix


def _both(module, knob, fn):
    small = fn()
    saved = getattr(module, knob)
    setattr(module, knob, -1)  # force the numpy path
    try:
        return small, fn()
    finally:
        setattr(module, knob, saved)


@pytest.mark.parametrize("count", [1, 2, 7, codec.SMALL_BLOCK_RECORDS])
def test_small_blocks_are_byte_identical(count):
    rng = random.Random(count)
    ledgers = np.array([rng.choice([1, 2 ** 40]) for _ in range(count)], np.uint64)
    entries = np.array([rng.randrange(2 ** 33) for _ in range(count)], np.uint64)
    datas = [rng.randbytes(rng.randrange(0, 3000)) for _ in range(count)]
    lengths = np.array([len(d) for d in datas], np.int64)
    (small, small_offsets), (big, big_offsets) = _both(
        codec, "SMALL_BLOCK_RECORDS", lambda: codec.build_block(9, ledgers, entries, datas,
                                                                lengths))
    assert small == big and small_offsets.tolist() == big_offsets.tolist()
    info = codec.parse_block(small, 0)
    assert info is not None and info.block_len == len(small) and len(info.entries) == count


def _state(index):
    return {ledger_id: (led.entries, led.data_bytes, led.last_entry,
                        {no: page.tolist() for no, page in led.pages.items()})
            for ledger_id, led in index.ledgers.items()}


def test_small_puts_leave_the_index_as_batched_puts_do():
    rng = random.Random(7)
    for _ in range(40):
        small, big = ix.Index(), ix.Index()
        for _ in range(4):
            n = rng.randint(1, ix.SMALL_PUT_ENTRIES)
            args = (np.array([rng.choice([1, 2]) for _ in range(n)], np.uint64),
                    np.array([rng.choice([0, 1, 4095, 4096, rng.randrange(20000)])
                              for _ in range(n)], np.uint64),  # repeats included
                    3, np.array([rng.randrange(2 ** 31) for _ in range(n)], np.int64),
                    np.array([rng.randrange(5000) for _ in range(n)], np.int64))
            small.put_batch(*args)
            saved, ix.SMALL_PUT_ENTRIES = ix.SMALL_PUT_ENTRIES, -1  # the numpy path
            try:
                big.put_batch(*args)
            finally:
                ix.SMALL_PUT_ENTRIES = saved
        assert _state(small) == _state(big)


def test_small_runs_of_consecutive_ids_leave_the_index_as_batched_puts_do():
    """The one-ledger consecutive-ids path (slices): near page edges, over
    entries already stored (a resend), and mixed with other puts."""
    rng = random.Random(11)
    for _ in range(60):
        small, big = ix.Index(), ix.Index()
        for _ in range(6):
            n = rng.randint(1, ix.SMALL_PUT_ENTRIES)
            first = rng.choice([0, 1, ix.PAGE_SLOTS - n, ix.PAGE_SLOTS - 1, ix.PAGE_SLOTS + 3,
                                rng.randrange(3 * ix.PAGE_SLOTS)])
            ledger = rng.choice([1, 2])
            args = (np.full(n, ledger, np.uint64), np.arange(first, first + n, dtype=np.uint64),
                    rng.randrange(1, 9), np.array([rng.randrange(2 ** 31) for _ in range(n)],
                                                  np.int64),
                    np.array([rng.randrange(5000) for _ in range(n)], np.int64))
            small.put_batch(*args)
            saved, ix.SMALL_PUT_ENTRIES = ix.SMALL_PUT_ENTRIES, -1  # the numpy path
            try:
                big.put_batch(*args)
            finally:
                ix.SMALL_PUT_ENTRIES = saved
        assert _state(small) == _state(big)


def test_per_log_ledger_bytes_count_each_record_once(opener):
    st = opener()
    sizes = {1: 0, 2: 0}
    for n, ledgers in ((1, [1]), (5, [1] * 5), (40, [2] * 40), (6, [1, 2] * 3)):
        datas = [bytes(range(i % 200)) for i in range(n)]
        first = {led: st.last_entry_id(led) + 1 if st.ledger_exists(led) else 0
                 for led in (1, 2)}
        entries = []
        for led in ledgers:
            entries.append(first[led])
            first[led] += 1
        st.add_entries(ledgers, entries, datas)
        for led, data in zip(ledgers, datas, strict=True):
            sizes[led] += len(data) + codec.RECORD_HEADER_BYTES
    per_log = st.ledger_bytes()
    assert {led: sum(p.get(led, 0) for p in per_log.values()) for led in (1, 2)} == sizes
