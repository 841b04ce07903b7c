"""Bulk-read planning, pure: chunks never cross a fragment, respect the
batch size and a striped ledger's runs, and the window covers the range in
order without gaps or overlaps, also after chunks are split."""

from __future__ import annotations

import pytest

from appliance.client.bulk_read import BulkReadConfig
from appliance.client.bulk_read.plan import (
    UNBOUNDED_ENTRY_ID,
    ReadJob,
    chunk_last,
    fragment_end,
    run_len,
)
from appliance.protocol.metadata import LedgerMetadata


def _md(ensembles, e=3, w=3):
    return LedgerMetadata(42, e, w, min(w, 2), tuple(ensembles), state="CLOSED",
                          last_entry_id=999)


def _covers(window, first, last):
    assert window[0].first == first and window[-1].last == last
    for a, b in zip(window, window[1:], strict=False):
        assert b.first == a.last + 1 and a.first <= a.last


def test_fragment_end():
    md = _md([(0, ("a", "b", "c")), (10, ("a", "b", "d")), (20, ("e", "b", "d"))])
    assert [fragment_end(md, e) for e in (0, 9, 10, 19, 20, 10**9)] == \
        [9, 9, 19, 19, UNBOUNDED_ENTRY_ID, UNBOUNDED_ENTRY_ID]


def test_run_len_on_a_striped_ledger():
    md = _md([(0, ("a", "b", "c", "d"))], e=4, w=2)
    assert md.write_set(5) == ("b", "c")  # entry 5 -> index 5 % 4 = 1 onwards
    assert run_len(md, "b", 5) == 1  # b holds 4, 5; not 6
    assert run_len(md, "c", 5) == 2  # c holds 5, 6
    unstriped = _md([(0, ("a", "b", "c"))])
    assert run_len(unstriped, "a", 5) > 10**15


@pytest.mark.parametrize("e, w, batch, first, last, want", [
    (3, 3, 1024, 0, 999, 9),  # the fragment ends at 9
    (3, 3, 4, 0, 999, 3),  # the batch size
    (3, 3, 1024, 12, 15, 15),  # the end of the range
    (4, 2, 1024, 0, 999, 1),  # striped: at most Qw entries
])
def test_chunk_last(e, w, batch, first, last, want):
    ensembles = [(0, tuple("abcd"[:e])), (10, tuple("wxyz"[:e]))]
    assert chunk_last(_md(ensembles, e, w), first, last, batch) == want


def test_the_window_is_bounded_and_covers_the_range_in_order():
    md = _md([(0, ("a", "b", "c")), (10, ("a", "b", "d"))])
    job = ReadJob(md, 3, 40, digest=None,
                  config=BulkReadConfig(batch_entries_max=8, window_chunks_max=3))
    job.refill()
    assert [(c.first, c.last) for c in job.window] == [(3, 9), (10, 17), (18, 25)]
    job.window.pop(0)
    job.refill()
    assert [(c.first, c.last) for c in job.window] == [(10, 17), (18, 25), (26, 33)]
    rest = job.split(job.window[0], 12)  # a reply verified 10..12
    assert (rest.first, rest.last) == (13, 17)
    _covers(job.window, 10, 33)
    assert len({c.ordinal for c in job.window}) == len(job.window)  # rotations differ


def test_run_lens_name_each_replica_of_the_first_entry():
    md = _md([(0, ("a", "b", "c", "d"))], e=4, w=2)
    job = ReadJob(md, 0, 99, digest=None, config=BulkReadConfig())
    job.refill()
    chunk = job.window[1]
    assert (chunk.first, chunk.last) == (2, 3)  # striped: chunks of Qw entries
    assert job.run_lens(chunk) == {"c": 1, "d": 2}  # c holds 2; d holds 2, 3
