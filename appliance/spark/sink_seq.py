"""Where a streaming sink task's sequence numbers start: one producer per
(query, partition) for the query's life, and a small record per producer in
the metadata store, ``/sparksink/<producer id hex>``:
``{"batch": N, "first": K, "rows": n or null, "since": "seq/entry/slot"}``.

Guarantees (the records are written with the store's compare-and-set, and
checksummed: ``appliance.meta.records``):

* The first attempt of micro-batch N of a partition numbers its rows from
  K = the previous batch's ``first + rows`` (1 for the first), and records
  (N, K) *before* writing any row; every later attempt of batch N (a task
  retry, a speculative copy, the replay after a restart from the
  checkpoint) finds N recorded and numbers the same rows from the same K.
  So a row's (producer id, sequence number) is the same in every attempt.
* With (N, K) the first attempt records ``since``, a position of the target
  log no row of batch N can be before (``sink_scan.log_end``, read before
  the record is made).  A later attempt learns it is one (``again``) and
  where to look: the rows the log holds from ``since`` on, numbered K on,
  are the ones an earlier attempt stored (``sink_scan.stored_rows``); the
  sink skips them, and the owner stores the rest once.
* Sequence numbers of a producer only grow from batch to batch without a
  gap (the owner refuses a gap from a producer it tracks): batch N's rows
  are K..K+n-1 and batch N+1 starts at K+n.  ``rows`` is recorded once all
  n rows are durable, before the task returns; Spark starts batch N+1 only
  after every task of N returned.
* A record of a batch after N (a checkpoint older than the query's
  records) is one ``ValueError``: numbering from it could skip or repeat.
"""

from __future__ import annotations

import json
from typing import NamedTuple

from appliance.errors import MetadataVersionError, NodeExistsError, NoNodeError
from appliance.meta.records import decode_record, encode_record
from appliance.protocol import limits
from appliance.protocol.invariant import invariant
from appliance.protocol.logs import DLSN

ROOT = "/sparksink"


class BatchStart(NamedTuple):
    first: int  # the batch's first sequence number
    since: DLSN | None  # no row of the batch is before it (None: a record of an older sink)
    again: bool  # an earlier attempt of the batch may have stored rows


def _path(pid: bytes) -> str:
    return f"{ROOT}/{pid.hex()}"


def _read(store, path: str) -> tuple[dict | None, int | None]:
    try:
        data, version = store.get(path)
    except NoNodeError:
        return None, None
    return json.loads(decode_record(data, path)), version


def _encode(doc: dict) -> bytes:
    return encode_record(json.dumps(doc, sort_keys=True).encode())


def batch_start(store, pid: bytes, batch: int, position=lambda: DLSN.FIRST) -> BatchStart:
    """Where ``batch``'s rows for producer ``pid`` start (recorded before any
    of them is written); ``position()``: the target log's end now, called
    only by the batch's first attempt."""
    path = _path(pid)
    since = None
    for _ in range(limits.METADATA_PUBLISH_TRIES_MAX):
        doc, version = _read(store, path)
        if doc is not None and doc["batch"] == batch:  # a later attempt: the same numbers
            mark = doc.get("since")
            return BatchStart(doc["first"], None if mark is None else DLSN.parse(mark), True)
        if doc is not None and doc["batch"] > batch:
            raise ValueError(f"bookkeeper sink: this query already wrote micro-batch "
                             f"{doc['batch']} and now runs batch {batch}: was its checkpoint "
                             "replaced by an older copy? Use a new checkpointLocation")
        if doc is not None:
            invariant(doc["rows"] is not None, f"sink batch {doc['batch']} of producer "
                      f"{pid.hex()} never finished, and batch {batch} follows it")
        first = 1 if doc is None else doc["first"] + doc["rows"]
        since = since or position()
        record = _encode({"batch": batch, "first": first, "rows": None, "since": str(since)})
        try:
            if doc is None:
                store.create(path, record, make_parents=True)
            else:
                store.set(path, record, version)
            return BatchStart(first, since, False)
        except (NodeExistsError, MetadataVersionError):
            continue  # another attempt of this task recorded it first: read its numbers
    raise MetadataVersionError(f"bookkeeper sink: {path} kept changing")


def batch_done(store, pid: bytes, batch: int, first: int, rows: int) -> None:
    """All ``rows`` of ``batch`` are durable: the next batch starts after them."""
    path = _path(pid)
    for _ in range(limits.METADATA_PUBLISH_TRIES_MAX):
        doc, version = _read(store, path)
        invariant(doc is not None and doc["batch"] == batch and doc["first"] == first,
                  f"sink record {path} changed under batch {batch}: {doc}")
        if doc["rows"] is not None:
            invariant(doc["rows"] == rows, f"batch {batch} wrote {rows} rows, another "
                      f"attempt {doc['rows']}")
            return
        try:
            store.set(path, _encode({**doc, "rows": rows}), version)
            return
        except MetadataVersionError:
            continue
    raise MetadataVersionError(f"bookkeeper sink: {path} kept changing")
