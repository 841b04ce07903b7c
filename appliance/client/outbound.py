"""The client's outbound adds and explicit LACs: how the driver's ``SendAdd``
and ``SendWriteLac`` actions are batched and coalesced per bookie, and how
the replies to those messages get back to the cores.

Runs on the driver thread only (``appliance.client.driver``), which owns
an ``Outbound`` and calls it: ``add`` / ``write_lac`` as the cores' actions
arrive, ``flush_adds`` / ``flush_lacs`` at the end of every loop turn, and
``on_packed_reply`` / ``on_coalesced_reply`` / ``on_lac_multi_reply`` with
the replies.  It sends through the driver (``send``, ``send_routed``) and
answers cores through it (``feed``, ``fail_next_turn``); it never touches
the transport.  What it guarantees:

* ``SendAdd`` -> one ``ADD_PACKED`` per bookie and action, split at
  ``add_batch_entries_max`` / ``add_batch_bytes_max``: adds to one bookie
  travel batched, their bytes in one frame; small adds of several ledgers
  queued in one loop turn share an ``ADD_MULTI`` per bookie, their bytes in
  one frame too, or ``ADD_BATCH`` for a bookie that refused ``ADD_MULTI``
  as an unknown op: an older one; the reply to a ``SendAdd`` comes back as
  one ``AddResponses``;
* the hold: adds to a bookie that already has ``add_messages_inflight``
  add messages awaiting replies wait for one of those replies (at most
  ``add_linger_us``) and share the next message, if they come from a write
  handle's fresh batch (many ledgers, each with an add now and then: one
  message per bookie per round trip instead of one per add); resends,
  recovery writes, full messages and batches that already waited at their
  handle never wait;
* ``SendWriteLac`` (explicit LAC, best effort: replies are dropped) ->
  WRITE_LAC; those of several ledgers to one bookie in one loop turn (the
  idle writers of many ledgers) share a ``WRITE_LAC_MULTI``, or go one by
  one to a bookie that refused it as an unknown op (an older one);
* never a false ack: a reply is split back to each part by the entries it
  names (``core_events``), and an add message that cannot leave fails every
  part it carried, on the next loop turn.

Limits: a message carries at most ``add_batch_entries_max`` entries and
``add_batch_bytes_max`` bytes (``WRITE_LAC_MULTI``: that many rows); the
queued adds and LACs are this turn's (or a held bookie's, until its linger)
only.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from appliance.errors import OK, BadRequestError, BKError, BKTimeoutError, BookieUnavailableError
from appliance.protocol import events as ev
from appliance.protocol.writer_multi import apply_multi_reply
from ipc.packed import AddMultiReply, AddMultiRequest, AddPackedRequest
from ipc.replies import ErrorReply
from ipc.requests import AddBatchRequest, AddItem, WriteLacMultiRequest, WriteLacRequest

from .core_events import add_head, chunks, coalesced, coalesced_events, translate

# The driver's logger: these lines were always the driver's, and log
# configurations and tests name it.
log = logging.getLogger("appliance.client.driver")


def _no_op() -> None:
    """A deferred call that only ends the driver's wait (a hold's deadline)."""


class Outbound:
    """See the module docstring.  ``driver``: the ``Driver`` that owns it;
    only its ``send``, ``send_routed``, ``fail_next_turn``, ``feed``, ``run``,
    ``is_registered`` and ``call_later_s`` are used (bound once here).
    ``coalesced_route`` / ``lac_multi_route``: the driver's route markers
    for an ``ADD_MULTI`` / ``ADD_BATCH`` and a ``WRITE_LAC_MULTI``, whose
    replies it hands to ``on_coalesced_reply`` / ``on_lac_multi_reply``."""

    def __init__(self, driver, *, coalesced_route: object, lac_multi_route: object,
                 add_batch_entries_max: int, add_batch_bytes_max: int,
                 add_messages_inflight: int, add_linger_us: int):
        self._coalesced_route = coalesced_route
        self._lac_multi_route = lac_multi_route
        self._send = driver.send
        self._send_routed = driver.send_routed
        self._fail = driver.fail_next_turn
        self._feed = driver.feed
        self._run = driver.run
        self._is_registered = driver.is_registered
        self._call_later_s = driver.call_later_s
        self.add_batch_entries_max = add_batch_entries_max
        self.add_batch_bytes_max = add_batch_bytes_max
        self._packed_datas: tuple | None = None  # the last SendAdd's datas and their chunks
        self._packed: list = []
        self._adds_out: dict[str, list] = {}  # bookie -> (core, SendAdd part, lengths, data)
        self._multi_refused: set[str] = set()  # bookies that answered ADD_MULTI BadRequest
        self._multi_ok: set[str] = set()  # bookies that answered ADD_MULTI with its reply
        # The hold of adds per bookie (see the module docstring): add messages
        # awaiting their reply, when each bookie's held adds began to wait,
        # and the bookies with an add this turn that must not wait.
        self.add_messages_inflight = add_messages_inflight
        self.add_hold_s = add_linger_us / 1e6
        self._add_messages: dict[str, int] = {}
        self._held_since: dict[str, float] = {}
        self._adds_now: set[str] = set()
        self._lacs_out: dict[str, list] = {}  # bookie -> [(core, SendWriteLac)] this turn
        self._lac_multi_refused: set[str] = set()  # bookies that answered it BadRequest

    # -- adds -------------------------------------------------------------------
    def add(self, core, action: ev.SendAdd, holdable: bool = False) -> None:
        """Queue one part per chunk of at most ``add_batch_entries_max``
        entries / ``add_batch_bytes_max`` bytes, each routed (and, on failure,
        answered) as a ``SendAdd`` of its own entries; ``flush_adds`` sends
        them at the end of this loop turn.  A chunk's bytes are joined into
        one frame only if it travels as ``ADD_PACKED`` (once for every
        bookie of the write set); coalesced parts never need it.  Unless
        ``holdable``, this turn's adds to the bookie leave at its end."""
        if not holdable:
            self._adds_now.add(action.bookie_id)
        entry_ids, datas = action.entry_ids, action.datas
        if self._packed_datas is not datas:  # a writer sends one tuple to every bookie
            self._packed_datas = datas
            nbytes = sum(map(len, datas))
            if len(datas) <= self.add_batch_entries_max and nbytes <= self.add_batch_bytes_max:
                self._packed = [[0, len(datas), nbytes, None]]  # one chunk: the usual case
            else:
                self._packed = [[lo, hi, sum(map(len, datas[lo:hi])), None]
                                for lo, hi in chunks(datas, self.add_batch_entries_max,
                                                      self.add_batch_bytes_max)]
        out = self._adds_out.get(action.bookie_id)
        if out is None:
            out = self._adds_out[action.bookie_id] = []
        if len(self._packed) == 1:
            out.append((core, action, self._packed[0][2], self._packed[0]))
            return
        for chunk in self._packed:
            lo, hi = chunk[0], chunk[1]
            part = action if (lo, hi) == (0, len(datas)) else dataclasses.replace(
                action, entry_ids=entry_ids[lo:hi], datas=datas[lo:hi])
            out.append((core, part, chunk[2], chunk))

    def flush_adds(self) -> None:
        """End of a loop turn: send the adds queued for each bookie.  The
        parts of several ledgers (many ledgers written at once: a few
        entries each per turn) share ``ADD_MULTI`` messages up to
        ``add_batch_entries_max`` / ``add_batch_bytes_max``: one message
        with one data frame, one bookie storage block and one reply instead
        of one per ledger.  A bookie's only part, or one that fills a
        message by itself, goes alone as ``ADD_PACKED`` (its bytes joined
        once for every bookie of its write set).  A bookie's adds that may
        wait (``_held``) stay queued for the next turn."""
        if not self._adds_out:
            return
        out, self._adds_out = self._adds_out, {}
        now = time.monotonic()
        for bookie_id, parts in out.items():
            if self._held(bookie_id, parts, now):
                self._adds_out[bookie_id] = parts
                continue
            self._held_since.pop(bookie_id, None)
            self._adds_now.discard(bookie_id)
            if len(parts) == 1:
                self._send_packed(parts[0])
                continue
            for group in coalesced(parts, self.add_batch_entries_max, self.add_batch_bytes_max):
                self._send_coalesced(bookie_id, group)

    def _held(self, bookie_id: str, parts: list, now: float) -> bool:
        """Whether ``parts``, this turn's adds to ``bookie_id``, wait for a
        reply from it: only if every one may wait, the bookie already has
        ``add_messages_inflight`` add messages awaiting replies, they began
        to wait less than ``add_linger_us`` ago (a deferred no-op wakes the
        loop then) and they do not fill a message.  A reply of the bookie
        lowers its count and so ends the wait at the end of that turn."""
        limit = self.add_messages_inflight
        if not limit or bookie_id in self._adds_now or \
                self._add_messages.get(bookie_id, 0) < limit:
            return False
        since = self._held_since.get(bookie_id)
        if since is None:
            since = self._held_since[bookie_id] = now
            self._call_later_s(self.add_hold_s, _no_op)
        if now - since >= self.add_hold_s:
            return False
        entries = nbytes = 0
        for item in parts:
            entries += len(item[1].entry_ids)
            nbytes += item[2]
        return entries < self.add_batch_entries_max and nbytes < self.add_batch_bytes_max

    def _send_packed(self, item: tuple) -> None:
        """One part as ``ADD_PACKED``: its chunk's bytes joined once."""
        core, part, _nbytes, chunk = item
        if chunk[3] is None:
            chunk[3] = (list(map(len, part.datas)), b"".join(part.datas))
        lengths, data = chunk[3]
        rid = self._send(core, part, AddPackedRequest(part.ledger_id, part.master_key,
                                                      part.entry_ids, lengths, data,
                                                      part.recovery),
                         route=add_head(part))
        if rid is not None:  # an ADD_PACKED awaiting its reply
            bookie_id = part.bookie_id
            self._add_messages[bookie_id] = self._add_messages.get(bookie_id, 0) + 1

    def _send_coalesced(self, bookie_id: str, group: list) -> None:
        if len(group) == 1:
            self._send_packed(group[0])
            return
        self._send_multi(bookie_id, [item[0] for item in group], [item[1] for item in group])

    def _send_multi(self, bookie_id: str, cores: list, parts: list) -> None:
        """Several parts (``parts[i]``, a SendAdd of ``cores[i]``) to one
        bookie in one message: ``ADD_MULTI`` (every entry's bytes in one
        frame), or ``ADD_BATCH`` (a frame per entry) to a bookie that refused
        ``ADD_MULTI``.  The route keeps the cores and, once the bookie is known
        to take ``ADD_MULTI``, only the parts' ``add_head``s (before that the
        parts, for the ``ADD_BATCH`` fallback): what an add keeps alive until
        its reply is what the garbage collector promotes and later scans."""
        recovery = parts[0].recovery
        multi = bookie_id not in self._multi_refused
        if multi:
            groups, entry_ids, datas = [], [], []
            for part in parts:
                groups.append((part.ledger_id, part.master_key, len(part.entry_ids)))
                entry_ids += part.entry_ids
                datas += part.datas
            request = AddMultiRequest(groups, entry_ids, list(map(len, datas)),
                                      b"".join(datas), recovery)
        else:
            request = AddBatchRequest([AddItem(part.ledger_id, e, part.master_key, d)
                                       for part in parts
                                       for e, d in zip(part.entry_ids, part.datas, strict=True)],
                                      recovery)
        kept = parts
        if not multi or bookie_id in self._multi_ok:  # no ADD_BATCH fallback needed
            kept = tuple(add_head(part) for part in parts)
        try:
            self._send_routed(bookie_id, request,
                              (self._coalesced_route, (bookie_id, cores, kept, multi)))
        except (BKError, ValueError) as exc:
            code = exc.code if isinstance(exc, BKError) else BookieUnavailableError.code
            for core, part in zip(cores, parts, strict=True):
                self._fail(core, part, code)
            return
        self._add_messages[bookie_id] = self._add_messages.get(bookie_id, 0) + 1

    # -- replies to adds --------------------------------------------------------
    def on_packed_reply(self, core, head: tuple, event, now: int) -> None:
        """The reply (or failure) of an ``ADD_PACKED``, routed by its
        ``add_head``: the bookie has one add message less awaiting a reply."""
        self._add_messages[head[1]] -= 1
        for core_event in translate(head, event, now):
            self._feed(core, core_event)

    def on_coalesced_reply(self, sent: tuple, event, now: int) -> None:
        """An ``ADD_MULTI`` / ``ADD_BATCH`` reply split back into each part's
        ``AddResponses``.  A bookie that answers ``ADD_MULTI`` as a bad
        request (one from before the op: nothing of it was stored) gets the
        parts again as ``ADD_BATCH``, and ``ADD_BATCH`` from then on.  Once a
        bookie has answered ``ADD_MULTI`` the route keeps only the parts'
        ``add_head``s; should it refuse one later (replaced by an older
        version), those parts count as unanswered and the writers' timeouts
        resend them, as ``ADD_BATCH``."""
        bookie_id, cores, parts, multi = sent
        self._add_messages[bookie_id] -= 1
        reply = event.reply
        if multi and type(reply) is ErrorReply and reply.status == BadRequestError.code:
            log.info("bookie %s refused ADD_MULTI (%s): sending it ADD_BATCH", bookie_id,
                     reply.message)
            self._multi_refused.add(bookie_id)
            self._multi_ok.discard(bookie_id)
            if type(parts) is list:  # the parts themselves: send them again now
                self._send_multi(bookie_id, cores, parts)
                return
            event = dataclasses.replace(event, status=BKTimeoutError.code, reply=None)
        elif multi and type(reply) is AddMultiReply:
            self._multi_ok.add(bookie_id)
            if event.status == OK:  # the usual case: one core step for every ledger
                self._apply_multi(cores, parts, reply, now)
                return
        for core, core_event in coalesced_events(cores, parts, event, now):
            self._feed(core, core_event)

    def _apply_multi(self, cores: list, parts, reply: AddMultiReply, now: int) -> None:
        """An ``ADD_MULTI`` reply applied to every part's writer in one step
        (``writer_multi``): no event and no core step per part; only the
        writers that made actions (acks complete, a ledger stops, ...) have
        them carried out.  A handle closed meanwhile is skipped."""
        heads = parts if type(parts) is tuple else [add_head(part) for part in parts]
        is_registered = self._is_registered
        writers = [core if is_registered(core) else None for core in cores]
        run = self._run
        for core, actions in apply_multi_reply(writers, heads, reply.entry_ids, reply.statuses,
                                               now):
            run(core, actions)

    # -- explicit LACs ----------------------------------------------------------
    def write_lac(self, core, action: ev.SendWriteLac) -> None:
        """Queue an explicit LAC; ``flush_lacs`` sends it at the end of this
        loop turn (best effort: its reply, or none, is dropped)."""
        lacs = self._lacs_out.get(action.bookie_id)
        if lacs is None:
            lacs = self._lacs_out[action.bookie_id] = []
        lacs.append((core, action))

    def flush_lacs(self) -> None:
        """End of a loop turn: send the explicit LACs queued for each bookie;
        those of several ledgers share ``WRITE_LAC_MULTI`` messages of up to
        ``add_batch_entries_max`` rows (each ledger's writer ticks on its
        own timer, so many idle ledgers' LACs fall in the same turns)."""
        if not self._lacs_out:
            return
        out, self._lacs_out = self._lacs_out, {}
        step = self.add_batch_entries_max
        for bookie_id, items in out.items():
            if len(items) == 1 or bookie_id in self._lac_multi_refused:
                for core, action in items:
                    self._send_write_lac(core, action)
                continue
            for lo in range(0, len(items), step):
                self._send_lac_multi(bookie_id, items[lo:lo + step])

    def _send_write_lac(self, core, action: ev.SendWriteLac) -> None:
        self._send(core, action, WriteLacRequest(action.ledger_id, action.lac,
                                                 action.master_key))

    def _send_lac_multi(self, bookie_id: str, items: list) -> None:
        request = WriteLacMultiRequest([(action.ledger_id, action.lac, action.master_key)
                                        for _, action in items])
        try:
            self._send_routed(bookie_id, request, (self._lac_multi_route, (bookie_id, items)))
        except (BKError, ValueError) as exc:  # best effort, as a WRITE_LAC's failure
            log.debug("cannot send WRITE_LAC_MULTI to %s: %s", bookie_id, exc)

    def on_lac_multi_reply(self, sent: tuple, event) -> None:
        """A ``WRITE_LAC_MULTI`` reply: dropped, as a WRITE_LAC's, unless the
        bookie refused the op as a bad request (one from before it: it kept
        nothing); then its LACs go again one by one, and from then on."""
        bookie_id, items = sent
        reply = event.reply
        if type(reply) is ErrorReply and reply.status == BadRequestError.code \
                and bookie_id not in self._lac_multi_refused:
            log.info("bookie %s refused WRITE_LAC_MULTI (%s): sending it WRITE_LAC",
                     bookie_id, reply.message)
            self._lac_multi_refused.add(bookie_id)
            for core, action in items:
                if self._is_registered(core):  # a closed handle's LAC no longer matters
                    self._send_write_lac(core, action)
