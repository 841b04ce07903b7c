"""A simulated bulk read: the product's bulk-read decisions driven by the
simulation.

``BulkReadApp`` reads a CLOSED ledger from first to last entry the way
``appliance.client.bulk_read.BulkReader`` does, with the same pure code for
every decision: chunks (``plan.chunk_last``, ``plan.run_len``), which replica
to ask next and when a round is over (``failover.replicas_to_ask``,
``failover.tries_after_failure``), and the error when no replica served an
entry (``failover.no_replica_error``).  Only the I/O is the simulation's:
``SendReadBatch`` over the simulated network, answered by simulated bookies
through the product's admission rule, timeouts and back-off on the
simulated clock.  One chunk is in flight at a time (the real reader's window
and pipelining are throughput, not safety).

What the run checks (``Cluster``): every payload it hands out is the one the
writer wrote (``checker.on_read``), it hands out every entry of the ledger
exactly once and in order, or it ends with the error ``no_replica_error``
names -- never a short or a wrong read.
"""

from __future__ import annotations

import itertools

from appliance.client.bulk_read.failover import (
    no_replica_error,
    replicas_to_ask,
    tries_after_failure,
)
from appliance.client.bulk_read.plan import chunk_last, run_len
from appliance.errors import OK, BKTimeoutError, DigestMismatchError
from appliance.protocol import events as ev
from appliance.protocol.entry import verify_run


class BulkReadApp:
    """Reads entries ``0..md.last_entry_id`` of a closed ledger; calls
    ``on_done(self)`` with ``self.error`` None (all read) or the BKError."""

    def __init__(self, cluster, name: str, md, *, on_done, batch_entries_max: int = 4,
                 read_timeout_ms: int = 50, rounds_max: int = 2, retry_backoff_ms: int = 20):
        self.c, self.world, self.name, self.md = cluster, cluster.world, name, md
        self.on_done = on_done
        self.batch_entries_max, self.read_timeout_ms = batch_entries_max, read_timeout_ms
        self.rounds_max, self.retry_backoff_ms = rounds_max, retry_backoff_ms
        self.ids = itertools.count(1)
        self.ordinals = itertools.count()
        self.next_entry = 0
        self.error = None
        self.done = False
        self.failovers = 0
        self._pending: tuple[int, str, int, int] | None = None  # request, bookie, first, last
        self.world.nodes[name] = self

    # -- chunks ---------------------------------------------------------------------------
    def start(self) -> None:
        self._next_chunk()

    def _next_chunk(self) -> None:
        if self.next_entry > self.md.last_entry_id:
            self._finish(None)
            return
        self.first = self.next_entry
        self.last = chunk_last(self.md, self.first, self.md.last_entry_id,
                               self.batch_entries_max)
        self.ordinal = next(self.ordinals)
        self.tries: dict[str, int] = {}
        self.suspects: set[str] = set()
        self.codes: list[int] = []
        self.answers: list[str] = []
        self._ask()

    def _ask(self) -> None:
        if self.done:
            return
        write_set = self.md.write_set(self.first)
        run_lens = {b: run_len(self.md, b, self.first) for b in write_set}
        choice = replicas_to_ask(write_set, self.ordinal, run_lens, self.tries, self.suspects,
                                 self.rounds_max)
        if choice is None:
            self._finish(no_replica_error(self.md.ledger_id, self.first, self.codes,
                                          self.answers))
            return
        bookie = choice[0]
        last = min(self.last, self.first + run_lens[bookie] - 1)
        request_id = next(self.ids)
        self._pending = (request_id, bookie, self.first, last)
        self.world.net.send(self.name, bookie, ev.SendReadBatch(
            request_id, bookie, self.md.ledger_id, self.first, last, self.c.master_key))
        self.world.schedule(self.read_timeout_ms, self._timeout, request_id)

    # -- replies and failures -------------------------------------------------------------
    def receive(self, src: str, msg) -> None:
        pending = self._pending
        if self.done or pending is None or type(msg) is not ev.ReadBatchResponse \
                or msg.request_id != pending[0]:
            return  # late, duplicated or not ours
        self._pending = None
        _, bookie, first, _ = pending
        ok = list(itertools.takewhile(lambda row: row[1] == OK,
                                      zip(msg.entry_ids, msg.codes, msg.datas, strict=True)))
        verified, _ = verify_run([data for _, _, data in ok], self.c.digest,
                                 self.md.ledger_id, first)
        if verified:
            self.c.checker.on_read(self.name, first, verified)
            self.next_entry = first + len(verified)
            self._next_chunk()  # the rest of a chunk answered in part is a new chunk
            return
        if len(verified) < len(ok):
            code = DigestMismatchError.code
        else:
            code = msg.code if msg.code != OK else (msg.codes[0] if msg.codes else OK)
        self._failed(bookie, code, f"{bookie}: code {code}")

    def _timeout(self, request_id: int) -> None:
        pending = self._pending
        if self.done or pending is None or pending[0] != request_id:
            return
        self._pending = None
        self.suspects.add(pending[1])
        self._failed(pending[1], BKTimeoutError.code, f"{pending[1]}: timeout")

    def _failed(self, bookie: str, code: int, answer: str) -> None:
        self.failovers += 1
        self.codes.append(code)
        self.answers.append(answer)
        self.tries, round_over = tries_after_failure(self.md.write_set(self.first), self.tries,
                                                     bookie, self.rounds_max)
        if round_over:
            self.world.schedule(self.retry_backoff_ms, self._ask)
        else:
            self._ask()

    def _finish(self, error) -> None:
        self.done, self.error = True, error
        self.on_done(self)
