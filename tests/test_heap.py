"""appliance.heap: the allocator thresholds are set once, on glibc."""

import os
import sys

import pytest

from appliance import heap


@pytest.mark.skipif(not sys.platform.startswith("linux") or
                    not os.confstr("CS_GNU_LIBC_VERSION"), reason="glibc only")
def test_thresholds_are_accepted_on_glibc():
    assert heap.retain_freed_memory() is True
    assert heap.retain_freed_memory() is True  # idempotent


def test_other_platforms_are_left_alone(monkeypatch):
    monkeypatch.setattr(heap.sys, "platform", "darwin")
    assert heap._mallopt() is False


def test_freeze_moves_what_exists_to_the_permanent_generation_once(monkeypatch):
    import gc

    monkeypatch.setattr(heap, "_frozen", False)
    try:
        heap.freeze_long_lived_objects()
        frozen = gc.get_freeze_count()
        assert frozen > 1000  # the modules' objects
        junk = [[i] for i in range(100)]
        heap.freeze_long_lived_objects()  # a second call freezes nothing
        # the objects made since are still where the collector looks (frozen
        # ones are not); the count itself may only fall, as frozen objects
        # other threads of this process let go of are freed
        tracked = {id(o) for o in gc.get_objects()}
        assert all(id(item) in tracked for item in junk)
        assert gc.get_freeze_count() <= frozen
        del junk
    finally:
        gc.unfreeze()
