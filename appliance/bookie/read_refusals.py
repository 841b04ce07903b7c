"""Refused reads of a bookie: counted, and logged without flooding the log.

A read refused for its key (``appliance.protocol.read_access``: a wrong key,
or none while ``server.reads_need_key``) is counted every time
(``reads_refused`` in INFO's counters and ``bookkeeper_bookie_reads_refused``
in the metrics; READ / READ_BATCH / READ_PACKED refusals also show in
``bookkeeper_bookie_read_entries{code="UnauthorizedError"}``), and logged
at most once per ledger per ``interval_s``: a client retrying a refused
read in a loop costs one warning a minute, with the number of refusals it
left unlogged.  Memory is bounded: the last ``ledgers_max`` ledgers
refused are remembered (the oldest forgotten first).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict

from appliance.protocol import limits

log = logging.getLogger("appliance.bookie")

REFUSAL_LOG_INTERVAL_S = 60.0


class ReadRefusals:
    """Counts refusals; ``refused`` logs one at most once per ledger per interval."""

    def __init__(self, bookie_id: str, *, interval_s: float = REFUSAL_LOG_INTERVAL_S,
                 ledgers_max: int = limits.BOOKIE_REFUSAL_LEDGERS_MAX, clock=time.monotonic):
        if interval_s < 0 or ledgers_max < 1:
            raise ValueError("interval_s must be >= 0 and ledgers_max >= 1")
        self.bookie_id = bookie_id
        self.interval_s, self.ledgers_max, self._clock = interval_s, ledgers_max, clock
        self.total = 0
        self.logged = 0
        self._seen: OrderedDict[int, list] = OrderedDict()  # ledger -> [logged at, unlogged]

    def refused(self, ledger_id: int, op: str, had_key: bool, peer: bytes) -> bool:
        """Count one refusal; True if it was logged."""
        self.total += 1
        now = self._clock()
        seen = self._seen.get(ledger_id)
        if seen is not None and now - seen[0] < self.interval_s:
            seen[1] += 1
            return False
        unlogged = seen[1] if seen is not None else 0
        self._seen[ledger_id] = [now, 0]
        self._seen.move_to_end(ledger_id)
        while len(self._seen) > self.ledgers_max:
            self._seen.popitem(last=False)
        self.logged += 1
        why = "a wrong master key" if had_key else "no master key (server.reads_need_key)"
        log.warning("%s refused %s of ledger %d from %s: %s%s", self.bookie_id, op, ledger_id,
                    peer.decode("utf-8", "replace"), why,
                    f" ({unlogged} more refused since the last line)" if unlogged else "")
        return True
