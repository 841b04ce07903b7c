"""Records and payload bytes per micro-batch in Spark's progress reports.

PySpark's Python data sources (Spark 4.3) have no custom metrics: Spark
reports ``sources[].metrics`` only for a source implementing
``ReportsSourceMetrics`` and ``sink.metrics`` for ``ReportsSinkMetrics``,
and neither ``PythonMicroBatchStream`` nor ``PythonStreamingWrite`` does.
The log's entry headers carry record counts and txids but no byte totals,
so the source could put a batch's bytes in its offset only by reading every
entry of the batch a second time on the driver.

What Spark does report for every query is ``observedMetrics``: aggregates a
``Dataset.observe`` computes over each micro-batch's rows as they pass, in
the same job (no second read).  ``observe_log_metrics`` adds one,
``"bookkeeper"``: ``records`` (rows in the batch) and ``bytes`` (the sum of
their ``payload`` lengths: a binary payload's bytes, a string's UTF-8
bytes, as the sink stores them).  It works on a stream read from a log and
on the DataFrame a query writes to a log; the rows pass unchanged.
Guarantee: per batch, exactly the batch's rows and their payload bytes
(Spark computes them with the batch; a batch Spark runs again after a
crash is reported again).
"""

from __future__ import annotations

from pyspark.sql import functions as F  # noqa: N812 - Spark's usual name

METRICS_NAME = "bookkeeper"


def observe_log_metrics(df, name: str = METRICS_NAME):
    """``df`` (with a ``payload`` column) reporting ``records`` and ``bytes``
    per micro-batch in ``query.lastProgress["observedMetrics"][name]``."""
    if "payload" not in df.columns:
        raise ValueError(f"observe_log_metrics: the rows have no payload column (columns "
                         f"{df.columns}): observe a log's stream, or a DataFrame written to "
                         "a log")
    return df.observe(name, F.count(F.lit(1)).alias("records"),
                      F.coalesce(F.sum(F.octet_length("payload")), F.lit(0)).alias("bytes"))
