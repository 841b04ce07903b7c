"""Options and offsets of a streaming read of a log (``spark.readStream``).

Offsets are positions in the log, kept by Spark in the query's checkpoint
as JSON a user can read: ``{"log": "orders", "dlsn": "3/12/0"}``.  An offset
is *the next position to read*: a micro-batch ``[start, end)`` holds the
records whose DLSN is ``>= start`` and ``< end``; an end is always just after
a record (``DLSN.next()``), so the batch ends at a record boundary.

Streaming options (on top of the batch source's: ``config`` / ``metadata``,
``log`` (required), ``password``, ``maxEntriesPerPartition``,
``minPartitions``, ``readTimeoutMs``); each bad one is one ``ValueError``
naming it:

| option | default | meaning |
|---|---|---|
| ``startingPosition`` | ``earliest`` | ``earliest``, ``latest``, a DLSN ``seq/entry/slot``, |
|  |  | or ``txid:N`` (the first record whose txid is >= N) |
| ``maxRecordsPerTrigger`` | (none) | at most this many records per micro-batch |
| ``maxBytesPerTrigger`` | (none) | at most about this many payload bytes per micro-batch |
|  |  | (whole entries; at least one record) |
| ``failOnDataLoss`` | ``true`` | records the query still needs were truncated: fail |
|  |  | naming the DLSN (true) or skip them with a warning (false) |
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from appliance.protocol.logs import DLSN
from appliance.spark.options import ScanOptions, _bool, _positive, parse_options

EARLIEST, LATEST = "earliest", "latest"


@dataclass(frozen=True)
class StreamOptions:
    scan: ScanOptions
    log: str
    starting: str | DLSN | int = EARLIEST  # "earliest" | "latest" | a DLSN | a txid (int)
    max_records: int | None = None
    max_bytes: int | None = None
    fail_on_data_loss: bool = True


def parse_stream_options(raw: Mapping[str, str]) -> StreamOptions:
    opts = {str(k).lower(): v for k, v in raw.items()}
    starting = _starting(opts.pop("startingposition", None))
    max_records = _positive("maxRecordsPerTrigger", opts.pop("maxrecordspertrigger", None), None)
    max_bytes = _positive("maxBytesPerTrigger", opts.pop("maxbytespertrigger", None), None)
    fail = _bool("failOnDataLoss", opts.pop("failondataloss", None), True)
    scan = parse_options(opts)
    if scan.log is None:
        raise ValueError("bookkeeper source: a streaming read follows a log: set option log "
                         "(spark.readStream...option(\"log\", NAME))")
    return StreamOptions(scan, scan.log, starting, max_records, max_bytes, fail)


def _starting(text) -> str | DLSN | int:
    if text is None:
        return EARLIEST
    value = str(text).strip()
    if value.lower() in (EARLIEST, LATEST):
        return value.lower()
    if value.lower().startswith("txid:"):
        try:
            return int(value[5:].strip())
        except ValueError:
            raise ValueError(f"option startingPosition: bad txid in {value!r}: use txid:N with "
                             "N an integer") from None
    try:
        return DLSN.parse(value)
    except ValueError:
        raise ValueError(f"option startingPosition must be earliest, latest, a DLSN "
                         f"'seq/entry/slot' (e.g. 3/12/0) or txid:N, got {value!r}") from None


def offset_json(log: str, position: DLSN) -> dict:
    """The offset Spark keeps for ``position`` of ``log``."""
    return {"log": log, "dlsn": str(position)}


def offset_position(log: str, offset: Mapping) -> DLSN:
    """The position of an offset Spark gives back; ``ValueError`` naming the
    checkpoint's log when it was written by a query of another log."""
    if not isinstance(offset, Mapping) or "dlsn" not in offset:
        raise ValueError(f"bookkeeper source: offset {json.dumps(offset)} is not one of ours "
                         "({\"log\": NAME, \"dlsn\": \"seq/entry/slot\"}): was the checkpoint "
                         "written by another source?")
    if offset.get("log") != log:
        raise ValueError(f"bookkeeper source: the checkpoint holds offsets of log "
                         f"{offset.get('log')!r}, this query reads log {log!r}: use a new "
                         "checkpointLocation")
    return DLSN.parse(offset["dlsn"])
