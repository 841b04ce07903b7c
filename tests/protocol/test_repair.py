"""BP-46 phase two decisions (``appliance.protocol.repair``)."""

from __future__ import annotations

import pytest

from appliance.protocol import repair
from appliance.protocol.metadata import LedgerMetadata
from appliance.protocol.quorum import Protections


def closed(last: int, ensembles, e=3, w=2, a=2) -> LedgerMetadata:
    md = LedgerMetadata(ledger_id=7, ensemble_size=e, write_quorum=w, ack_quorum=a,
                        ensembles=tuple((f, tuple(b)) for f, b in ensembles))
    return md.to_closed(last)


def test_share_is_every_entry_whose_write_set_names_the_bookie():
    md = closed(9, [(0, ["a", "b", "c"]), (6, ["a", "d", "c"])])
    for bookie in "abcd":
        share = {e for f, l in repair.share_runs(md, bookie) for e in range(f, l + 1)}
        assert share == {e for e in range(10) if bookie in md.write_set(e)}, bookie


def test_share_of_an_open_ledger_is_unknown():
    md = LedgerMetadata(ledger_id=7, ensemble_size=3, write_quorum=3, ack_quorum=2,
                        ensembles=((0, ("a", "b", "c")),))
    with pytest.raises(ValueError, match="not known"):
        repair.share_runs(md, "a")
    assert repair.next_step(md, "a", lambda e: True) == repair.RECOVER
    assert not repair.may_clear_limbo(md, "a", lambda e: True)


def test_missing_runs_and_steps():
    md = closed(9, [(0, ["a", "b", "c"])], w=3)
    held = {0, 1, 2, 5, 6, 9}
    assert list(repair.missing_runs(repair.share_runs(md, "a"), held.__contains__)) == [
        (3, 4), (7, 8)]
    assert repair.next_step(md, "a", held.__contains__) == repair.COPY
    assert not repair.may_clear_limbo(md, "a", held.__contains__)
    assert repair.next_step(md, "a", lambda e: True) == repair.CLEAR
    assert repair.may_clear_limbo(md, "a", lambda e: True)
    assert repair.sources(md, "a", 4) == ("b", "c")


def test_a_deleted_ledger_is_cleared_and_the_switch_only_skips_the_share_check():
    assert repair.next_step(None, "a", lambda e: False) == repair.GONE
    assert repair.may_clear_limbo(None, "a", lambda e: False)
    md = closed(9, [(0, ["a", "b", "c"])])
    off = Protections.without("repair-share")
    assert repair.may_clear_limbo(md, "a", lambda e: False, protections=off)
    assert not repair.may_clear_limbo(md, "a", lambda e: False)


def test_a_bookie_no_fragment_names_has_an_empty_share():
    md = closed(9, [(0, ["a", "b", "c"])])
    assert repair.share_runs(md, "z") == []
    assert repair.may_clear_limbo(md, "z", lambda e: False)
