"""The client driver's metadata worker pool: the blocking metadata store
calls, made off the driver thread.

The store blocks (a file lock, a network round trip); the driver thread
never waits on it, except to look up a bookie it has not reached yet
(``read_bookies``, from the driver's ``_ensure_bookie``).  So:

* ``WriteMetadata`` / ``ReadMetadata`` -> the ledger store, on a pool
  thread; the outcome comes back to the driver thread as the core event
  (``MetadataWritten`` / ``MetadataRead``) through its queue, every failure
  as a code the core understands (an unexpected one logged with its trace);
* the registry refresh: ``refresh_bookies`` reads the live bookies on a
  pool thread and queues them for the driver thread (a failed read is
  logged and skipped: the driver keeps its last view).

Limits: ``workers`` threads (``driver.METADATA_WORKERS``); the work they queue is bounded by the
cores' outstanding metadata requests (one per ledger being created, opened,
closed or changed) and one refresh per ``driver.BOOKIE_REFRESH_MS``.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

from appliance.errors import OK, BKError, code_of
from appliance.protocol import events as ev

# The driver's logger: these lines were always the driver's, and log
# configurations and tests name it.
log = logging.getLogger("appliance.client.driver")


class MetadataPool:
    """See the module docstring.  ``put``: the driver's queue, which takes
    ``("event", core, event)`` and ``("bookies", live)`` from any thread;
    ``workers``: the pool's threads (``driver.METADATA_WORKERS``)."""

    def __init__(self, ledgers, registry, put, workers: int):
        self.ledgers = ledgers
        self.registry = registry
        self._put = put
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="bk-metadata")

    def submit(self, core, action) -> None:
        """Carry out ``action`` (``WriteMetadata`` / ``ReadMetadata``) of
        ``core`` on a pool thread; its event is queued for the driver."""
        self._pool.submit(self._metadata_op, core, action)

    def refresh_bookies(self) -> None:
        """Re-read the live bookies on a pool thread, queued for the driver."""
        self._pool.submit(self._refresh)

    def read_bookies(self) -> dict | None:
        """The registry's live bookies now (this thread blocks), or ``None``
        when they cannot be listed (logged)."""
        try:
            return self.registry.available()
        except BKError as exc:
            log.warning("cannot list bookies: %s", exc)
            return None

    def shutdown(self) -> None:
        """Wait for the pool's calls to finish (their results are queued)."""
        self._pool.shutdown(wait=True)

    def _metadata_op(self, core, action) -> None:
        """On a pool thread: do the blocking store call, post the result."""
        try:
            if type(action) is ev.WriteMetadata:
                version = self.ledgers.write_ledger(action.metadata, action.expected_version)
                event = ev.MetadataWritten(action.request_id, action.ledger_id, OK, version)
            else:
                md, version = self.ledgers.read_ledger(action.ledger_id)
                event = ev.MetadataRead(action.request_id, action.ledger_id, OK, md, version)
        except Exception as exc:  # every failure becomes a code the core understands
            code = code_of(exc)
            if not isinstance(exc, BKError):
                log.exception("metadata operation failed")
            event = (ev.MetadataWritten(action.request_id, action.ledger_id, code)
                     if type(action) is ev.WriteMetadata
                     else ev.MetadataRead(action.request_id, action.ledger_id, code))
        self._put(("event", core, event))

    def _refresh(self) -> None:
        live = self.read_bookies()
        if live is not None:
            self._put(("bookies", live))
