"""One DataFrame, several queries, with ``register(spark, filter_pushdown=True)``:
every query gets exactly its rows, whatever the queries before it pushed.

Spark 4.3 keeps the read planned by a filter pushdown on the DataFrame's data
source (``PythonDataSourceV2.readInfo``), and a later query of that DataFrame
that pushes no filter reuses it (docs/SPARK.md, "Filter pushdown"); there
``register`` registers the source without pushdown, and says so."""

from __future__ import annotations

import warnings

import pytest

from appliance.spark import (
    PUSHDOWN_CONF,
    BookKeeperPushdownDataSource,
    pushdown_read_shared,
    register,
)
from tests.spark.conftest import PASSWORD

SIZES = (3000, 2000)  # entries of the two ledgers
TOTAL = sum(SIZES)


@pytest.fixture(scope="module")
def two(appliance_factory):
    app = appliance_factory(3)
    app.ids = {"a": app.write(SIZES[0], size=20), "b": app.write(SIZES[1], size=20)}
    return app


@pytest.fixture
def pushdown(spark):
    if pushdown_read_shared(spark):
        with pytest.warns(RuntimeWarning, match="filter pushdown is off"):
            register(spark, filter_pushdown=True)
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            register(spark, filter_pushdown=True)
    try:
        yield spark
    finally:
        spark.conf.set(PUSHDOWN_CONF, "false")
        register(spark)


def load(spark, app):
    return (spark.read.format("bookkeeper").option("config", app.config)
            .option("password", PASSWORD.decode())
            .option("ledgers", ",".join(str(i) for i in app.ids.values()))
            .option("maxEntriesPerPartition", "500").load())


def rows(df) -> list[tuple[int, int, bytes]]:
    return sorted((r.ledger_id, r.entry_id, bytes(r.payload)) for r in df.collect())


def expected(app, keep=lambda ledger_id, entry_id: True) -> list[tuple[int, int, bytes]]:
    return sorted((ledger_id, e, p) for ledger_id in app.ids.values()
                  for e, p in enumerate(app.payloads[ledger_id]) if keep(ledger_id, e))


def test_filtered_then_unfiltered_queries_of_one_dataframe(pushdown, two):
    a = two.ids["a"]
    df = load(pushdown, two)
    assert df.where(f"ledger_id = {a} and entry_id < 700").count() == 700
    assert df.count() == TOTAL
    assert df.where("true").count() == TOTAL
    assert df.where("entry_id = 5 or entry_id = 2999").count() == 3  # no filter pushed
    assert rows(df) == expected(two)


def test_unfiltered_then_filtered_queries_of_one_dataframe(pushdown, two):
    a, b = two.ids["a"], two.ids["b"]
    df = load(pushdown, two)
    assert df.count() == TOTAL
    narrow = df.where(f"ledger_id = {b} and entry_id >= 1500")
    assert rows(narrow) == expected(two, lambda i, e: i == b and e >= 1500)
    assert df.where(f"ledger_id = {a}").count() == SIZES[0]
    assert df.count() == TOTAL


def test_different_filters_in_a_row_on_one_dataframe(pushdown, two):
    a, b = two.ids["a"], two.ids["b"]
    df = load(pushdown, two)
    first = df.where(f"ledger_id = {a} and entry_id between 10 and 19")
    assert rows(first) == expected(two, lambda i, e: i == a and 10 <= e <= 19)
    second = df.where("entry_id >= 1990")
    assert rows(second) == expected(two, lambda i, e: e >= 1990)
    third = df.where(f"ledger_id in ({a}, {b}) and entry_id in (0, 1999, 2000)")
    assert rows(third) == expected(two, lambda i, e: e in (0, 1999, 2000))
    assert rows(first) == expected(two, lambda i, e: i == a and 10 <= e <= 19)  # again
    assert df.where("entry_id = 5 or entry_id = 2999").count() == 3


def test_the_detector_matches_what_spark_does(spark, two):
    """The pushdown source itself, registered directly: a filtered query, then
    an unfiltered one of the same DataFrame, reads fewer rows exactly when
    ``pushdown_read_shared`` says so (the check ``register`` relies on)."""
    a = two.ids["a"]
    spark.conf.set(PUSHDOWN_CONF, "true")
    spark.dataSource.register(BookKeeperPushdownDataSource)
    try:
        df = load(spark, two)
        pruned = df.where(f"ledger_id = {a} and entry_id < 700")
        assert pruned.rdd.getNumPartitions() == 2  # pushed: 700 of 5,000 entries
        assert pruned.count() == 700
        after = df.count()
        assert after in (700, TOTAL)
        assert (after == 700) == pushdown_read_shared(spark)
    finally:
        spark.conf.set(PUSHDOWN_CONF, "false")
        register(spark)
