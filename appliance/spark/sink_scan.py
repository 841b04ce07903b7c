"""What the target log already holds of a streaming sink's micro-batch: so a
batch Spark runs again (a task retry, the replay after a restart from the
checkpoint) skips the rows an earlier attempt stored, whichever log server
owns the log now and however long ago that attempt ran.

Guarantees:

* ``log_end`` is a position no record written after it was read can be
  before: just after the last entry of the log's last segment (its LAC if
  it is being written: every later add gets a larger entry id, or lands in
  a later segment).  The sink records it with the batch's first sequence
  number before the batch's first row is written (``sink_seq``).
* ``stored_rows`` reads the log from that position on (bounded: only the
  entries written since the batch began, never the log's whole tail) and
  counts the records tagged with the producer's id and a sequence number of
  the batch.  The owner stores a producer's records in its order without a
  gap, so they are the batch's first rows, numbered ``first`` on; a gap is
  an ``invariant`` failure, never a skipped row.  Rows missing at the start
  of the run are stored rows truncated away since (a truncation drops whole
  segments from the log's start) or sit in a segment that could not be
  read (below): allowed only then.  If all of them are gone, none is found
  and the batch's rows are written again.
* What the scan may not see: records past the LAC of a segment still being
  written.  The owner that stored them still tracks the producer (it
  answers those rows as duplicates), and an owner that takes the log over
  after a crash recovers that segment and learns its tags before it takes a
  write (the last completed segment is always in its rebuild:
  ``appliance.logservice.owned.learn_tail``).  A segment in the range
  whose ledger was deleted after it moved to cold storage has no tags left
  (cold files keep none): it is skipped with a warning; rows of the batch
  there are known to be stored only when a later row of the batch is
  found, else they are written again.
"""

from __future__ import annotations

import logging

from appliance.errors import NoSuchLogError
from appliance.protocol import limits
from appliance.protocol.invariant import invariant
from appliance.protocol.log_entry import unpack_tags
from appliance.protocol.logs import COMPLETED, DLSN

log = logging.getLogger("appliance.spark")

PASSWORD = b""  # logs written through the log service have none


def log_end(client, name: str) -> DLSN:
    """Just after the last entry of log ``name`` now (the log's start if it
    has no segment or does not exist yet)."""
    try:
        md = client.logs.read_log(name)[0]
    except NoSuchLogError:
        return DLSN.FIRST
    live = md.live_segments
    if not live:
        return DLSN(md.next_seq, 0, 0)
    seg = live[-1]
    if seg.state == COMPLETED:
        return DLSN(seg.seq, seg.last_entry_id + 1, 0)
    handle = client.open_ledger(seg.ledger_id, password=PASSWORD, recovery=False)
    try:
        return DLSN(seg.seq, handle.read_lac() + 1, 0)  # -1: no entry yet
    finally:
        handle.close()


def stored_rows(client, name: str, pid: bytes, first: int, since: DLSN) -> int:
    """How many of the rows numbered ``first``, ``first + 1``, ... of
    producer ``pid`` log ``name`` holds from ``since`` on."""
    try:
        md = client.logs.read_log(name)[0]
    except NoSuchLogError:
        return 0
    found: set[int] = set()
    unread = md.truncated_before > since  # rows at the run's start may be gone
    for seg in md.live_segments:
        if seg.seq < since.seq:
            continue
        if seg.ledger_deleted:
            unread = True
            log.warning("bookkeeper sink: log %r segment %d moved to cold storage and its "
                        "ledger is gone: rows of this batch stored only there are written "
                        "again", name, seg.seq)
            continue
        start = since.entry_id if seg.seq == since.seq else 0
        found |= _tagged_seqs(client, seg, start, pid, first)
    if not found:
        return 0
    low, top = min(found), max(found)
    invariant(len(found) == top - low + 1 and (low == first or unread),
              f"log {name!r} holds rows {low}..{top} of producer {pid.hex()} from {first} "
              f"({len(found)} of them), and all it holds since {since} was read")
    return top - first + 1  # rows before low were stored (truncated, or in an unread segment)


def _tagged_seqs(client, seg, start: int, pid: bytes, first: int) -> set[int]:
    """Sequence numbers >= ``first`` of ``pid``'s records in the segment's
    entries from ``start`` to its last readable one."""
    out: set[int] = set()
    handle = client.open_ledger(seg.ledger_id, password=PASSWORD, recovery=False)
    try:
        last = seg.last_entry_id if seg.state == COMPLETED else handle.read_lac()
        step = limits.LOG_READ_ENTRIES_MAX
        for lo in range(start, last + 1, step):
            for entry in handle.read(lo, min(lo + step - 1, last)):
                data = entry.payload if isinstance(entry.payload, bytes) else bytes(entry.payload)
                if pid not in data:  # one C search: most entries hold none of ours
                    continue
                out.update(seq for p, seq in unpack_tags(data) or () if p == pid and seq >= first)
    finally:
        handle.close()
    return out
