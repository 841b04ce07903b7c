"""What every client-side protocol core shares: an outbox of actions,
request/timer ids, and event dispatch.

Ids come from an injected iterator (``ids``), so a driver running many cores
can hand them one shared counter and route each reply by ``request_id`` to
the core that asked.  A core only trusts replies whose id it is waiting
for; the rest are stale and dropped (``stale_replies`` counts them).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from appliance.protocol import events as ev
from appliance.protocol.placement import HOST, Location, replace_positions


class CoreBase:
    """Base of ``LedgerWriter``, ``LedgerReader`` and ``LedgerRecovery``.

    Events are dispatched by type through a table of each class's methods,
    built once per class (``_handler_names``; a subclass adds its own kinds):
    a per-instance table of bound methods was nine more objects in every
    open handle for the garbage collector to scan."""

    _handler_names = {
        ev.AddResponse: "_on_add_response",
        ev.AddResponses: "_on_add_responses",
        ev.ReadResponse: "_on_read_response",
        ev.ReadLacResponse: "_on_read_lac_response",
        ev.MetadataWritten: "_on_metadata_written",
        ev.MetadataRead: "_on_metadata_read",
        ev.TimerFired: "_on_timer",
        ev.AvailableBookies: "_on_available_bookies",
    }
    _handler_fns: dict = {}  # event type -> function, from _handler_names

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls._handler_fns = _dispatch_table(cls)

    def __init__(self, ledger_id: int, ids: Iterator[int] | None):
        self.ledger_id = ledger_id
        self._ids = ids if ids is not None else itertools.count(1)
        self._out: list = []
        self.stale_replies = 0
        self.available_bookies: tuple[str, ...] = ()
        self.locations: dict[str, Location] = {}  # one entry per bookie ever located
        self.placement = HOST  # placement.PLACEMENT_MODES; the subclass's config sets it
        self.placement_degraded = 0  # replacements sharing a host with their write sets
        self.on_placement = None  # optional observer of each placement.Choice (tests, sim)

    # -- driver entry point ---------------------------------------------------
    def handle(self, event) -> list:
        """Apply one event; return the actions it causes."""
        handler = self._handler_fns.get(type(event))
        if handler is None:
            raise TypeError(f"{type(self).__name__} cannot handle {type(event).__name__}")
        handler(self, event)
        return self._take()

    def _take(self) -> list:
        out, self._out = self._out, []
        return out

    def take_actions(self) -> list | None:
        """The actions made since the last step (``None``: none, and no new
        list is made), for a step that drives several cores at once
        (``writer_multi``)."""
        out = self._out
        if not out:
            return None
        self._out = []
        return out

    def _next_id(self) -> int:
        return next(self._ids)

    def _timer(self, delay_ms: int) -> int:
        timer_id = next(self._ids)
        self._out.append(ev.SetTimer(timer_id, max(1, int(delay_ms))))
        return timer_id

    def _stale(self, _event=None) -> None:
        self.stale_replies += 1

    # -- default handlers: a core that never asked for this reply ignores it -
    _on_add_response = _stale
    _on_read_response = _stale
    _on_read_lac_response = _stale
    _on_metadata_written = _stale
    _on_metadata_read = _stale
    _on_timer = _stale

    def _on_add_responses(self, event: ev.AddResponses) -> None:
        """A batch of add replies: by default, one ``AddResponse`` each."""
        for entry_id, code in zip(event.entry_ids, event.codes, strict=True):
            self._on_add_response(ev.AddResponse(event.request_id, event.bookie_id,
                                                 event.ledger_id, entry_id, code, event.now_ms))

    def add_rows(self, request_id: int, bookie_id: str, ledger_id: int, entry_ids, codes,
                 now_ms: int) -> None:
        """Replies to adds of this core's ledger as plain values (a part of a
        multi-ledger reply, ``writer_multi``): as their ``AddResponses``."""
        self._on_add_responses(ev.AddResponses(request_id, bookie_id, ledger_id,
                                               tuple(entry_ids), tuple(codes), now_ms))

    def _on_available_bookies(self, event: ev.AvailableBookies) -> None:
        self.available_bookies = tuple(event.bookie_ids)
        if event.locations:
            self.locations.update(event.locations)

    # -- placement of replacements (appliance.protocol.placement) ------------------
    def replace_bookies(self, ensemble, write_quorum: int, positions, candidates):
        """``ensemble`` with ``positions`` replaced from ``candidates`` (in
        order of preference), host-aware; None when candidates run out."""
        return replace_positions(ensemble, write_quorum, positions, candidates, self.locations,
                                 self.placement, observe=self._placed)

    def _placed(self, choice) -> None:
        if choice.degraded:
            self.placement_degraded += 1
        if self.on_placement is not None:
            self.on_placement(choice)


def _dispatch_table(cls) -> dict:
    """Event type -> the function of ``cls`` that handles it."""
    return {kind: getattr(cls, name) for kind, name in cls._handler_names.items()}


CoreBase._handler_fns = _dispatch_table(CoreBase)
