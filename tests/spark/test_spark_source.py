"""The ``bookkeeper`` Spark source in local[2] against a real appliance:
every entry exactly once with its bytes, the default selection, OPEN ledgers
up to their LAC, bounds, partitioning, filter pushdown and the errors."""

from __future__ import annotations

import json
import warnings
from collections import defaultdict

import pytest

from appliance.spark import ARROW_SCHEMA, PUSHDOWN_CONF, pushdown_read_shared, register
from tests.spark.conftest import PASSWORD, pushdown_source

BIG = 20_000


@pytest.fixture(scope="module")
def data(appliance_factory):
    """One appliance with ledgers of every shape the tests need."""
    app = appliance_factory(3)
    ids = {
        "empty": app.write(0),
        "one": app.write(1),
        "big": app.write(BIG),
        "hmac": app.write(300, digest="hmac-sha256"),
        "striped": app.write(2000, ensemble=3, write_quorum=2, ack_quorum=2),
    }
    writer = app.client.create_ledger(password=PASSWORD)  # stays OPEN
    payloads = [b"open-%d" % i for i in range(30)]
    for p in payloads:  # one at a time: entry i carries LAC i - 1
        writer.add(p)
    app.payloads[writer.id] = payloads
    app.open_writers[writer.id] = writer
    ids["open"] = writer.id
    other = app.client.create_ledger(password=b"another password")  # not this scan's
    other.add(b"not for this scan")
    other.close()
    ids["other_password"] = other.id
    app.ids = ids
    return app


@pytest.fixture(scope="module")
def source(spark):
    register(spark)  # the session's default: no filter pushdown
    return spark


def load(spark, app, **options):
    reader = (spark.read.format("bookkeeper").option("config", app.config)
              .option("password", PASSWORD.decode()))
    for key, value in options.items():
        reader = reader.option(key, value if isinstance(value, str) else json.dumps(value))
    return reader.load()


def by_ledger(df) -> dict[int, list[tuple[int, bytes]]]:
    out = defaultdict(list)
    for row in df.collect():
        out[row.ledger_id].append((row.entry_id, bytes(row.payload)))
    return {ledger: sorted(rows) for ledger, rows in out.items()}


def test_schema_is_exact_and_matches_the_arrow_batches(source, data):
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import BinaryType, LongType, StructField, StructType

    expected = StructType([StructField("ledger_id", LongType(), False),
                           StructField("entry_id", LongType(), False),
                           StructField("payload", BinaryType(), False)])
    assert load(source, data, ledgers=str(data.ids["one"])).schema == expected
    assert to_arrow_schema(expected, timezone="UTC").equals(ARROW_SCHEMA)


def test_named_ledgers_every_entry_exactly_once_with_its_bytes(source, data):
    names = ("empty", "one", "big", "hmac", "striped")
    ledgers = ",".join(str(data.ids[n]) for n in names)
    df = load(source, data, ledgers=ledgers, maxEntriesPerPartition="7000")
    assert df.rdd.getNumPartitions() == 4  # 22301 entries, at most 7000 per task
    got = by_ledger(df)
    for name in names:
        ledger_id = data.ids[name]
        expected = list(enumerate(data.payloads[ledger_id]))
        assert got.get(ledger_id, []) == expected, name
    assert sum(len(v) for v in got.values()) == 1 + BIG + 300 + 2000


def test_default_reads_every_closed_ledger_and_nothing_else(source, data):
    counts = {r.ledger_id: r["count"] for r in load(source, data).groupBy("ledger_id").count()
              .collect()}
    expected = {i: len(data.payloads[i]) for i in data.closed if data.payloads[i]}
    assert counts == expected
    assert data.ids["open"] not in counts
    assert data.ids["other_password"] not in counts  # skipped, not a failed query


def test_the_default_read_names_the_ledgers_it_skips_in_one_warning(data, caplog):
    from appliance.spark.filters import Bounds
    from appliance.spark.options import parse_options
    from appliance.spark.planner import ledger_ranges, skipped_warning

    options = parse_options({"config": data.config, "password": PASSWORD.decode()})
    with caplog.at_level("WARNING", logger="appliance.spark"):
        ranges = ledger_ranges(data.client, options, Bounds())
    assert {r.metadata.ledger_id for r in ranges} == {i for i in data.closed
                                                      if data.payloads[i]}
    other = data.ids["other_password"]
    assert [r.getMessage() for r in caplog.records] == [
        f"bookkeeper source: skipped 1 CLOSED ledger(s) the given password does not open: "
        f"{other} (name them in option ledgers, with their password, to read them)"]
    many = skipped_warning(list(range(25)))
    assert "skipped 25 CLOSED" in many and ": 0, 1, 2," in many
    assert "18, 19 and 5 more (name them" in many and "20" not in many


def test_an_open_ledger_named_explicitly_is_read_up_to_its_lac(source, data):
    ledger_id = data.ids["open"]
    with data.client.open_ledger(ledger_id, password=PASSWORD, recovery=False) as rh:
        lac = rh.last_add_confirmed
    assert lac >= 20
    got = by_ledger(load(source, data, ledgers=str(ledger_id)))
    assert got[ledger_id] == list(enumerate(data.payloads[ledger_id][:lac + 1]))
    assert data.client.ledger_metadata(ledger_id).state == "OPEN"  # nothing was fenced


def test_entry_bounds_and_partition_options(source, data):
    big, one, striped = data.ids["big"], data.ids["one"], data.ids["striped"]
    df = load(source, data, ledgers=f"{big},{one}", startingEntry="100", endingEntry="199")
    assert by_ledger(df) == {big: list(enumerate(data.payloads[big]))[100:200]}
    df = load(source, data, ledgers=f"{big},{striped}", startingEntry={str(big): 5},
              endingEntry={str(big): 9, str(striped): 3})
    assert by_ledger(df) == {big: list(enumerate(data.payloads[big]))[5:10],
                             striped: list(enumerate(data.payloads[striped]))[:4]}
    assert load(source, data, ledgers=str(big), maxEntriesPerPartition="1000") \
        .rdd.getNumPartitions() == 20
    parts = load(source, data, ledgers=str(big), minPartitions="4")
    assert parts.rdd.getNumPartitions() == 4 and parts.count() == BIG
    nothing = load(source, data, ledgers=str(data.ids["empty"]))
    assert nothing.count() == 0


def test_filter_pushdown_prunes_and_stays_exact(spark, data):
    big, hmac = data.ids["big"], data.ids["hmac"]
    with pushdown_source(spark):
        def df():  # a DataFrame per query: Spark 4.3 keeps a pushdown's read on it
            return load(spark, data, maxEntriesPerPartition="1000")

        pruned = df().where(f"ledger_id = {big} and entry_id >= 1500 and entry_id < 1800")
        assert pruned.rdd.getNumPartitions() == 1  # the whole ledger would be 20 tasks
        assert by_ledger(pruned) == {big: list(enumerate(data.payloads[big]))[1500:1800]}
        listed = df().where(f"ledger_id in ({big}, {hmac}) and entry_id in (3, 250, 4000)")
        assert by_ledger(listed) == {
            big: [(e, data.payloads[big][e]) for e in (3, 250, 4000)],
            hmac: [(e, data.payloads[hmac][e]) for e in (3, 250)]}
        other = df().where(f"ledger_id = {hmac} and payload = X'{data.payloads[hmac][7].hex()}'")
        assert by_ledger(other) == {hmac: [(7, data.payloads[hmac][7])]}


def test_register_with_pushdown_on_is_exact_for_every_query_of_a_dataframe(spark, data):
    big, hmac = data.ids["big"], data.ids["hmac"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # pushdown declined on Spark 4.3
        register(spark, filter_pushdown=True)
    try:
        df = load(spark, data, ledgers=f"{big},{hmac}", maxEntriesPerPartition="1000")
        pruned = df.where(f"ledger_id = {big} and entry_id >= 1500 and entry_id < 1800")
        assert by_ledger(pruned) == {big: list(enumerate(data.payloads[big]))[1500:1800]}
        assert df.count() == BIG + 300
        if not pushdown_read_shared(spark):
            assert pruned.rdd.getNumPartitions() == 1
    finally:
        spark.conf.set(PUSHDOWN_CONF, "false")
        register(spark)


def _error_of(action) -> str:
    with pytest.raises(Exception) as info:  # noqa: B017 - Spark wraps the Python error
        action()
    return str(info.value)


def test_errors_name_the_ledger_or_the_endpoint(source, data, short_tmp):
    unknown = _error_of(lambda: load(source, data, ledgers="987654").collect())
    assert "ledger 987654 does not exist" in unknown
    wrong = _error_of(lambda: source.read.format("bookkeeper").option("config", data.config)
                      .option("ledgers", str(data.ids["big"])).option("password", "nope")
                      .load().collect())
    assert f"wrong password for ledger {data.ids['big']}" in wrong
    assert "Traceback" not in wrong  # one line of ours, not the planner's stack
    other = data.ids["other_password"]
    none_given = _error_of(lambda: source.read.format("bookkeeper").option("config", data.config)
                           .option("ledgers", str(other)).load().collect())
    assert f"ledger {other} has a password and none was given: set option password" \
        in none_given and "Traceback" not in none_given
    nowhere = f"sqlite:///{short_tmp}/no/such/dir/meta.db"
    unreachable = _error_of(lambda: source.read.format("bookkeeper").option("metadata", nowhere)
                            .load().collect())
    assert "cannot reach the appliance" in unreachable and nowhere in unreachable
    bad = _error_of(lambda: load(source, data, maxEntriesPerPartition="lots").collect())
    assert "maxEntriesPerPartition" in bad


def test_reads_fail_over_a_dead_bookie_and_fail_naming_them_when_all_are_down(
        source, appliance_factory):
    app = appliance_factory(3)
    ledger_id = app.write(3000)
    app.cluster.kill("bookie-2")
    df = load(source, app, ledgers=str(ledger_id), readTimeoutMs="300", minPartitions="3")
    assert by_ledger(df) == {ledger_id: list(enumerate(app.payloads[ledger_id]))}
    app.cluster.kill_all()
    message = _error_of(lambda: load(source, app, ledgers=str(ledger_id),
                                     readTimeoutMs="300").collect())
    assert f"ledger {ledger_id} entry 0: no replica served it" in message
    for bookie in app.cluster.config.bookies:
        assert bookie.endpoint in message


def test_a_log_is_read_record_by_record_across_segments_in_progress_one_included(source, data):
    import dataclasses
    import time

    from appliance.spark.logs import LOG_ARROW_SCHEMA

    app = data
    app.client.log_config = dataclasses.replace(app.client.log_config, segment_records_max=40)
    writer = app.client.log("spark-events", PASSWORD).writer()
    written = []
    for i in range(130):
        written.append((writer.write_async(b"event %d" % i), i))
        if i % 10 == 9:
            writer.flush()
    written = [(str(f.result(timeout=60)), i + 1, b"event %d" % i) for f, i in written]
    md = app.client.log("spark-events", PASSWORD).metadata()
    assert md.in_progress is not None and len(md.live_segments) >= 3  # still writing
    # the writer's control entry makes its last records visible to readers
    deadline = time.monotonic() + 30
    with app.client.log("spark-events", PASSWORD).reader() as r:
        seen = []
        while len(seen) < 130 and time.monotonic() < deadline:
            seen += r.read(timeout_s=1)
    assert len(seen) == 130

    df = load(source, app, log="spark-events", minPartitions="3")
    assert df.schema.simpleString() == "struct<dlsn:string,txid:bigint,payload:binary>"
    rows = sorted(((r.dlsn, r.txid, bytes(r.payload)) for r in df.collect()),
                  key=lambda row: row[1])
    assert rows == written
    assert LOG_ARROW_SCHEMA.names == ["dlsn", "txid", "payload"]
    with pytest.raises(Exception, match="does not exist"):
        load(source, app, log="no-such-log").collect()
    with pytest.raises(Exception, match="do not combine"):
        load(source, app, log="spark-events", ledgers="1").collect()
    writer.close()


def test_a_hot_log_of_packed_records_splits_over_the_cpus_each_record_once(source, data):
    """30,000 records written in batches of 1,000 (entries of many records)
    over sealed segments and the one in progress: with no minPartitions the
    scan is cut by records over the driver's CPUs (a row an entry, its few
    dozen entries would be one partition), and every record comes back once."""
    import dataclasses
    import os
    import time

    app, n = data, 30_000
    saved = app.client.log_config
    app.client.log_config = dataclasses.replace(saved, segment_records_max=12_000)
    try:
        writer = app.client.log("spark-packed", PASSWORD).writer()
        futures = []
        for start in range(0, n, 1000):
            futures += writer.write_many_async([b"r%d" % i for i in range(start, start + 1000)])
        written = [(str(f.result(timeout=60)), i + 1, b"r%d" % i) for i, f in enumerate(futures)]
    finally:
        app.client.log_config = saved
    assert app.client.log("spark-packed", PASSWORD).metadata().in_progress is not None
    deadline, seen = time.monotonic() + 30, 0  # the writer's control entry shows its last
    with app.client.log("spark-packed", PASSWORD).reader() as r:
        while seen < n and time.monotonic() < deadline:
            seen += len(r.read(timeout_s=1))
    assert seen == n

    df = load(source, app, log="spark-packed")
    assert df.rdd.getNumPartitions() == min(len(os.sched_getaffinity(0)), 3)  # >= 10,000 each
    rows = sorted(((r.dlsn, r.txid, bytes(r.payload)) for r in df.collect()),
                  key=lambda row: row[1])
    assert rows == written
    writer.close()
