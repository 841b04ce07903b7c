"""Bulk reads of committed ledger ranges straight from the bookies, for
analytics (``appliance.spark``): READ_PACKED messages of many entries (one
data frame per reply), checks vectorised over each reply, failover between
the replicas of every entry.

    with BulkReader(endpoints) as reader:          # {bookie id: endpoint}
        for chunk in reader.read(metadata, 0, metadata.last_entry_id, master_key):
            chunk.first_entry_id, chunk.payloads, chunk.offsets

The caller fixes the range before reading (a CLOSED ledger's last entry, an
OPEN ledger's LAC): every entry asked for is committed, so its fragment and
write set in ``metadata`` can no longer change and any replica may serve it.
This reader does not fence, recover or touch the metadata store.  Every
request carries ``master_key`` (bookies holding the ledger's key refuse
reads without it, and with a wrong one: ``UnauthorizedError`` rows).

Guarantees:

* **Verified bytes only.**  An entry is handed out only if its digest (CRC32C
  or HMAC-SHA256 over header and payload) matches, its header names the
  ledger and entry asked for, its LAC is below its id, and its running
  length agrees with the entry before it in the same reply.  A reply is cut
  at its first bad record; the rest is asked of another replica.  A corrupt,
  misfiled or lying bookie costs time, never wrong bytes.
* **Order, exactly once**: chunks come out in entry order, without gaps or
  overlaps, covering exactly ``first..last``.
* **Failover**: a timeout, an error reply, an error row, an undecodable reply
  or a bad record moves the rest of the range to the next bookie of the
  entry's write set.  Each bookie is tried at most ``rounds_max`` times per
  entry, with ``retry_backoff_ms`` between rounds; then, once every entry
  before it was handed out, the read raises an ``appliance.errors`` error
  naming the ledger, the first entry no replica served and every answer.
  It is ``NoSuchEntryError`` only when every answer was an explicit negative.
* **Speculative reads**: a chunk unanswered for ``speculative_read_timeout_ms``
  is also asked, once, of another replica with room for a request; the
  first reply wins, so a stalled bookie costs a chunk about that long, not
  ``read_timeout_ms``, and is asked last for a while after.
* **Bounded**: at most ``inflight_per_bookie_max`` requests per bookie and
  ``window_chunks_max`` chunks (in flight or verified) ahead of the one being
  handed out; every wait has a deadline (``read_timeout_ms``).  A reply
  after its request timed out is dropped unread (``ipc.client.Transport``).

Faults survived: a bookie that is down, restarts, stalls, serves corrupt or
misfiled records, or answers garbage, as long as one replica of each entry
answers correctly within the rounds.

Modules, by responsibility (all but ``reader`` pure: no I/O, no clock):

* ``config``: ``BulkReadConfig``, the knobs and limits;
* ``plan``: cutting the range into chunks, the window of chunks;
* ``failover``: which replica to ask next, backoff, the final error;
* ``records``: decoding replies and verifying records;
* ``reader``: ``BulkReader``, the sends and waits, over the client
  transport (``ipc.client``: deadlines, CURVE, reconnects; raw replies).
"""

from __future__ import annotations

from appliance.client.bulk_read.config import BulkReadConfig
from appliance.client.bulk_read.reader import BulkReader
from appliance.client.bulk_read.records import (
    ParsedReply,
    VerifiedChunk,
    parse_reply,
    verify_packed,
    verify_records,
)

__all__ = ["BulkReadConfig", "BulkReader", "ParsedReply", "VerifiedChunk", "parse_reply",
           "verify_packed", "verify_records"]
