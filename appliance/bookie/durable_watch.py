"""How the bookie's handler follows its storage's durability, and what it
does when the storage fails (a mixin of ``BookieHandler``).

* ``_on_durable`` (the storage's ``durable_fd`` became readable): every
  parked reply whose ticket is now durable is sent.
* ``storage_failed``: the storage stopped taking writes (a write error; a
  full disk).  What became durable before is acknowledged; every other
  parked reply is answered with an error (``ReadOnlyError`` for a full
  disk, else ``BookieIOError``), never acknowledged, and so is any reply
  that would park afterwards; then ``on_storage_failure`` decides (a full
  disk: read-only, ``appliance.bookie.full_disk``; else it raises and the
  bookie stops).
* ``detach_storage`` / ``attach_storage``: around ``LedgerStorage.reopen``;
  every parked reply is failed first, since the reopened journal's tickets
  start again from the last durable one.
"""

from __future__ import annotations

from appliance.errors import BookieIOError, ReadOnlyError
from ipc.replies import ErrorReply
from storage.aligned_io import out_of_space


class DurableWatch:
    """Mixin over ``self.storage``, ``self.server``, ``self._pending``,
    ``self.counters``, ``self.bookie_id``, ``self.on_storage_failure``,
    ``self._durable_fd``, ``self._storage_failure`` and ``_flush_adds``."""

    def attach_storage(self) -> None:
        """Watch the storage's durability descriptor (again, after a reopen)."""
        self._durable_fd = self.storage.durable_fd
        self._storage_failure = None
        self.server.watch_fd(self._durable_fd, self._on_durable)

    def detach_storage(self) -> None:
        """Before the storage is reopened: stop watching its descriptor and
        answer every parked reply with an error (their tickets belong to the
        old journal; none of them may ever be acknowledged)."""
        if self._durable_fd is not None:
            self.server.unwatch_fd(self._durable_fd)
            self._durable_fd = None
        self._flush_adds()
        self._fail_parked(self._pending.clear(), "the storage is being reopened")

    def storage_failed(self, exc: BaseException) -> None:
        """The storage stopped taking writes: what became durable before is
        acknowledged, every other parked reply is answered with an error
        (never acknowledged), then ``on_storage_failure(exc)`` decides (a
        full disk: read-only; anything else: it raises and the bookie stops)."""
        self._storage_failure = exc
        durable = self.storage.durable_ticket
        for peer, reply, _ in self._pending.release(durable):
            self.server.send_reply(peer, reply)
        self._fail_parked(self._pending.clear(), f"not durable: the storage failed ({exc})",
                          ReadOnlyError.code if out_of_space(exc) else BookieIOError.code)
        if self.on_storage_failure is None:
            raise exc
        self.on_storage_failure(exc)

    def _fail_parked(self, parked: list, why: str, code: int = ReadOnlyError.code) -> None:
        for peer, reply, _ in parked:
            self.counters["errors"] += 1
            op = getattr(reply, "OP", None) or reply.op  # LacReply and ErrorReply carry theirs
            self.server.send_reply(peer, ErrorReply(
                op=int(op), request_id=reply.request_id, status=code,
                ledger_id=getattr(reply, "ledger_id", 0), entry_id=getattr(reply, "entry_id", -1),
                message=f"bookie {self.bookie_id}: {why}; adds go to other bookies"))

    def _on_durable(self, clear_fd: bool = True) -> None:
        """Send every parked reply now durable; ``clear_fd`` false: called
        after an inline journal write (``durable_fd`` was not signalled)."""
        try:
            durable = self.storage.drain_durable(clear_fd)
        except BookieIOError as exc:  # the journal failed: see storage_failed
            self.storage_failed(self.storage.failure() or exc)
            return
        for peer, reply, _ in self._pending.release(durable):
            self.server.send_reply(peer, reply)
