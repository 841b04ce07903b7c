"""Ledgers whose entries all have one length (a writer's batch, the bench's
shape): the path where a reply is checked with one CRC32C call (records of
100 B: header and payload copied side by side; of 1,100 B: the joined
payloads) and a big chunk is a record batch of its own.  The rows Spark
returns are exactly the entries written, over several partitions and with
pushed filters, at the default read batch and at a larger one."""

from __future__ import annotations

import pytest

from appliance.spark import register
from tests.spark.conftest import PASSWORD, pushdown_source

SHAPES = {"small": (100, 5000), "large": (1100, 3000)}  # payload bytes, entries


@pytest.fixture(scope="module", params=[None, 4096], ids=["default-batch", "batch-4096"])
def uniform(request, appliance_factory):
    batch = request.param
    sections = {} if batch is None else {"server": {"batch_entries_max": batch},
                                         "client": {"read_batch_entries_max": batch}}
    app = appliance_factory(3, **sections)
    app.ids = {name: app.write(n, size=size, uniform=True)
               for name, (size, n) in SHAPES.items()}
    assert {len(p) for p in app.payloads[app.ids["large"]]} == {1100}
    return app


def load(spark, app, **options):
    reader = (spark.read.format("bookkeeper").option("config", app.config)
              .option("password", PASSWORD.decode())
              .option("ledgers", ",".join(str(i) for i in app.ids.values())))
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def rows(df) -> list[tuple[int, int, bytes]]:
    return sorted((r.ledger_id, r.entry_id, bytes(r.payload)) for r in df.collect())


def expected(app, keep=lambda ledger_id, entry_id: True) -> list[tuple[int, int, bytes]]:
    return sorted((ledger_id, e, p) for ledger_id in app.ids.values()
                  for e, p in enumerate(app.payloads[ledger_id]) if keep(ledger_id, e))


def test_every_entry_once_with_its_bytes_over_several_partitions(spark, uniform):
    register(spark)
    df = load(spark, uniform, minPartitions="3")
    assert df.rdd.getNumPartitions() == 3
    assert rows(df) == expected(uniform)
    one = load(spark, uniform, minPartitions="1")
    assert one.rdd.getNumPartitions() == 1 and rows(one) == expected(uniform)


def test_pushed_filters_give_exactly_the_rows_asked(spark, uniform):
    small, large = uniform.ids["small"], uniform.ids["large"]

    def df():  # a DataFrame per query: Spark 4.3's pushdown state outlives a query
        return load(spark, uniform, maxEntriesPerPartition="1000")  # (docs/SPARK.md)

    with pushdown_source(spark):
        ranged = df().where(f"ledger_id = {large} and entry_id >= 1000 and entry_id < 2500")
        assert ranged.rdd.getNumPartitions() == 2  # pruned: 1,500 entries
        assert rows(ranged) == expected(uniform, lambda i, e: i == large and 1000 <= e < 2500)
        across = df().where("entry_id between 1020 and 1030 or entry_id in (0, 4095, 4999)")
        assert rows(across) == expected(uniform, lambda i, e: 1020 <= e <= 1030
                                        or e in (0, 4095, 4999))
        listed = df().where(f"ledger_id = {small} and entry_id in (0, 1023, 1024, 4999)")
        assert rows(listed) == expected(uniform, lambda i, e: i == small
                                        and e in (0, 1023, 1024, 4999))
        assert rows(df().where(f"ledger_id = {small}")) == \
            expected(uniform, lambda i, e: i == small)
