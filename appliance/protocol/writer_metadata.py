"""The writer's metadata loop: one operation at a time (an ensemble change
or the close), written by CAS over the version the writer knows; on a
conflict, a reread decides.

Guarantees: at most one ``WriteMetadata`` in flight (``_op``), and only its
replies count (others are stale).  After a conflict the reread decides:

* OPEN, with only bookies of sealed fragments changed (re-replication: those
  entries were acknowledged before the next fragment began): the metadata is
  adopted and the operation retried, at most ``metadata_retries_max`` times
  (then ``MetadataVersionError``; the store's own code when it could not be
  read at all);
* OPEN with any other change of its fragments (only this writer changes an
  OPEN ledger's last fragment): stop, ``MetadataVersionError``;
* CLOSED, met by the close: done, at its LAC (success) or elsewhere
  (``MetadataVersionError``);
* otherwise (IN_RECOVERY, or CLOSED by a recovery): fenced,
  ``LedgerFencedError``.

A CLOSED ledger read back never ends below the writer's LAC
(``no-divergence``, checked in place).

State owned here: ``_op``, and with the operations it completes, the
metadata view ``_md`` and its ``_version``.
"""

from __future__ import annotations

from appliance.protocol import events as ev
from appliance.protocol.core import CoreBase
from appliance.protocol.errors import OK, LedgerFencedError, MetadataVersionError
from appliance.protocol.invariant import invariant
from appliance.protocol.metadata import CLOSED, OPEN, LedgerMetadata
from appliance.protocol.writer_states import CLOSING, FAILED, FENCED, OPEN_STATE


class MetadataOp:
    """One in-flight metadata operation (ensemble change or close)."""

    __slots__ = ("kind", "write_id", "read_id", "metadata", "replaced", "tries")

    def __init__(self, kind: str, write_id: int, metadata: LedgerMetadata,
                 replaced: frozenset = frozenset(), tries: int = 0):
        self.kind = kind
        self.write_id = write_id
        self.read_id: int | None = None
        self.metadata = metadata
        self.replaced = replaced
        self.tries = tries


class WriterMetadataLoop(CoreBase):
    """The metadata part of ``LedgerWriter`` (see the module docstring)."""

    def _write_metadata(self, kind: str, new_md: LedgerMetadata, replaced: frozenset,
                        tries: int) -> None:
        op = MetadataOp(kind, self._next_id(), new_md, replaced, tries)
        self._op = op
        self._out.append(ev.WriteMetadata(op.write_id, self.ledger_id, new_md, self._version))

    def _on_metadata_written(self, event: ev.MetadataWritten) -> None:
        op = self._op
        if op is None or event.request_id != op.write_id:
            self._stale()
            return
        if event.code != OK:  # conflict (or store error): reread, then decide
            op.read_id = self._next_id()
            self._out.append(ev.ReadMetadata(op.read_id, self.ledger_id))
            return
        self._op = None
        if op.kind == "close":
            self._md, self._version = op.metadata, event.version
            self._closed_by_us(OK)
        elif self._state in (OPEN_STATE, CLOSING):
            self._apply_ensemble_change(op, event.version, event.now_ms)
        else:  # stopped meanwhile: keep the metadata view exact all the same
            self._md, self._version = op.metadata, event.version

    def _on_metadata_read(self, event: ev.MetadataRead) -> None:
        op = self._op
        if op is None or event.request_id != op.read_id:
            self._stale()
            return
        self._op = None
        md = event.metadata
        if event.code != OK or md is None:
            self._retry_or_stop(op, event)
            return
        invariant(md.state != CLOSED or md.last_entry_id >= self.last_add_confirmed,
                  "ledger %d: closed at %d below the writer's LAC %d", self.ledger_id,
                  md.last_entry_id, self.last_add_confirmed, rule="no-divergence")
        if md.state == OPEN and md.ensembles != self._md.ensembles \
                and not self._md.sealed_bookies_replaced(md):
            # only this writer changes an OPEN ledger's last fragment: someone is meddling
            self._stop(FENCED, MetadataVersionError.code)
        elif md.state == OPEN:
            # re-replication may have re-pointed a sealed fragment (its entries are all
            # acknowledged): adopt it, so the retried change or close keeps it
            self._md, self._version = md, event.version
            self._retry_or_stop(op, event)
        elif op.kind == "close" and md.state == CLOSED:
            self._md, self._version = md, event.version
            same = md.last_entry_id == self.last_add_confirmed
            self._closed_by_us(OK if same else MetadataVersionError.code)
        else:  # IN_RECOVERY or CLOSED by a recovery: this writer was fenced
            self._md, self._version = md, event.version
            self._stop(FENCED, LedgerFencedError.code)

    def _retry_or_stop(self, op: MetadataOp, event: ev.MetadataRead) -> None:
        if op.tries + 1 > self.config.metadata_retries_max:
            # the store's own error when it could not even be read (unreachable:
            # MetadataUnavailableError), else the conflicts that used every retry
            self._stop(FAILED, event.code if event.code != OK else MetadataVersionError.code)
        elif self._close_requested and op.kind == "close":
            self._start_close(op.tries + 1)
        elif self._close_requested:  # a change gave way to the close: it may wait (writer_heal)
            self._close_after_heal(event.now_ms)
        elif self._state == OPEN_STATE:
            self._start_ensemble_change(op.tries + 1)
