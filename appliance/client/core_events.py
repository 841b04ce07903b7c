"""What the bookies' replies mean to the protocol cores, and how adds are cut
into wire messages (pure functions of the driver, ``appliance.client.driver``).

* ``chunks``: one action's entries cut at the batch limits;
* ``coalesced``: small add parts of several ledgers grouped for one
  ``ADD_MULTI`` (or ``ADD_BATCH``) message;
* ``translate`` / ``coalesced_events`` / ``failure_events``: a transport
  event -> the core events it means.  An ack is only ever made of a reply
  row naming the very entry: anything else fails the entry (a failure
  drives an ensemble change or a retry, never a false ack).
"""

from __future__ import annotations

from appliance.errors import OK, BadRequestError, BookieUnavailableError
from appliance.protocol import events as ev
from appliance.protocol.read_batch import PackedRecords
from ipc.packed import AddMultiReply, AddPackedReply, ReadPackedReply
from ipc.replies import AddBatchReply, ErrorReply, LacReply, ReadReply


def coalesced(parts: list, entries_max: int, bytes_max: int):
    """``parts`` ((core, SendAdd part, its entry bytes, ...) tuples) grouped
    for ``ADD_MULTI`` / ``ADD_BATCH``: one recovery flag per group, each within the entry
    and byte limits, in order."""
    group: list = []
    entries = nbytes = 0
    for item in parts:
        part, size = item[1], item[2]
        n = len(part.entry_ids)
        if group and (part.recovery != group[0][1].recovery or entries + n > entries_max
                      or nbytes + size > bytes_max):
            yield group
            group, entries, nbytes = [], 0, 0
        group.append(item)
        entries += n
        nbytes += size
    if group:
        yield group


def chunks(datas, entries_max: int, bytes_max: int):
    """(lo, hi) index ranges of ``datas``: each at most ``entries_max`` items
    and ``bytes_max`` bytes (a single bigger item travels alone)."""
    lo, size, n = 0, 0, len(datas)
    for i in range(n):
        length = len(datas[i])
        if i > lo and (i - lo >= entries_max or size + length > bytes_max):
            yield lo, i
            lo, size = i, 0
        size += length
    if n:
        yield lo, n


def add_head(part: ev.SendAdd) -> tuple:
    """What a reply to ``part`` needs of it, kept until the reply instead of
    the part: (request id, bookie id, ledger id, entry ids), ints, a str and
    a tuple of ints, which Python's garbage collector stops tracking (a kept
    ``SendAdd`` per bookie was most of what an add kept alive when every
    ledger sends an add or two at a time: each one promoted, and promotions
    trigger full collections).  ``translate`` and ``coalesced_events`` take
    either."""
    return part.request_id, part.bookie_id, part.ledger_id, part.entry_ids


def head_part(head: tuple) -> ev.SendAdd:
    """The ``SendAdd`` an ``add_head`` stands for, without its data (only
    its ids are read), for the rarer paths."""
    request_id, bookie_id, ledger_id, entry_ids = head
    return ev.SendAdd(request_id, bookie_id, ledger_id, entry_ids, (), False, b"")


def translate(action, event, now_ms: int) -> list:
    """A transport event -> the core events it means (``action``: the
    request's action, or an ``add_head``)."""
    reply = event.reply
    if type(action) is tuple:
        request_id, bookie_id, ledger_id, entry_ids = action
        if event.status == OK and type(reply) is AddPackedReply and \
                tuple(reply.entry_ids) == tuple(entry_ids):  # never ack what was not sent
            return [ev.AddResponses(request_id, bookie_id, ledger_id, entry_ids,
                                    tuple(reply.statuses), now_ms)]
        action = head_part(action)
    if event.status != OK or reply is None or isinstance(reply, ErrorReply):
        code = event.status if event.status != OK else reply.status
        return failure_events(action, code, now_ms)
    kind = type(action)
    if kind is ev.SendAdd and type(reply) is AddPackedReply:
        if len(reply.entry_ids) != len(action.entry_ids) or \
                list(reply.entry_ids) != list(action.entry_ids):  # never ack what was not sent
            return failure_events(action, BadRequestError.code, now_ms)
        return [ev.AddResponses(action.request_id, action.bookie_id, action.ledger_id,
                                action.entry_ids, tuple(reply.statuses), now_ms)]
    if kind is ev.SendReadBatch and type(reply) is ReadPackedReply:
        return [ev.ReadBatchResponse(action.request_id, action.bookie_id, action.ledger_id, OK,
                                     tuple(reply.entry_ids), tuple(reply.statuses),
                                     PackedRecords(reply.data, reply.lengths), now_ms)]
    if kind is ev.SendRead and isinstance(reply, ReadReply):
        return [ev.ReadResponse(action.request_id, action.bookie_id, action.ledger_id,
                                action.entry_id, OK, reply.data, now_ms)]
    if (kind is ev.SendReadLac or kind is ev.SendWaitLac) and isinstance(reply, LacReply):
        return [ev.ReadLacResponse(action.request_id, action.bookie_id, action.ledger_id, OK,
                                   reply.lac, now_ms)]
    return failure_events(action, BookieUnavailableError.code, now_ms)


def failure_events(action, code: int, now_ms: int) -> list:
    kind = type(action)
    if kind is ev.SendAdd:
        return [ev.AddResponse(action.request_id, action.bookie_id, action.ledger_id, e, code,
                               now_ms) for e in action.entry_ids]
    if kind is ev.SendReadBatch:
        return [ev.ReadBatchResponse(action.request_id, action.bookie_id, action.ledger_id,
                                     code, now_ms=now_ms)]
    if kind is ev.SendRead:
        return [ev.ReadResponse(action.request_id, action.bookie_id, action.ledger_id,
                                action.entry_id, code, None, now_ms)]
    if kind is ev.SendReadLac or kind is ev.SendWaitLac:
        return [ev.ReadLacResponse(action.request_id, action.bookie_id, action.ledger_id, code,
                                   -1, now_ms)]
    return []


def coalesced_events(cores: list, parts, event, now_ms: int) -> list:
    """(core, event) pairs for the parts (``parts[i]``, a SendAdd part of
    ``cores[i]``, or its ``add_head``) of one ``ADD_MULTI`` or ``ADD_BATCH``: each part's
    ``AddResponses`` from the reply's rows; a part the reply leaves an entry
    of out, or a failed message, fails (never an ack for what was not
    answered).  ``ADD_MULTI`` rows name no ledger: they answer the request's
    entries in order, so a reply of another length fails every part, and a
    row whose entry id differs fails its part."""
    reply = event.reply
    out = []
    if event.status == OK and type(reply) is AddMultiReply:
        heads = parts if type(parts) is tuple else [add_head(part) for part in parts]
        ids, statuses = reply.entry_ids, reply.statuses
        sent = sum(len(head[3]) for head in heads)
        whole = len(ids) == sent
        responses = ev.AddResponses
        pos = 0
        for core, head in zip(cores, heads, strict=True):
            request_id, bookie_id, ledger_id, entry_ids = head
            end = pos + len(entry_ids)
            if whole and tuple(ids[pos:end]) == tuple(entry_ids):  # (no copy of a tuple)
                out.append((core, responses(request_id, bookie_id, ledger_id, entry_ids,
                                            tuple(statuses[pos:end]), now_ms)))
            else:
                out += [(core, e) for e in failure_events(head_part(head), BadRequestError.code,
                                                          now_ms)]
            pos = end
        return out
    routed = zip(cores, [head_part(head) for head in parts] if type(parts) is tuple else parts,
                 strict=True)
    if event.status == OK and type(reply) is AddBatchReply:
        statuses = {(ledger_id, entry_id): st for ledger_id, entry_id, st in reply.rows}
        for core, part in routed:
            codes = tuple(statuses.get((part.ledger_id, e)) for e in part.entry_ids)
            if None in codes:
                events = failure_events(part, BadRequestError.code, now_ms)
            else:
                events = [ev.AddResponses(part.request_id, part.bookie_id, part.ledger_id,
                                          part.entry_ids, codes, now_ms)]
            out += [(core, e) for e in events]
        return out
    for core, part in routed:
        out += [(core, e) for e in translate(part, event, now_ms)]
    return out
