"""Request planning for a bulk read: which entries travel in one request.

Pure (no I/O, no clock).  A read's range ``first..last`` is cut into
*chunks*, each a run of entries one bookie can serve in one reply:

* never across a fragment boundary (the write set changes there);
* at most ``batch_entries_max`` entries, and on a striped ledger (ensemble
  larger than the write quorum) at most ``write_quorum`` entries at first,
  cut further when sent to the run of consecutive entries the chosen bookie
  holds (``run_len``).

A ``ReadJob`` holds a window of at most ``window_chunks_max`` chunks in
entry order.  A chunk answered in part is split after its verified prefix
and the rest stays next in line, so the window covers the range from the
entry being handed out onwards without gaps or overlaps.
"""

from __future__ import annotations

import itertools

from appliance.client.bulk_read.config import BulkReadConfig
from appliance.client.bulk_read.records import VerifiedChunk
from appliance.errors import BKError

UNBOUNDED_ENTRY_ID = (1 << 63) - 1  # the end of a ledger's last fragment
UNBOUNDED_RUN = 1 << 62  # a bookie of an unstriped ledger (E == Qw) holds every entry


def fragment_end(md, entry_id: int) -> int:
    """The last entry id of the fragment holding ``entry_id`` (the last
    fragment is unbounded: ``UNBOUNDED_ENTRY_ID``)."""
    for first, _ in md.ensembles:
        if first > entry_id:
            return first - 1
    return UNBOUNDED_ENTRY_ID


def run_len(md, bookie_id: str, entry_id: int) -> int:
    """How many entries from ``entry_id`` on ``bookie_id`` holds in a row
    (``bookie_id`` must be in the entry's write set)."""
    if md.ensemble_size == md.write_quorum:
        return UNBOUNDED_RUN
    index = md.fragment_for(entry_id)[1].index(bookie_id)
    return (index - entry_id) % md.ensemble_size + 1


def chunk_last(md, first: int, last: int, batch_entries_max: int) -> int:
    """The last entry of the chunk that starts at ``first`` in a read up to ``last``."""
    span = batch_entries_max
    if md.ensemble_size > md.write_quorum:  # striped: a bookie holds runs of Qw
        span = min(span, md.write_quorum)
    return min(last, fragment_end(md, first), first + span - 1)


class Chunk:
    """A run of entries asked of one bookie at a time."""

    __slots__ = ("first", "last", "ordinal", "tries", "answers", "codes", "not_before_s",
                 "sent", "sent_at_s", "hedge", "result", "error")

    def __init__(self, first: int, last: int, ordinal: int):
        self.first, self.last, self.ordinal = first, last, ordinal
        self.tries: dict[str, int] = {}  # bookie -> times asked for entry ``first``
        self.answers: list[str] = []  # what each try answered, for the error message
        self.codes: list[int] = []
        self.not_before_s = 0.0  # backoff before the next round
        # (bookie, request id, sent as READ_PACKED) while a request is out
        self.sent: tuple[str, int, bool] | None = None
        self.sent_at_s = 0.0  # when ``sent`` went out
        # the speculative copy of ``sent`` sent to another replica (at most one)
        self.hedge: tuple[str, int, bool] | None = None
        self.result: VerifiedChunk | None = None
        self.error: BKError | None = None  # every replica failed (raised once at the head)


class ReadJob:
    """The state of one ``BulkReader.read`` call: a window of chunks in entry order."""

    def __init__(self, metadata, first: int, last: int, digest, config: BulkReadConfig,
                 master_key: bytes | None = None):
        self.md, self.last, self.digest, self.config = metadata, last, digest, config
        self.master_key = master_key  # sent with every request (None: no key)
        self.next_first = first
        self.window: list[Chunk] = []
        self.ordinals = itertools.count()

    def refill(self) -> None:
        """Plan chunks up to ``window_chunks_max`` or the end of the range."""
        cfg = self.config
        while len(self.window) < cfg.window_chunks_max and self.next_first <= self.last:
            first = self.next_first
            end = chunk_last(self.md, first, self.last, cfg.batch_entries_max)
            self.window.append(Chunk(first, end, next(self.ordinals)))
            self.next_first = end + 1

    def split(self, chunk: Chunk, last: int) -> Chunk:
        """Cut ``chunk`` after ``last``; the rest becomes the next chunk."""
        rest = Chunk(last + 1, chunk.last, next(self.ordinals))
        chunk.last = last
        self.window.insert(self.window.index(chunk) + 1, rest)
        return rest

    def run_lens(self, chunk: Chunk) -> dict[str, int]:
        """Each replica of the chunk's first entry -> its run from there."""
        return {b: run_len(self.md, b, chunk.first) for b in self.md.write_set(chunk.first)}
