"""Cold storage (seed 003): sealed log segments move off the bookies into
one verified Parquet file each, in a directory or an object store, and are
read from there as before (the same DLSNs, txids and payloads).

* ``segment_file``: the file format (columns, identity metadata, content
  checksum) and its verification; readable by Spark/DuckDB/pandas as is.
* ``store``: the cold tier through pyarrow's filesystems (local, S3).
* ``mover``: the crash-safe move (write, make durable, verify, CAS the
  segment to cold, delete the ledger after a grace), orphan collection,
  one mover per log.
* ``reading``: a cold segment's records for the log reader and Spark.

Needs pyarrow (``pip install bk-appliance[spark]``, which already brings it);
the log layer imports this room only when it meets a cold segment.
"""

try:
    import pyarrow  # noqa: F401 - the one check, with the fix in the message
except ImportError as exc:  # a core install without the spark extra
    from appliance.errors import ConfigError

    raise ConfigError("cold storage needs pyarrow: pip install 'bk-appliance[spark]'") from exc
