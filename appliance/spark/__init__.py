"""Spark batch ingestion from the appliance: the ``bookkeeper`` data source.

    from appliance.spark import register
    register(spark)
    df = (spark.read.format("bookkeeper")
          .option("config", "configs/local.toml")   # or .option("metadata", uri)
          .option("ledgers", "3,4,5")               # default: every CLOSED ledger
          .option("password", "secret")
          .load())                                  # ledger_id, entry_id, payload

The driver plans partitions from ledger metadata with bounds fixed at
planning (``planner``); each task reads its ranges straight from the bookies
with batched, verified, failing-over reads (``appliance.client.bulk_read``) and
yields Arrow record batches (``source``).  Options: ``options``; filter
pushdown: ``filters``; usage and numbers: ``docs/SPARK.md``.  A log is also
read as a stream (``spark.readStream``, option ``log``): ``stream``; and a
DataFrame's ``payload`` column is written to a log (``df.write`` /
``df.writeStream``, option ``log``, through the log service): ``sink``;
records and bytes per micro-batch in Spark's progress reports:
``observe_log_metrics`` (``metrics``).  ``read_log(spark, NAME, config=...)``
reads a log in batch with its cold segments' files read by Spark's own
Parquet reader (``native``: same rows, several times faster than the
source over cold segments).
"""

from __future__ import annotations

from appliance.spark.metrics import METRICS_NAME, observe_log_metrics
from appliance.spark.native import read_log
from appliance.spark.registry import PUSHDOWN_CONF, pushdown_read_shared, register
from appliance.spark.source import (
    ARROW_SCHEMA,
    SCHEMA_DDL,
    BookKeeperDataSource,
    BookKeeperPushdownDataSource,
)

__all__ = ["register", "BookKeeperDataSource", "BookKeeperPushdownDataSource", "SCHEMA_DDL",
           "ARROW_SCHEMA", "PUSHDOWN_CONF", "pushdown_read_shared", "observe_log_metrics",
           "METRICS_NAME", "read_log"]
