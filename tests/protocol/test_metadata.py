"""LedgerMetadata: validation, write sets, transforms and serialisation."""

import pytest

from appliance.errors import CorruptMetadataError, LedgerClosedError, LedgerFencedError
from appliance.protocol.metadata import CLOSED, IN_RECOVERY, LedgerMetadata


def md(**kw):
    base = dict(ledger_id=7, ensemble_size=4, write_quorum=3, ack_quorum=2,
                ensembles=((0, ("b1", "b2", "b3", "b4")),))
    base.update(kw)
    return LedgerMetadata(**base)


def test_write_sets_follow_the_protocol_document():
    m = md()
    assert [m.write_set(e) for e in range(6)] == [
        ("b1", "b2", "b3"), ("b2", "b3", "b4"), ("b3", "b4", "b1"),
        ("b4", "b1", "b2"), ("b1", "b2", "b3"), ("b2", "b3", "b4")]


def test_fragments_and_ensemble_change():
    m = md().with_fragment(12, ("b5", "b2", "b3", "b4"))
    assert m.fragment_for(11)[0] == 0
    assert m.fragment_for(12)[1][0] == "b5"
    assert m.write_set(12) == ("b5", "b2", "b3")
    # a fragment starting where the last starts replaces it
    m2 = m.with_fragment(12, ("b6", "b2", "b3", "b4"))
    assert len(m2.ensembles) == 2 and m2.ensembles[-1][1][0] == "b6"
    with pytest.raises(ValueError):
        m.with_fragment(5, ("b1", "b2", "b3", "b4"))


@pytest.mark.parametrize("kw,word", [
    (dict(ack_quorum=4), "ack_quorum"),
    (dict(write_quorum=5), "write_quorum"),
    (dict(ensemble_size=0), "ensemble"),
    (dict(state="WEIRD"), "state"),
    (dict(digest_type="md5"), "digest"),
    (dict(ensembles=((0, ("b1", "b1", "b2", "b3")),)), "distinct"),
])
def test_invalid_metadata_is_refused_naming_the_argument(kw, word):
    with pytest.raises(ValueError, match=word):
        md(**kw)


def test_state_transforms():
    m = md()
    r = m.to_in_recovery()
    assert r.state == IN_RECOVERY and m.state == "OPEN"
    with pytest.raises(LedgerFencedError):
        r.with_fragment(3, ("b5", "b2", "b3", "b4"))
    c = r.to_closed(41, length=100)
    assert (c.state, c.last_entry_id, c.length) == (CLOSED, 41, 100)
    with pytest.raises(LedgerClosedError):
        c.to_closed(41)
    with pytest.raises(LedgerClosedError):
        c.with_fragment(42, ("b5", "b2", "b3", "b4"))


def test_round_trip_and_corrupt_record():
    m = md(password_hash=b"\x01\x02", custom=(("app", "x"),))
    m = m.with_fragment(3, ("b5", "b2", "b3", "b4"))
    assert LedgerMetadata.from_bytes(m.to_bytes()) == m
    with pytest.raises(CorruptMetadataError, match="/ledgers/7"):
        LedgerMetadata.from_bytes(b"{not json", where="/ledgers/7")
    with pytest.raises(CorruptMetadataError):
        LedgerMetadata.from_bytes(m.to_bytes().replace(b'"format":1', b'"format":9'))
