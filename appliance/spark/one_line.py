"""Errors of ours raised while Spark plans a ``bookkeeper`` read reach the
user as their one line, not as a Python traceback inside Spark's message.

Spark plans a Python data source in a Python worker of its own (the
``create_data_source``, ``plan_data_source_read`` and streaming source
runner modules), started for that one request, which exits after it.  That
worker formats the exception it hands to Spark with
``traceback.format_exception_only`` (the exception line alone) when
``SPARK_HIDE_TRACEBACK`` is set at the moment it handles it, and with the
whole traceback otherwise.  ``planning_errors`` sets it just before one of
our errors (``BKError``: a ledger, a password, the appliance; ``ValueError``:
an option) leaves the planning code, so the user reads e.g.

    [PYTHON_DATA_SOURCE_ERROR] ...: appliance.protocol.errors.UnauthorizedError:
    bookkeeper source: wrong password for ledger 42

Guarantees: only planning code is wrapped (the worker, and the setting,
end with that request); executor reads, in workers Spark reuses, keep their
tracebacks; any other exception (a bug) keeps its traceback too.  If a
PySpark ignores the setting, the message still ends with our line.
"""

from __future__ import annotations

import functools
import os

from appliance.errors import BKError

HIDE_TRACEBACK_ENV = "SPARK_HIDE_TRACEBACK"  # read by pyspark.util.handle_worker_exception


def planning_errors(f):
    """Decorate a method Spark calls while planning (never one that runs in
    an executor task): our errors leave it as one line."""

    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        try:
            return f(*args, **kwargs)
        except (BKError, ValueError):
            os.environ[HIDE_TRACEBACK_ENV] = "1"
            raise

    return wrapper
