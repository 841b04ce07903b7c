"""Catch-up reads through the client binding against real bookie processes:
``ReadHandle.read`` keeps the next range in flight between calls (read-ahead)
and must still return exactly the entries asked for, whatever order the
caller asks in; entries are immutable named tuples."""

from __future__ import annotations

import pytest

from appliance.client.calls import Entry
from appliance.errors import NoSuchEntryError

PW = b"secret"


def test_consecutive_and_jumping_reads_return_exactly_what_was_asked(client):
    lh = client.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, password=PW)
    payloads = [b"%d-" % i * (1 + i % 7) for i in range(3500)]  # lengths vary in a reply
    futures = [lh.add_async(p) for p in payloads]
    assert [f.result(timeout=60) for f in futures] == list(range(3500))
    lh.close()
    rh = client.open_ledger(lh.id, password=PW)
    asked = [(0, 999), (1000, 1999), (2000, 2999),   # consecutive: served by read-ahead
             (500, 700), (701, 901), (0, 0),           # jumps abandon the read ahead
             (3000, 3499), (2500, 3499), (1, 2500)]    # the end (no read-ahead past it)
    for first, last in asked:
        got = rh.read(first, last)
        assert [e.entry_id for e in got] == list(range(first, last + 1))
        assert [e.payload for e in got] == payloads[first:last + 1]
        assert all(type(e) is Entry and e.ledger_id == lh.id and type(e.payload) is bytes
                   for e in got)
    e = rh.read(7, 7)[0]
    assert e == Entry(lh.id, 7, payloads[7]) and isinstance(e.payload, bytes)
    with pytest.raises(AttributeError):
        e.payload = b"other"
    with pytest.raises(NoSuchEntryError):
        rh.read(3000, 3500)
    rh.close()


def _joined(chunks) -> tuple[list[int], list[bytes]]:
    ids, out = [], []
    for c in chunks:
        ids.extend(range(c.first_entry_id, c.first_entry_id + c.count))
        data = bytes(c.payloads)
        out.extend(data[c.offsets[i]:c.offsets[i + 1]] for i in range(c.count))
    return ids, out


def test_bulk_chunks_give_the_same_entries_as_read_and_fail_over(cluster, client):
    lh = client.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, password=PW)
    payloads = [b"c%d:" % i * (1 + i % 5) for i in range(5000)]
    futures = [lh.add_async(p) for p in payloads]
    assert [f.result(timeout=60) for f in futures] == list(range(5000))
    lh.close()
    rh = client.open_ledger(lh.id, password=PW)
    ids, got = _joined(rh.read_chunks(0, 4999))
    assert ids == list(range(5000)) and got == payloads
    assert _joined(rh.read_chunks(1234, 1300))[1] == [e.payload for e in rh.read(1234, 1300)]
    with pytest.raises(NoSuchEntryError):
        rh.read_chunks(0, 5000)  # past the LAC: refused before anything is sent
    with pytest.raises(ValueError):
        rh.read_chunks(10, 9)
    cluster.stop_bookie(lh.metadata.ensembles[0][1][0])  # one replica gone: fail over
    assert _joined(rh.read_chunks(0, 4999))[1] == payloads
    rh.close()
