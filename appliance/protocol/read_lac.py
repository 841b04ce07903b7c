"""LAC reads of the ledger reader (``appliance.protocol.reader``): a LAC read,
the LAC read of an open without recovery, and waiting for the LAC to pass a
value (READ_LAC polls, or WAIT_LAC long polls), split out to keep each
module small.

Guarantees: a round asks every bookie of the last fragment at once and is
decided at ``EC = E - Qa + 1`` answers (OK or "no such ledger"), so a
stalled bookie (one of E when Qa >= 2) never holds a LAC read up; it fails
once more than ``E - EC`` bookies failed.  A long poll is done as soon as
one bookie answers past the mark.  The reader's LAC only grows.

State owned here: ``_lac_requests`` (id -> op, when it counts as sent) and
``_poll_timers``; the tick that expires requests is the reader's.
"""

from __future__ import annotations

from appliance.protocol import events as ev
from appliance.protocol.core import CoreBase
from appliance.protocol.errors import OK, BKTimeoutError, is_explicit_negative
from appliance.protocol.quorum import ensemble_coverage


class _LacOp:
    __slots__ = ("read_id", "purpose", "answered", "errors", "last_error", "above",
                 "deadline_ms", "round_open", "negatives")

    def __init__(self, read_id: int, purpose: str, above: int | None, deadline_ms: int | None):
        self.read_id = read_id
        self.purpose = purpose  # "open", "read" or "wait"
        self.answered = 0  # OK or explicit-negative replies this round
        self.negatives = 0  # of which explicit negatives (the bookie has no such ledger)
        self.errors = 0
        self.last_error = BKTimeoutError.code
        self.above, self.deadline_ms = above, deadline_ms
        self.round_open = False


class LacReads(CoreBase):
    """The LAC part of ``LedgerReader`` (see the module docstring)."""

    def read_lac(self, now_ms: int, read_id: int | None = None) -> list:
        """Ask the last fragment's bookies; ``LacRead`` carries the result."""
        self._start_lac("read", None, None, read_id, now_ms)
        return self._take()

    def wait_for_lac(self, above: int, timeout_ms: int, now_ms: int,
                     read_id: int | None = None) -> list:
        """``LacRead`` once the LAC exceeds ``above`` (code OK), or after
        ``timeout_ms`` (code ``BKTimeoutError``, with the LAC known then)."""
        if self.last_add_confirmed > above or self.is_closed:
            rid = read_id if read_id is not None else self._next_id()
            self._out.append(ev.LacRead(rid, self.ledger_id, OK, self.last_add_confirmed))
        else:
            self._start_lac("wait", above, now_ms + timeout_ms, read_id, now_ms)
        return self._take()

    def _start_lac(self, purpose: str, above: int | None, deadline_ms: int | None,
                   read_id: int | None, now_ms: int) -> None:
        op = _LacOp(read_id if read_id is not None else self._next_id(), purpose, above,
                    deadline_ms)
        self._send_lac_round(op, now_ms)

    def _send_lac_round(self, op: _LacOp, now_ms: int) -> None:
        op.answered = op.errors = op.negatives = 0
        op.last_error = BKTimeoutError.code
        op.round_open = True
        long_poll = op.purpose == "wait" and self.config.long_poll
        wait_ms = max(1, op.deadline_ms - now_ms) if long_poll else 0
        for bookie in self._md.last_fragment[1]:
            request_id = self._next_id()
            # a long poll counts as failed only a read timeout after its own
            self._lac_requests[request_id] = (op, now_ms + wait_ms)
            if long_poll:
                self._out.append(ev.SendWaitLac(request_id, bookie, self.ledger_id, op.above,
                                                wait_ms, self._key))
            else:
                self._out.append(ev.SendReadLac(request_id, bookie, self.ledger_id, False,
                                                self._key))
        self._arm_tick()

    def _on_read_lac_response(self, event: ev.ReadLacResponse) -> None:
        found = self._lac_requests.pop(event.request_id, None)
        if found is None:
            self._stale()
            return
        op = found[0]
        if event.code == OK:
            self._raise_lac(event.lac)
            op.answered += 1
            if op.purpose == "wait" and self.config.long_poll and op.round_open \
                    and self.last_add_confirmed > op.above:
                op.round_open = False  # one bookie past the mark is enough
                self._drop_lac_requests(op)
                self._lac_round_done(op, OK, event.now_ms)
                return
        elif is_explicit_negative(event.code):
            op.answered += 1  # this bookie has nothing of the ledger: LAC -1
            op.negatives += 1
        else:
            op.errors += 1
            op.last_error = event.code
        self._check_lac_round(op, event.now_ms)

    def _check_lac_round(self, op: _LacOp, now_ms: int) -> None:
        size = self._md.ensemble_size
        coverage = ensemble_coverage(size, self._md.ack_quorum)
        if not op.round_open:
            return
        if op.answered >= coverage:
            code = OK
        elif op.errors > size - coverage:
            code = op.last_error
        else:
            return
        op.round_open = False
        self._drop_lac_requests(op)
        self._lac_round_done(op, code, now_ms)

    def _lac_round_done(self, op: _LacOp, code: int, now_ms: int) -> None:
        lac = self.last_add_confirmed
        if op.purpose == "open":
            self._out.append(ev.OpenDone(self.ledger_id, code, lac, self._md))
        elif op.purpose == "read":
            self._out.append(ev.LacRead(op.read_id, self.ledger_id, code, lac))
        elif lac > op.above or self.is_closed:
            self._out.append(ev.LacRead(op.read_id, self.ledger_id, OK, lac))
        elif now_ms >= op.deadline_ms:
            self._out.append(ev.LacRead(op.read_id, self.ledger_id, BKTimeoutError.code, lac))
        elif self.config.long_poll and code == OK and not op.negatives:
            self._send_lac_round(op, now_ms)  # the bookies answered at their timeout: again
        else:
            delay_ms = min(self.config.lac_poll_interval_ms, op.deadline_ms - now_ms)
            self._poll_timers[self._timer(delay_ms)] = op

    def _drop_lac_requests(self, op: _LacOp) -> None:
        for request_id in [r for r, found in self._lac_requests.items() if found[0] is op]:
            del self._lac_requests[request_id]
