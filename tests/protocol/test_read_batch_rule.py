"""The batch-read admission rule (``appliance.protocol.read_batch``), shared
by the real bookie, the in-memory bookie and the simulated bookie; and the
real bookie's vectorised cut (``storage.read_path.fit_bytes``) agrees with it."""

import random

import numpy as np

from appliance.errors import NoSuchEntryError
from appliance.protocol.errors import OK
from appliance.protocol.read_batch import BatchWindow, batch_rows, batch_window
from storage.read_path import fit_bytes

MISSING = NoSuchEntryError.code


def reader(entries: dict[int, bytes]):
    def read_one(entry_id):
        data = entries.get(entry_id)
        return (OK, data) if data is not None else (MISSING, None)
    return read_one


def test_the_window_is_clamped_by_the_request_and_the_bookie():
    assert batch_window(10, 100, 5, 1000, 64, 500) == BatchWindow(10, 14, 500)
    assert batch_window(10, 12, 50, 1000, 64, 5000) == BatchWindow(10, 12, 1000)
    assert batch_window(10, 100, 50, 1000, 8, 5000) == BatchWindow(10, 17, 1000)
    assert batch_window(10, 100, 0, 1000, 8, 5000).last_entry_id == 10  # at least one


def test_rows_run_in_order_up_to_the_last_entry_allowed():
    entries = {e: b"x" * 10 for e in range(20)}
    rows = batch_rows(batch_window(3, 19, 4, 1 << 20, 64, 1 << 20), reader(entries))
    assert [(e, code) for e, code, _ in rows] == [(3, OK), (4, OK), (5, OK), (6, OK)]


def test_the_byte_limit_cuts_before_the_entry_that_would_pass_it():
    entries = {e: b"y" * 10 for e in range(20)}
    rows = batch_rows(batch_window(0, 19, 20, 35, 64, 1 << 20), reader(entries))
    assert [e for e, _, _ in rows] == [0, 1, 2]  # 30 bytes; a fourth would make 40
    exact = batch_rows(batch_window(0, 19, 20, 30, 64, 1 << 20), reader(entries))
    assert [e for e, _, _ in exact] == [0, 1, 2]  # exactly at the limit is within it


def test_the_first_entry_is_answered_even_when_larger_than_the_limit():
    entries = {0: b"z" * 100, 1: b"z"}
    rows = batch_rows(batch_window(0, 1, 2, 10, 64, 1 << 20), reader(entries))
    assert [(e, code, len(d)) for e, code, d in rows] == [(0, OK, 100)]


def test_the_first_refused_entry_ends_the_reply_with_its_own_row():
    entries = {0: b"a", 1: b"b", 3: b"d"}
    rows = batch_rows(batch_window(0, 3, 4, 1 << 20, 64, 1 << 20), reader(entries))
    assert [(e, code) for e, code, _ in rows] == [(0, OK), (1, OK), (2, MISSING)]
    assert rows[-1][2] is None
    first_missing = batch_rows(batch_window(2, 3, 2, 1 << 20, 64, 1 << 20), reader(entries))
    assert first_missing == [(2, MISSING, None)]


def test_a_refused_entry_past_the_byte_cut_is_never_reached():
    entries = {0: b"a" * 8, 1: b"b" * 8}  # 2 is missing
    rows = batch_rows(batch_window(0, 2, 3, 10, 64, 1 << 20), reader(entries))
    assert [e for e, _, _ in rows] == [0]


def test_empty_entries_at_the_limit_still_fit():
    entries = {0: b"q" * 10, 1: b"", 2: b"", 3: b"r"}
    rows = batch_rows(batch_window(0, 3, 4, 10, 64, 1 << 20), reader(entries))
    assert [e for e, _, _ in rows] == [0, 1, 2]


def test_a_continuation_counts_the_bytes_already_in_the_reply():
    entries = {e: b"s" * 10 for e in range(10)}
    window = batch_window(0, 9, 10, 45, 64, 1 << 20)
    rows = batch_rows(window, reader(entries), start=2, size=20, last=8)
    assert [e for e, _, _ in rows] == [2, 3]  # 20 + 10 + 10 = 40; one more is 50


def test_the_bookies_vectorised_cut_agrees_with_the_rule():
    rng = random.Random(7)
    for _ in range(300):
        lengths = [rng.choice((0, 1, 5, 40, 300)) for _ in range(rng.randint(1, 30))]
        room = rng.randint(0, 600)
        entries = {1 + i: b"p" * n for i, n in enumerate(lengths)}
        window = BatchWindow(0, len(lengths), room)  # entry 0 is the reply's first, not here
        by_rule = batch_rows(window, reader(entries), start=1)
        table = np.zeros((len(lengths), 3), np.int64)
        table[:, 2] = lengths
        assert fit_bytes(table, room) == len(by_rule), (lengths, room)
