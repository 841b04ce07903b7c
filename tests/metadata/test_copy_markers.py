"""Copy markers (``appliance.rereplication.markers``) on both backends: held
while a re-replication copies a ledger to a replacement, per replacement,
persistent (they survive the holder's session), gone after release."""

from __future__ import annotations

import pytest

from appliance.rereplication.markers import ROOT, CopyMarkers, stale_markers


def test_a_marker_names_its_ledger_and_replacement_until_released(backend):
    holder, gc = CopyMarkers(backend.open()), CopyMarkers(backend.open())
    assert not gc.held_for(7, "bookie-1") and gc.ledgers_marked_for("bookie-1") == set()
    with holder.hold(7, "bookie-1") as path:
        assert path.startswith(f"{ROOT}/7/bookie-1.copy-")
        gc.store.sync()
        assert gc.held_for(7, "bookie-1")
        assert not gc.held_for(7, "bookie-10") and not gc.held_for(8, "bookie-1")
        assert gc.ledgers_marked_for("bookie-1") == {7}
        with holder.hold(7, "bookie-1"):  # two copies at once: two markers
            (a, b) = [m["path"] for m in gc.markers()]
            assert a != b
        assert gc.held_for(7, "bookie-1")  # the first one still holds
    gc.store.sync()
    assert not gc.held_for(7, "bookie-1") and gc.markers() == []
    assert "7" not in gc.store.children(ROOT)  # the ledger's folder went with its last marker


def test_a_marker_is_released_when_the_copy_fails(backend):
    markers = CopyMarkers(backend.open())
    with pytest.raises(RuntimeError), markers.hold(3, "bookie-2"):
        raise RuntimeError("copy failed")
    assert markers.markers() == []


def test_a_marker_outlives_its_holders_session(backend):
    holder_store = backend.open()
    CopyMarkers(holder_store).create(5, "bookie-3")
    holder_store.close()  # a re-replicator that died mid-copy: its marker stays
    gc = CopyMarkers(backend.open())
    assert gc.held_for(5, "bookie-3")
    (marker,) = gc.markers()
    assert marker["ledger_id"] == 5 and marker["bookie_id"] == "bookie-3" and marker["pid"]
    assert stale_markers(gc, marker["since_ms"] + 10, 100) == []
    assert stale_markers(gc, marker["since_ms"] + 1000, 100) == [marker]
