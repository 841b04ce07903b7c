"""The durable-reply rule: a bookie answers a request only once the storage
ticket the answer depends on is durable.

Every bookie the project runs uses this one class: the real bookie
(``appliance.bookie.handler``: tickets from the journal's group commit), the
in-memory bookie (``ipc.memserver`` with ``defer_acks``) and the simulated
bookie (``tests/sim/nodes.py``), whose invariants (no acknowledged entry is
lost; nothing is acknowledged after fencing) therefore check the product's
rule, not a copy of it.

Guarantees:

* ``hold(ticket, durable_ticket, reply)`` says "send now" only when
  ``ticket <= durable_ticket``; otherwise the reply is parked.
* ``release(durable_ticket)`` returns every parked reply whose ticket is at
  or below ``durable_ticket``, in ticket order (arrival order among equal
  tickets), and keeps the rest.
* ``Protections.durable_reply`` off (the simulation only) sends every reply
  at once: the checker must then find acknowledged entries lost in crashes.
* At most ``parked_max`` replies wait; one more raises
  ``TooManyRequestsError`` (the request is refused, never silently dropped),
  which bounds a bookie's memory while its journal is slow.

Tickets are whatever the storage hands out: increasing integers, where
"ticket t is durable" means every change made before it is on disk.  A
ticket of 0 (or below) never waits.  Pure: no clocks, sockets or files.
"""

from __future__ import annotations

import heapq
import itertools

from appliance.protocol.errors import TooManyRequestsError
from appliance.protocol.quorum import ALL_PROTECTIONS, Protections


class DurableReplies:
    """Replies parked until their ticket is durable (a heap on the ticket)."""

    __slots__ = ("parked_max", "_wait", "_heap", "_seq")

    def __init__(self, parked_max: int, *, protections: Protections = ALL_PROTECTIONS):
        if parked_max < 1:
            raise ValueError(f"parked_max must be >= 1, got {parked_max}")
        self.parked_max = parked_max
        self._wait = protections.durable_reply
        self._heap: list = []  # (ticket, arrival, reply)
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def hold(self, ticket: int, durable_ticket: int, reply) -> bool:
        """True: ``reply`` may go now.  False: it is parked until
        ``release`` reaches ``ticket``."""
        if ticket <= durable_ticket or not self._wait:
            return True
        if len(self._heap) >= self.parked_max:
            raise TooManyRequestsError(
                f"more than {self.parked_max} replies wait for the journal")
        heapq.heappush(self._heap, (ticket, next(self._seq), reply))
        return False

    def release(self, durable_ticket: int) -> list:
        """The parked replies now durable, in ticket order; the rest stay."""
        heap, out = self._heap, []
        while heap and heap[0][0] <= durable_ticket:
            out.append(heapq.heappop(heap)[2])
        return out

    def clear(self) -> list:
        """Forget every parked reply (a crash: none of them may be sent);
        returns them."""
        out = [item[2] for item in sorted(self._heap)]
        self._heap.clear()
        return out
