"""``register``: the ``bookkeeper`` format in a Spark session, with or
without filter pushdown (Spark refuses a pushdown-capable Python source
while ``spark.sql.python.filterPushdown.enabled`` is off, and on Spark 4.3
a pushdown's planned read is kept on the DataFrame: ``pushdown_read_shared``)."""

from __future__ import annotations

import warnings

from appliance.spark.source import BookKeeperDataSource, BookKeeperPushdownDataSource

PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


# Spark's JVM class behind every Python data source DataFrame.  Where it holds
# the planned read (``readInfo``: pickled read function and partitions), a
# filter pushdown's read is reused by a later query of the same DataFrame
# that pushes no filter (it makes no Python call while planning).
_PY_DATA_SOURCE_CLASS = "org.apache.spark.sql.execution.datasources.v2.python.PythonDataSourceV2"


def pushdown_read_shared(spark) -> bool:
    """Whether this Spark keeps the read a filter pushdown planned on the
    DataFrame's data source, where a later query of that DataFrame pushing no
    filter reuses it (Spark 4.3: ``PythonDataSourceV2.setReadInfo``, called by
    ``PythonScanBuilder.pushFilters``; ``getOrCreateReadInfo`` plans only when
    nothing is kept).  True when it cannot tell (e.g. Spark Connect)."""
    try:
        cls = spark._jvm.java.lang.Class.forName(_PY_DATA_SOURCE_CLASS)
        names = {m.getName() for m in cls.getDeclaredMethods()}
        names |= {f.getName() for f in cls.getDeclaredFields()}
    except Exception:  # noqa: BLE001 - no JVM reachable from here: assume the worst
        return True
    return bool(names & {"readInfo", "setReadInfo", "getOrCreateReadInfo"})


def register(spark, *, filter_pushdown: bool | None = None) -> None:
    """Register the ``bookkeeper`` format with ``spark``.

    ``filter_pushdown``: None (default) follows the session's
    ``spark.sql.python.filterPushdown.enabled`` at this moment; True turns that
    setting on for the session (it costs one more Python worker run while
    planning each query) so filters on ``ledger_id`` / ``entry_id`` prune what
    is read; False registers the source without pushdown.  Spark refuses a
    pushdown-capable Python source while the setting is off, hence the two
    classes.

    Where Spark keeps a pushdown's planned read on the DataFrame
    (``pushdown_read_shared``: Spark 4.3), a later query of that DataFrame
    pushing no filter would read only the earlier query's entries; there the
    source is registered without pushdown (same rows, more read) and a
    ``RuntimeWarning`` says so, whatever ``filter_pushdown`` asks.

    The same format reads a log as a stream (``spark.readStream``, option
    ``log``: ``appliance.spark.stream``) and writes to a log (``df.write`` /
    ``df.writeStream``, option ``log``: ``appliance.spark.sink``)."""
    if filter_pushdown is None:
        filter_pushdown = str(spark.conf.get(PUSHDOWN_CONF, "false")).lower() == "true"
    if filter_pushdown and pushdown_read_shared(spark):
        warnings.warn("bookkeeper source: filter pushdown is off. This Spark keeps the read a "
                      "pushdown planned on the DataFrame, and a later query of that DataFrame "
                      "that pushes no filter would read only that earlier query's entries "
                      "(docs/SPARK.md, Filter pushdown); every query reads all the entries "
                      "its ledgers and entry bounds select, and Spark filters them",
                      RuntimeWarning, stacklevel=2)
        filter_pushdown = False
    elif filter_pushdown:
        spark.conf.set(PUSHDOWN_CONF, "true")
    spark.dataSource.register(BookKeeperPushdownDataSource if filter_pushdown
                              else BookKeeperDataSource)
