"""BP-32 advisory write close, client side: the outcome of one close's
WRITE_CLOSE requests (one per bookie of the ledger's current ensemble).

Nothing waits for it: ``WriteHandle.close()`` has returned before the
requests leave, and their replies (or timeouts) only feed ``done`` here,
which logs once every bookie answered: succeeded (debug), partly succeeded
or failed (info: a bookie that was down, an older bookie that refuses the
op).  Counters (``succeeded``, ``partly``, ``failed``) are shared by every
outcome of one driver so tests and ``bkctl`` can see them.
"""

from __future__ import annotations

import logging

from appliance.errors import OK, BadRequestError, error_for_code
from ipc.replies import ErrorReply, WriteCloseReply

log = logging.getLogger(__name__)


def new_counters() -> dict[str, int]:
    return {"succeeded": 0, "partly": 0, "failed": 0}


class WriteCloseOutcome:
    def __init__(self, ledger_id: int, bookie_ids, counters: dict[str, int]):
        self.ledger_id = ledger_id
        self.waiting = set(bookie_ids)
        self.ok: list[str] = []
        self.failed: dict[str, str] = {}
        self.counters = counters

    def done(self, bookie_id: str, code: int) -> None:
        if bookie_id not in self.waiting:
            return
        self.waiting.discard(bookie_id)
        if code == OK:
            self.ok.append(bookie_id)
        else:
            self.failed[bookie_id] = type(error_for_code(code)).__name__
        if not self.waiting:
            self._report()

    def _report(self) -> None:
        if not self.failed:
            self.counters["succeeded"] += 1
            log.debug("write close of ledger %d succeeded on %s", self.ledger_id,
                      sorted(self.ok))
        elif self.ok:
            self.counters["partly"] += 1
            log.info("write close of ledger %d partly succeeded: ok on %s, not on %s",
                     self.ledger_id, sorted(self.ok), self.failed)
        else:
            self.counters["failed"] += 1
            log.info("write close of ledger %d failed on every bookie: %s", self.ledger_id,
                     self.failed)


def reply_code(status: int, reply) -> int:
    """The status of one WRITE_CLOSE transport event."""
    if status != OK:
        return status
    if isinstance(reply, ErrorReply):
        return reply.status
    return OK if isinstance(reply, WriteCloseReply) else BadRequestError.code
