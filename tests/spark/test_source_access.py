"""What the ``bookkeeper`` source reads by default and what it refuses before
any task runs, in local[2] against a real appliance (issue 48):

* the default ledger read is every CLOSED ledger the user made: the logs'
  segment ledgers are left out, as ``bkctl ledger list`` leaves them out
  (``includeLogSegments`` reads them too);
* a wrong or missing password, or a password given for a log that has
  none, fails ``load()`` (batch and streaming) in one line naming the log
  or the ledger, not a segment's ledger;
* a streaming query on a log that does not exist yet runs empty triggers,
  then delivers its records once it is written."""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner

from appliance.spark import register
from cli.main import cli as bkctl_cli
from tests.spark.conftest import PASSWORD

QUERY_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def app(appliance_factory, spark):
    register(spark)
    app = appliance_factory(3)
    app.ids = {"mine": app.write(5), "also_mine": app.write(7)}
    for name, password in (("open-log", b""), ("locked-log", PASSWORD)):
        with app.client.log(name, password).writer() as w:
            for i in range(10):
                w.write(b"%s %d" % (name.encode(), i))
    return app


def _segment_ledgers(app) -> set[int]:
    return set(app.client.logs.segment_ledgers())


def _ledger_ids(df) -> set[int]:
    return {r.ledger_id for r in df.select("ledger_id").distinct().collect()}


def _load(spark, app, **options):
    reader = spark.read.format("bookkeeper").option("config", app.config)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def test_the_default_ledger_read_leaves_out_the_logs_segments_as_ledger_list_does(spark, app):
    segments = _segment_ledgers(app)
    assert segments  # both logs hold a segment
    listed = CliRunner().invoke(bkctl_cli, ["ledger", "list", "--json", "--config", app.config])
    assert listed.exit_code == 0, listed.output
    user_ledgers = set(json.loads(listed.output))
    assert user_ledgers == {app.ids["mine"], app.ids["also_mine"]}

    assert _ledger_ids(_load(spark, app, password=PASSWORD.decode())) == user_ledgers
    # the segments only when asked for: those the password opens (locked-log's)
    with_segments = _ledger_ids(_load(spark, app, password=PASSWORD.decode(),
                                      includeLogSegments="true"))
    locked = {ledger for ledger, (name, _) in app.client.logs.segment_ledgers().items()
              if name == "locked-log"}
    assert with_segments == user_ledgers | locked
    open_only = _ledger_ids(_load(spark, app, includeLogSegments="true"))
    assert open_only == segments - locked  # no password: open-log's segment alone
    with pytest.raises(Exception, match="option includeLogSegments must be true or false"):
        _load(spark, app, includeLogSegments="sometimes").collect()


def _refusal_at_load(make) -> str:
    """The error ``load()`` itself raises (no action is run)."""
    with pytest.raises(Exception) as info:  # noqa: B017 - Spark wraps the Python error
        make()
    message = str(info.value)
    assert "Traceback" not in message, message  # one line of ours
    return message


def test_a_wrong_or_missing_password_fails_load_naming_the_log_or_ledger(spark, app):
    def batch(log=None, **options):
        return lambda: _load(spark, app, **({"log": log} if log else {}), **options)

    def stream(log, **options):
        reader = spark.readStream.format("bookkeeper").option("config", app.config) \
            .option("log", log)
        for key, value in options.items():
            reader = reader.option(key, value)
        return reader.load

    no_password = "bookkeeper source: log 'open-log' has no password: remove option password"
    assert no_password in _refusal_at_load(batch("open-log", password="secret"))
    assert no_password in _refusal_at_load(stream("open-log", password="secret"))
    wrong = "bookkeeper source: wrong password for log 'locked-log'"
    assert wrong in _refusal_at_load(batch("locked-log", password="nope"))
    assert wrong in _refusal_at_load(stream("locked-log", password="nope"))
    none_given = ("bookkeeper source: log 'locked-log' has a password and none was given: "
                  "set option password")
    assert none_given in _refusal_at_load(batch("locked-log"))
    assert none_given in _refusal_at_load(stream("locked-log"))
    for message in (no_password, wrong, none_given):
        assert "segment" not in message and "ledger" not in message
    mine = app.ids["mine"]
    assert f"bookkeeper source: wrong password for ledger {mine}" in \
        _refusal_at_load(batch(ledgers=str(mine), password="nope"))
    # the right passwords load, and read every record
    assert _load(spark, app, log="open-log").count() == 10
    assert _load(spark, app, log="locked-log", password=PASSWORD.decode()).count() == 10


def test_a_stream_of_a_log_not_written_yet_waits_for_it(spark, app, tmp_path):
    df = (spark.readStream.format("bookkeeper").option("config", app.config)
          .option("log", "written-later").load())
    query = (df.writeStream.format("memory").queryName("written_later")
             .option("checkpointLocation", str(tmp_path / "cp"))
             .trigger(processingTime="100 milliseconds").start())
    try:
        deadline = time.monotonic() + QUERY_TIMEOUT_S
        while len(query.recentProgress) < 3:  # a few triggers on the missing log
            assert query.exception() is None and time.monotonic() < deadline
            query.awaitTermination(0.1)
        assert query.isActive and query.exception() is None
        assert spark.table("written_later").count() == 0
        with app.client.log("written-later").writer() as w:
            for i in range(5):
                w.write(b"late %d" % i)
        while spark.table("written_later").count() < 5:
            assert query.exception() is None and time.monotonic() < deadline, \
                query.exception()
            query.awaitTermination(0.1)
        got = sorted((r.txid, bytes(r.payload)) for r in spark.table("written_later").collect())
        assert got == [(i + 1, b"late %d" % i) for i in range(5)]
    finally:
        query.stop()
