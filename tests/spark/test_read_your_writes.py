"""Read your writes from Spark (CONTRACT.md "Log service"): a record whose
producer write returned is in every batch read and streaming query started
afterwards, although the bookies' LAC, carried by the next entry, is behind:
here nothing follows the last entry (the owner's control entries and the
ledger's explicit LAC are off), so the source plans the in-progress segment
to the end the log's owner says is acknowledged (``owner_confirmed``)."""

from __future__ import annotations

import pytest

from appliance import DLSN
from appliance.spark import register
from tests.logservice.support import log_servers_running

ROUNDS = 3


@pytest.fixture(scope="module")
def service(appliance_factory, spark):
    register(spark)
    app = appliance_factory(3, client={"explicit_lac_interval_ms": 0},
                            log={"service_control_interval_ms": 0, "control_interval_ms": 0})
    with log_servers_running(app.cluster, app.client, "logserver-1"):
        yield app


def _batch(spark, app, name):
    rows = (spark.read.format("bookkeeper").option("config", app.config).option("log", name)
            .load().collect())
    return [bytes(r.payload) for r in sorted(rows, key=lambda r: DLSN.parse(r.dlsn))]


def _stream(spark, app, name, checkpoint):
    df = (spark.readStream.format("bookkeeper").option("config", app.config)
          .option("log", name).load())
    query = (df.writeStream.format("memory").queryName(checkpoint.name)
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(300) and query.exception() is None
        return sorted(bytes(r.payload) for r in spark.table(checkpoint.name).collect())
    finally:
        query.stop()


def test_a_batch_read_and_a_stream_started_after_a_write_see_it(spark, service, tmp_path):
    app = service
    written = []
    with app.client.log("ryw").producer() as p:
        for i in range(ROUNDS):
            for k in range(5):
                record = b"round %d record %d" % (i, k)
                p.write(record)  # returned: acknowledged
                written.append(record)
            assert _batch(spark, app, "ryw") == written, f"round {i}"
            assert _stream(spark, app, "ryw", tmp_path / f"q{i}") == sorted(written)
