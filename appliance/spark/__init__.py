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
pushdown: ``filters``; usage and numbers: ``docs/SPARK.md``.
"""

from __future__ import annotations

from appliance.spark.source import (
    ARROW_SCHEMA,
    SCHEMA_DDL,
    BookKeeperDataSource,
    BookKeeperPushdownDataSource,
)

__all__ = ["register", "BookKeeperDataSource", "BookKeeperPushdownDataSource", "SCHEMA_DDL",
           "ARROW_SCHEMA", "PUSHDOWN_CONF"]

PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def register(spark, *, filter_pushdown: bool | None = None) -> None:
    """Register the ``bookkeeper`` format with ``spark``.

    ``filter_pushdown``: None (default) follows the session's
    ``spark.sql.python.filterPushdown.enabled`` at this moment; True turns that
    setting on for the session (it costs one more Python worker run while
    planning each query) so filters on ``ledger_id`` / ``entry_id`` prune what
    is read; False registers the source without pushdown.  Spark refuses a
    pushdown-capable Python source while the setting is off, hence the two
    classes."""
    if filter_pushdown is None:
        filter_pushdown = str(spark.conf.get(PUSHDOWN_CONF, "false")).lower() == "true"
    elif filter_pushdown:
        spark.conf.set(PUSHDOWN_CONF, "true")
    spark.dataSource.register(BookKeeperPushdownDataSource if filter_pushdown
                              else BookKeeperDataSource)
