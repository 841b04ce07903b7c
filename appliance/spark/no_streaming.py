"""Until the ``bookkeeper`` source reads streams: a streaming read of it fails
at ``load()`` with one line of ours (``STREAMING_UNSUPPORTED``).

Spark calls nothing of a Python data source at a streaming ``load()`` that
tells it from a batch one (``schema()``, in a worker that gets the same
options either way); it asks for the stream reader only at ``start()``.  So
``register`` wraps the session's ``DataStreamReader`` class once
(``refuse_stream_loads``): a ``load()`` whose format is ``bookkeeper``
raises ``ValueError(STREAMING_UNSUPPORTED)`` in the driver, before Spark
plans anything; every other format loads as before.  A query that gets past
it (the source registered without ``register``) fails at ``start()`` on
``UnsupportedStreamReader``, with the same line in Spark's message.

When the streaming source comes (CONTRACT, "Structured Streaming source"),
delete this module and its two uses (``register``, ``streamReader``).
"""

from __future__ import annotations

import functools

from pyspark.sql.datasource import DataSourceStreamReader

from appliance.spark.one_line import planning_errors

SOURCE_NAME = "bookkeeper"
STREAMING_UNSUPPORTED = (
    "bookkeeper source: streaming reads (spark.readStream) are not supported yet; read "
    "ledgers or a log in batch with spark.read.format(\"bookkeeper\"), or follow a log "
    "with log.reader() in Python or bkctl log read --follow")
_MARK = "_bookkeeper_refuses_stream_loads"


def refuse_stream_loads(spark) -> None:
    """Make ``spark.readStream...load()`` of format ``bookkeeper`` raise
    ``ValueError(STREAMING_UNSUPPORTED)`` (the session's reader class: the
    classic one, or Spark Connect's); once per class, whatever the calls."""
    cls = type(spark.readStream)
    if getattr(cls, _MARK, False):
        return
    original_format, original_load = cls.format, cls.load

    @functools.wraps(original_format)
    def format(self, source):  # noqa: A001 - the wrapped method's name
        self._bookkeeper_format = str(source).lower()
        return original_format(self, source)

    @functools.wraps(original_load)
    def load(self, *args, **kwargs):
        source = kwargs.get("format", args[1] if len(args) > 1 else None)
        if str(source or getattr(self, "_bookkeeper_format", "")).lower() == SOURCE_NAME:
            raise ValueError(STREAMING_UNSUPPORTED)
        return original_load(self, *args, **kwargs)

    cls.format, cls.load = format, load
    setattr(cls, _MARK, True)


class UnsupportedStreamReader(DataSourceStreamReader):
    """What ``streamReader`` gives Spark at ``start()``: its first call
    fails with ``STREAMING_UNSUPPORTED`` as one line (a reader that
    ``streamReader`` failed to give would end Spark's message in an
    ``UnboundLocalError`` of PySpark's runner instead)."""

    @planning_errors
    def _refuse(self, *args):
        raise ValueError(STREAMING_UNSUPPORTED)

    initialOffset = latestOffset = partitions = read = _refuse  # noqa: N815 - Spark's names
