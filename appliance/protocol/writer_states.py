"""The states of a ``LedgerWriter``'s life, shared by the modules of the
writer (``writer``, ``writer_acks``, ``writer_timers``, ``writer_ensemble``,
``writer_close``, ``writer_metadata``).

* ``OPEN_STATE``: adds are made, sent and acknowledged; the LAC moves.
* ``CLOSING``: ``close()`` was called; the LAC is frozen, the close CAS is
  in flight (after the ensemble change in flight, if any).
* ``CLOSED_STATE``: this writer closed the ledger at its LAC.
* ``FENCED``: a recovery (or another writer's metadata) took the ledger over.
* ``FAILED``: the writer gave up (no spare bookie, metadata retries spent,
  unauthorised); ``close()`` may still close the ledger at its LAC.

Only ``OPEN_STATE`` makes and acknowledges entries; entering any other state
but ``CLOSING`` fails every add pending.  ``CLOSED_STATE`` and ``FENCED`` are
final.
"""

from __future__ import annotations

OPEN_STATE, CLOSING, CLOSED_STATE, FENCED, FAILED = "open", "closing", "closed", "fenced", "failed"

__all__ = ["OPEN_STATE", "CLOSING", "CLOSED_STATE", "FENCED", "FAILED"]
