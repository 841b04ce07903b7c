"""Who may read a ledger from a bookie: the one rule, pure.

Every read a bookie serves (READ, READ_BATCH, READ_PACKED, READ_LAC,
WAIT_LAC; fencing or not) is first put to ``read_allowed``, by the real
bookie (``appliance.protocol.bookie.BookieCore``, which the bookie handler
runs) and by the simulation's bookies (the same core), so both refuse the
same reads.

The rule:

* the bookie does **not know** the ledger's key (it never stored an entry,
  a fence or a LAC of it with a key: a ledger it never saw, or one only
  fenced or put in limbo at boot): allowed; the read answers as it would
  have (no such ledger / entry, unknown, ...), so a reader learns nothing
  but that this bookie holds nothing readable of it;
* the bookie knows the key and the read carries **another** one:
  refused (``UnauthorizedError``), whatever ``reads_need_key`` says;
* the read carries **no** key: refused when ``reads_need_key`` (the
  appliance's default, ``server.reads_need_key``), allowed otherwise
  (BookKeeper's behaviour: reads are not authenticated);
* the same key: allowed.

Keys are compared in constant time.  No I/O, no clock: the caller looks the
stored key up.
"""

from __future__ import annotations

import hmac

from appliance.protocol.errors import OK, UnauthorizedError


def read_allowed(stored_key: bytes | None, read_key: bytes | None, *,
                 reads_need_key: bool = True) -> int:
    """``OK`` or ``UnauthorizedError.code`` for a read carrying ``read_key``
    (None: none) of a ledger whose key this bookie stores as ``stored_key``
    (None: it does not know it).  See the module docstring."""
    if stored_key is None:
        return OK
    if read_key is None or len(read_key) == 0:
        return UnauthorizedError.code if reads_need_key else OK
    if hmac.compare_digest(bytes(stored_key), bytes(read_key)):
        return OK
    return UnauthorizedError.code
