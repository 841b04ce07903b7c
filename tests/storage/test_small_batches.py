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


def _page(page: np.ndarray) -> tuple:
    """A page as comparable bytes: equal exactly when the arrays are (tolist()
    of every 4096-slot page took most of these tests' time)."""
    return page.dtype.str, page.shape, page.tobytes()


def _state(index):
    return {ledger_id: (led.entries, led.data_bytes, led.last_entry,
                        {no: _page(page) for no, page in led.pages.items()})
            for ledger_id, led in index.ledgers.items()}


def _put_both(fast, slow, args, knob: str = "SCALAR_LEDGER_ENTRIES", forced: int = 0):
    """``args`` put into ``fast`` as put_batch chooses, and into ``slow`` with
    ``storage.index``'s ``knob`` set to ``forced`` (the numpy path)."""
    fast.put_batch(*args)
    saved = getattr(ix, knob)
    setattr(ix, knob, forced)
    try:
        slow.put_batch(*args)
    finally:
        setattr(ix, knob, saved)


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
            _put_both(small, big, args, "SMALL_PUT_ENTRIES", -1)  # the numpy path
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
            _put_both(small, big, args, "SMALL_PUT_ENTRIES", -1)  # the numpy path
        assert _state(small) == _state(big)


def test_many_ledger_puts_leave_the_index_as_batched_puts_do():
    """Batches bigger than the small path's, of many ledgers with a few
    entries each (many ledgers written at once), go entry by entry with
    scalars: the index ends as the per-ledger numpy scatter leaves it,
    repeated ids and page edges included."""
    rng = random.Random(5)
    for _ in range(30):
        scalar, numpy_ = ix.Index(), ix.Index()
        for _ in range(4):
            n = rng.randint(ix.SMALL_PUT_ENTRIES + 1, 400)
            ledgers = rng.randint(n // 4, n)  # 1-4 entries a ledger on average
            args = (np.array([rng.randrange(ledgers) for _ in range(n)], np.uint64),
                    np.array([rng.choice([0, 1, 4095, 4096, rng.randrange(20000)])
                              for _ in range(n)], np.uint64),
                    rng.randrange(1, 9), np.array([rng.randrange(2 ** 31) for _ in range(n)],
                                                  np.int64),
                    np.array([rng.randrange(5000) for _ in range(n)], np.int64))
            _put_both(scalar, numpy_, args)  # the numpy path: per-ledger scatters
        assert _state(scalar) == _state(numpy_)


def test_many_ledger_runs_leave_the_index_as_batched_puts_do():
    """The usual many-ledgers block: each ledger's few consecutive ids (a
    writer's batch), as slices when the run is long enough; runs crossing
    a page edge, starting past a page's end, short ones, and a ledger's run
    written twice in one block (a resend) end as the numpy path leaves
    them."""
    rng = random.Random(13)
    for _ in range(40):
        runs, numpy_ = ix.Index(), ix.Index()
        next_id: dict[int, int] = {}
        for _ in range(4):
            lids, ids = [], []
            while len(lids) < ix.SMALL_PUT_ENTRIES + rng.randint(1, 300):
                ledger = rng.randrange(60)
                n = rng.choice([1, 2, ix.RUN_PUT_ENTRIES_MIN - 1, ix.RUN_PUT_ENTRIES_MIN, 7, 12])
                first = next_id.get(ledger, rng.choice([0, ix.PAGE_SLOTS - 3,
                                                        ix.PAGE_SLOTS + 40]))
                if rng.random() < 0.1:
                    first = max(0, first - n)  # written again
                lids += [ledger] * n
                ids += range(first, first + n)
                next_id[ledger] = first + n
            count = len(lids)
            args = (np.array(lids, np.uint64), np.array(ids, np.uint64), rng.randrange(1, 9),
                    np.array([rng.randrange(2 ** 31) for _ in range(count)], np.int64),
                    np.array([rng.randrange(5000) for _ in range(count)], np.int64))
            _put_both(runs, numpy_, args)  # the numpy path: per-ledger scatters
        assert _state(runs) == _state(numpy_)


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


@pytest.mark.parametrize("count", [1, 2, 7, 32])
def test_one_ledger_blocks_from_lists_are_byte_identical(count):
    rng = random.Random(100 + count)
    ledger = rng.choice([1, 2 ** 40])
    entries = [rng.randrange(2 ** 33) for _ in range(count)]
    datas = [rng.randbytes(rng.randrange(0, 3000)) for _ in range(count)]
    lengths = [len(d) for d in datas]
    block, offsets = codec.build_ledger_block(9, ledger, entries, datas, lengths)
    want, want_offsets = codec.build_block(9, np.full(count, ledger, np.uint64),
                                           np.array(entries, np.uint64), datas,
                                           np.array(lengths, np.int64))
    assert block == want and offsets == want_offsets.tolist()


def test_small_one_ledger_puts_from_lists_leave_the_index_as_batched_puts_do():
    """Runs near page edges, resends over stored entries, scattered and
    repeated ids: ``put_ledger_small`` leaves what ``put_batch`` leaves."""
    rng = random.Random(13)
    for _ in range(60):
        small, big = ix.Index(), ix.Index()
        for _ in range(6):
            n = rng.randint(1, 32)
            ledger = rng.choice([1, 2])
            if rng.random() < 0.6:
                first = rng.choice([0, 1, ix.PAGE_SLOTS - n, ix.PAGE_SLOTS - 1,
                                    rng.randrange(3 * ix.PAGE_SLOTS)])
                entries = list(range(first, first + n))
            else:
                entries = [rng.choice([0, 1, 4095, 4096, rng.randrange(20000)])
                           for _ in range(n)]
            log_id = rng.randrange(1, 9)
            offsets = [rng.randrange(2 ** 31) for _ in range(n)]
            lengths = [rng.randrange(5000) for _ in range(n)]
            small.put_ledger_small(ledger, entries, log_id, offsets, lengths)
            big.put_batch(np.full(n, ledger, np.uint64), np.array(entries, np.uint64), log_id,
                          np.array(offsets, np.int64), np.array(lengths, np.int64))
        assert _state(small) == _state(big)


def _general_path_only(monkeypatch):
    from storage import ledger_storage

    monkeypatch.setattr(ledger_storage.LedgerStorage, "_one_ledger_small",
                        lambda self, *args: None)


@pytest.mark.parametrize("small_path", [True, False])
def test_small_one_ledger_adds_store_and_replay_as_the_general_path(opener, monkeypatch,
                                                                    small_path):
    """The same adds through the list path and through the general one:
    the same entries read back, the same counts, and after a crash (no
    checkpoint) the journal replays them all."""
    if not small_path:
        _general_path_only(monkeypatch)
    st = opener()
    rng = random.Random(5)
    want = {}
    next_id = {1: 0, 2: 0}
    for _ in range(50):
        ledger = rng.choice([1, 2])
        n = rng.randint(1, 32)
        ids = list(range(next_id[ledger], next_id[ledger] + n))
        next_id[ledger] += n
        datas = [memoryview(rng.randbytes(rng.randrange(0, 2000))) for _ in range(n)]
        ticket = st.add_entries((ledger,) * n, tuple(ids), datas)
        assert st.wait_durable(ticket, 30)
        want.update({(ledger, e): bytes(d) for e, d in zip(ids, datas, strict=True)})
    stats = st.stats()
    assert stats["adds"] == len(want) and stats["add_batches"] == 50
    for (ledger, entry), data in want.items():
        assert st.read_entry(ledger, entry) == data
    st.abort()  # a crash: what was durable comes back from the journal
    st2 = opener()
    for (ledger, entry), data in want.items():
        assert st2.read_entry(ledger, entry) == data
    assert {led: st2.last_entry_id(led) for led in (1, 2)} == {
        led: next_id[led] - 1 for led in (1, 2)}


@pytest.mark.parametrize("ledgers, entries", [
    ([-1], [0]), ([1], [-1]), ([2 ** 63], [0]), ([1], [2 ** 63]), ([1, 1], [0, -5]),
])
def test_small_batches_refused_as_before(opener, monkeypatch, ledgers, entries):
    """Ids out of range are refused with the general path's exception."""
    st = opener()
    datas = [b"x"] * len(entries)
    with pytest.raises(Exception) as small:
        st.add_entries(ledgers, entries, datas)
    _general_path_only(monkeypatch)
    with pytest.raises(Exception) as general:
        st.add_entries(ledgers, entries, datas)
    assert type(small.value) is type(general.value)
    assert str(small.value) == str(general.value)
