"""One step for a bookie's reply to a message that carried the adds of many
ledgers (``ADD_MULTI``): the reply's rows split back to each ledger's
writer and applied there, in one call for the whole message instead of one
event, one core step and one action list per ledger.

A client writing many ledgers at once sends each bookie one message per
round trip with a few entries of each ledger (``appliance.client.outbound``);
its reply answers every entry of the message, in order, a row each (entry
id, status), naming no ledger.  ``apply_multi_reply`` is that reply's core
step: pure (no sockets, files, clocks or randomness), it reads nothing but
its arguments and the writers it is given.

Guarantees (checked by the simulation in ``tests/sim/multisim.py``):

* An ack is made only of a row naming the very entry of the very part:
  the rows answer the parts in the message's order, so a reply with
  another number of rows than the message had entries acknowledges
  nothing, and a part whose rows name other entry ids gets no ack either;
  each such part fails (``BadRequestError`` for each of its entries: the
  bookie is replaced, as for any refusal), never a false ack.
* Each writer sees its part exactly as an ``AddResponses`` for it would
  (``LedgerWriter.add_rows``: the same checks and the same results); a
  writer the caller no longer drives (``None``) is skipped.
* The actions come back per writer, only for the writers that made any,
  in the message's order (the writers' own order of actions kept).

Cost: O(rows) slicing and comparing, one call per part; nothing is made for
a part that only records acks (the first reply of a write quorum, the
trailing one of an entry acknowledged already).
"""

from __future__ import annotations

from collections.abc import Sequence

from appliance.protocol.errors import BadRequestError


def apply_multi_reply(writers: Sequence, heads: Sequence[tuple], row_ids: Sequence[int],
                      row_codes: Sequence[int], now_ms: int, *,
                      rows_checked: bool = True) -> list[tuple[object, list]]:
    """Apply one ``ADD_MULTI`` reply.  ``writers[i]`` (a ``LedgerWriter``, or
    ``None``: skipped) sent part ``heads[i]`` = (request id, bookie id,
    ledger id, entry ids) of the message; ``row_ids`` / ``row_codes``: the
    reply's rows in order.  Returns (writer, actions) for every writer that
    made actions.  ``rows_checked`` off (the simulation only) takes rows by
    position without matching them to the parts' entries: a broken rule
    the simulation's checker must catch."""
    sent = 0
    for head in heads:
        sent += len(head[3])
    whole = len(row_ids) == sent or not rows_checked
    out = []
    pos = 0
    for writer, head in zip(writers, heads, strict=True):
        request_id, bookie_id, ledger_id, entry_ids = head
        end = pos + len(entry_ids)
        if writer is not None:
            ids = tuple(row_ids[pos:end])
            if not rows_checked and len(ids) == len(entry_ids):
                codes = tuple(row_codes[pos:end])
            elif whole and ids == tuple(entry_ids):
                codes = tuple(row_codes[pos:end])
            else:  # not answered row for row: no ack (a refusal of each entry)
                codes = (BadRequestError.code,) * len(entry_ids)
            writer.add_rows(request_id, bookie_id, ledger_id, entry_ids, codes, now_ms)
            actions = writer.take_actions()
            if actions is not None:
                out.append((writer, actions))
        pos = end
    return out
