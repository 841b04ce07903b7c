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
