"""The pure planning parts of the Spark source: options, filter pushdown and
the split of ledger ranges into partitions (no Spark session, no appliance)."""

from __future__ import annotations

import itertools
import random
from fractions import Fraction

import pytest
from pyspark.sql.datasource import (
    EqualNullSafe,
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    LessThan,
    LessThanOrEqual,
    Not,
)

from appliance.protocol.limits import ID_MAX
from appliance.protocol.limits import SPARK_ENTRIES_PER_PARTITION_MAX as MAX_ENTRIES_PER_PARTITION
from appliance.protocol.limits import SPARK_RANGES_PER_PARTITION_MAX as RANGES_PER_PARTITION_MAX
from appliance.protocol.metadata import LedgerMetadata
from appliance.spark.filters import Bounds, push_filters
from appliance.spark.options import parse_options
from appliance.spark.planner import (
    DEFAULT_SPLIT_ROWS_MIN,
    LedgerRange,
    entry_work,
    ledger_work,
    split_ranges,
)


# -- options ---------------------------------------------------------------------------
def test_options_defaults_and_case_insensitive_names():
    o = parse_options({"config": "x.toml"})
    assert (o.target, o.is_config, o.ledgers, o.password) == ("x.toml", True, None, b"")
    assert (o.start_for(3), o.end_for(3)) == (0, ID_MAX)
    assert o.max_entries_per_partition == MAX_ENTRIES_PER_PARTITION
    assert o.min_partitions is None  # the planner's default
    o = parse_options({"METADATA": "sqlite:///m.db", "Ledgers": " 5, 3,5 ", "password": "pé",
                       "startingEntry": "earliest", "ENDINGENTRY": "latest",
                       "maxentriesperpartition": "10", "minPartitions": "3",
                       "readTimeoutMs": "250"})
    assert (o.is_config, o.ledgers, o.password) == (False, (3, 5), "pé".encode())
    assert (o.max_entries_per_partition, o.min_partitions, o.read_timeout_ms) == (10, 3, 250)
    o = parse_options({"config": "c", "startingEntry": '{"3": 10}', "endingEntry": "99"})
    assert (o.start_for(3), o.start_for(4), o.end_for(3)) == (10, 0, 99)
    o = parse_options({"config": "c", "log": "l", "segments": "4, 2,"})
    assert (o.log, o.segments) == ("l", frozenset({2, 4}))


@pytest.mark.parametrize("options, named", [
    ({}, "config"),
    ({"config": "a", "metadata": "b"}, "config"),
    ({"config": "a", "ledgers": "1,x"}, "ledgers"),
    ({"config": "a", "ledgers": ","}, "ledgers"),
    ({"config": "a", "startingEntry": "-1"}, "startingEntry"),
    ({"config": "a", "endingEntry": "{oops"}, "endingEntry"),
    ({"config": "a", "endingEntry": "[1]"}, "endingEntry"),
    ({"config": "a", "maxEntriesPerPartition": "0"}, "maxEntriesPerPartition"),
    ({"config": "a", "minPartitions": "10000000"}, "minPartitions"),
    ({"config": "a", "readTimeoutMs": "soon"}, "readTimeoutMs"),
    ({"config": "a", "ledger": "3"}, "unknown option"),
    ({"config": "a", "segments": "3"}, "set option log"),
    ({"config": "a", "log": "l", "segments": "3,x"}, "segments"),
    ({"config": "a", "log": "l", "segments": ","}, "segments"),
])
def test_bad_options_are_refused_naming_the_option(options, named):
    with pytest.raises(ValueError, match=named):
        parse_options(options)


# -- filter pushdown ---------------------------------------------------------------------
def test_comparisons_on_the_id_columns_become_exact_bounds():
    filters = [GreaterThanOrEqual(("entry_id",), 10), LessThan(("entry_id",), 20),
               GreaterThan(("ledger_id",), 2), LessThanOrEqual(("ledger_id",), 9),
               EqualNullSafe(("ledger_id",), 5), In(("ledger_id",), (5, 6, 7))]
    bounds, rest = push_filters(filters)
    assert rest == []
    assert (bounds.entry_min, bounds.entry_max) == (10, 19)
    assert (bounds.ledger_min, bounds.ledger_max, bounds.ledger_ids) == (5, 5, {5, 6, 7})
    assert [i for i in range(12) if bounds.admits_ledger(i)] == [5]


def test_what_cannot_be_bounded_exactly_goes_back_to_spark_by_reference():
    in_entries = In(("entry_id",), (7, 3, 40))
    others = [EqualTo(("payload",), b"x"), Not(EqualTo(("entry_id",), 3)),
              IsNotNull(("entry_id",)), EqualTo(("entry_id",), 2.5),
              EqualTo(("ledger_id",), True), In(("ledger_id",), (1, "2")),
              EqualTo(("a", "entry_id"), 1)]
    bounds, rest = push_filters([in_entries, *others])
    assert all(any(r is f for r in rest) for f in [in_entries, *others])
    assert len(rest) == len(others) + 1
    assert (bounds.entry_min, bounds.entry_max) == (3, 40)  # narrowed, still re-checked
    assert bounds.ledger_ids is None


def test_contradictions_select_nothing():
    bounds, _ = push_filters([EqualTo(("ledger_id",), 3), EqualTo(("ledger_id",), 4)])
    assert not any(bounds.admits_ledger(i) for i in range(10))
    bounds, _ = push_filters([LessThan(("entry_id",), 0)])
    assert bounds.entry_max < bounds.entry_min
    assert Bounds().admits_ledger(ID_MAX)


# -- splitting ---------------------------------------------------------------------------
def _md(ledger_id: int) -> LedgerMetadata:
    return LedgerMetadata(ledger_id, 3, 3, 2, ((0, ("a", "b", "c")),), state="CLOSED")


def _entries(parts) -> list[tuple[int, int]]:
    return [(r.metadata.ledger_id, e) for p in parts for r in p
            for e in range(r.first_entry_id, r.last_entry_id + 1)]


@pytest.mark.parametrize("sizes, max_entries, min_parts, multiple_of", [
    ([1], 10, 1, 1), ([25, 3, 1, 40], 10, 1, 1), ([100_000], 30_000, 1, 1), ([7, 7, 7], 5, 4, 1),
    ([1000], 1000, 7, 1), ([5, 1, 1, 1], 1_000_000, 2, 1), ([3] * 3000, 1_000_000, 1, 1),
    ([600_000], 250_000, 2, 2), ([22_301], 7000, 2, 2),
])
def test_split_covers_every_entry_once_in_balanced_partitions(sizes, max_entries, min_parts,
                                                              multiple_of):
    ranges = [LedgerRange(_md(i), 2, 1 + n) for i, n in enumerate(sizes)]  # entries 2..n+1
    parts = split_ranges(ranges, max_entries, min_parts, multiple_of=multiple_of)
    expected = [(i, e) for i, n in enumerate(sizes) for e in range(2, 2 + n)]
    assert _entries(parts) == expected  # each once, in ledger/entry order
    counts = [sum(r.count for r in p) for p in parts]
    assert max(counts) <= max_entries
    assert all(len(p) <= RANGES_PER_PARTITION_MAX for p in parts)
    if len(sizes) < RANGES_PER_PARTITION_MAX:
        assert len(parts) >= min(min_parts, sum(sizes))
        assert all(c == counts[0] for c in counts[:-1]) and counts[-1] <= counts[0]  # balanced
        assert len(parts) % multiple_of == 0 or sum(sizes) < len(parts) * multiple_of


def test_split_in_whole_waves_over_the_cores():
    parts = split_ranges([LedgerRange(_md(0), 0, 599_999)], 250_000, 2, 10_000, multiple_of=2)
    assert [sum(r.count for r in p) for p in parts] == [150_000] * 4  # not 250k, 250k, 100k


def test_split_floor_keeps_small_scans_in_few_partitions():
    ranges = [LedgerRange(_md(0), 0, 14_999)]
    assert len(split_ranges(ranges, 1_000_000, 8, work_min=10_000)) == 2
    assert len(split_ranges(ranges, 1_000_000, 8)) == 8
    assert len(split_ranges(ranges, 1_000, 8, work_min=10_000)) == 15  # max still rules


def _work(parts, work) -> list:
    return [sum(r.count * work.get(r.metadata.ledger_id, 1) for r in p) for p in parts]


def test_a_log_of_packed_records_spreads_over_the_cpus():
    """1,000,000 records of 100 B in 1,000 entries over 5 segments: a row an
    entry keeps it in one piece; weighed by its records it fills 4 CPUs,
    in pieces of equal records (each entry still once, in order)."""
    ranges = [LedgerRange(_md(i), 0, 199) for i in range(5)]
    work = {i: entry_work(200, 200_000, 200 * 1000 * 112) for i in range(5)}
    assert work[0] == 1000  # records, not the 109 KiB of bytes, set the weight
    assert len(split_ranges(ranges, 250_000, 4, DEFAULT_SPLIT_ROWS_MIN, multiple_of=4)) == 1
    parts = split_ranges(ranges, 250_000, 4, DEFAULT_SPLIT_ROWS_MIN, multiple_of=4, work=work)
    assert _entries(parts) == [(i, e) for i in range(5) for e in range(200)]
    assert _work(parts, work) == [250_000] * 4


def test_a_small_log_scan_stays_one_partition():
    work = {0: entry_work(9, 9_000)}  # 9,000 records: below a piece's floor
    parts = split_ranges([LedgerRange(_md(0), 0, 8)], 250_000, 8, DEFAULT_SPLIT_ROWS_MIN,
                         multiple_of=8, work=work)
    assert len(parts) == 1
    work = {0: entry_work(30, 30_000)}  # 30,000: three pieces of 10,000, not 8
    parts = split_ranges([LedgerRange(_md(0), 0, 29)], 250_000, 8, DEFAULT_SPLIT_ROWS_MIN,
                         multiple_of=8, work=work)
    assert _work(parts, work) == [10_000] * 3


def test_segments_of_different_density_split_by_records_not_entries():
    """A segment of synchronous writes (a record an entry) then one of
    batches: equal entries would put 101 of 121 thousand records in one
    piece; equal records put about half in each."""
    ranges = [LedgerRange(_md(0), 0, 19_999), LedgerRange(_md(1), 0, 100)]
    work = {0: entry_work(20_000, 20_000), 1: entry_work(101, 101_000)}
    parts = split_ranges(ranges, 250_000, 2, DEFAULT_SPLIT_ROWS_MIN, multiple_of=2, work=work)
    assert _entries(parts) == [(0, e) for e in range(20_000)] + [(1, e) for e in range(101)]
    assert _work(parts, work) == [61_000, 60_000]


def test_max_entries_and_min_partitions_keep_their_meaning_with_weights():
    work = {0: Fraction(1000)}
    ranges = [LedgerRange(_md(0), 0, 999)]
    parts = split_ranges(ranges, 300, 1, DEFAULT_SPLIT_ROWS_MIN, work=work)
    assert [sum(r.count for r in p) for p in parts] == [250] * 4  # <= 300 entries each
    parts = split_ranges(ranges, 250_000, 5, work=work)  # explicit: no floor
    assert [sum(r.count for r in p) for p in parts] == [200] * 5
    parts = split_ranges([LedgerRange(_md(0), 0, 2)], 250_000, 5, work=work)
    assert len(parts) == 3  # never more pieces than entries


@pytest.mark.parametrize("seed", range(30))
def test_weighted_split_covers_every_entry_once(seed):
    rng = random.Random(seed)
    sizes = [rng.randint(1, 5_000) for _ in range(rng.randint(1, 8))]
    ranges = [LedgerRange(_md(i), 3, 2 + n) for i, n in enumerate(sizes)]
    work = {i: entry_work(n, rng.choice([None, n, n * rng.randint(2, 2_000)]),
                          rng.choice([0, n * 100, n * 70_000])) for i, n in enumerate(sizes)}
    max_entries, cpus = rng.choice([(250_000, 2), (700, 4), (50, 1)])
    parts = split_ranges(ranges, max_entries, cpus, DEFAULT_SPLIT_ROWS_MIN,
                         multiple_of=cpus, work=work)
    assert _entries(parts) == [(i, e) for i, n in enumerate(sizes) for e in range(3, 3 + n)]
    assert max(sum(r.count for r in p) for p in parts) <= max_entries
    carried = sum(n * work[i] for i, n in enumerate(sizes))
    if sum(sizes) <= max_entries:  # no entry cap: count pieces at most, the floor kept
        assert len(parts) <= max(1, cpus)
        assert all(w >= min(DEFAULT_SPLIT_ROWS_MIN, carried / cpus)
                   for w in _work(parts, work)[:-1])


def test_an_entry_weighs_its_records_or_its_bytes():
    assert entry_work(10, 10_000) == 1000
    assert entry_work(10, None) == entry_work(10, 5) == entry_work(0, 7) == 1  # never below
    assert entry_work(4, 4, 4 * 64 * 1024) == 64  # 64 KiB records: their bytes
    assert ledger_work(_md(0)) == 1
    closed = LedgerMetadata(0, 3, 3, 2, ((0, ("a", "b", "c")),), state="CLOSED",
                            last_entry_id=99, length=100 * 1000)
    assert ledger_work(closed) == 1  # entries up to a KiB: a row each, as before
    big = LedgerMetadata(0, 3, 3, 2, ((0, ("a", "b", "c")),), state="CLOSED",
                         last_entry_id=99, length=100 * 1024 * 1024)
    assert ledger_work(big) == 1024
    assert ledger_work(LedgerMetadata(0, 3, 3, 2, ((0, ("a", "b", "c")),))) == 1  # OPEN


def test_split_of_nothing_is_no_partition():
    assert split_ranges([], 10) == []


def test_split_is_deterministic():
    ranges = [LedgerRange(_md(i), 0, n) for i, n in zip(range(5), itertools.count(97, 13))]
    first = [[(r.metadata.ledger_id, r.first_entry_id, r.last_entry_id) for r in p]
             for p in split_ranges(ranges, 50, 3)]
    again = [[(r.metadata.ledger_id, r.first_entry_id, r.last_entry_id) for r in p]
             for p in split_ranges(ranges, 50, 3)]
    assert first == again


# -- read knobs ----------------------------------------------------------------------------
def test_executors_read_with_the_configs_read_batch(tmp_path):
    """With a config, tasks ask for the client's read batch (entries and
    bytes) and take entries up to the config's wire limit; with a metadata
    URI only, the defaults."""
    from appliance.bench.launcher import write_config
    from appliance.client.bulk_read import BulkReadConfig
    from appliance.config import load_config
    from appliance.spark.planner import bulk_read_config

    path = write_config(tmp_path / "a.toml", 3, server={"batch_entries_max": 8192},
                        client={"read_batch_entries_max": 4096,
                                "read_batch_bytes_max": 1 << 20},
                        storage={"entry_bytes_max": 1 << 16})
    config = load_config(path)
    got = bulk_read_config(parse_options({"config": str(path), "readTimeoutMs": "700"}), config)
    assert (got.batch_entries_max, got.batch_bytes_max, got.read_timeout_ms) == \
        (4096, 1 << 20, 700)
    assert got.entry_bytes_max == config.wire_limits().entry_bytes_max > 1 << 16
    plain = bulk_read_config(parse_options({"metadata": "sqlite:///m.db"}), None)
    assert plain == BulkReadConfig()
