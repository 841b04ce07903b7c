"""Disk-full protection, the unit part: thresholds, hysteresis, unreadable
usage, and what the gate refuses and passes."""

from __future__ import annotations

import pytest

from appliance.bookie.disk_monitor import DiskMonitor, ReadOnlyGate
from appliance.errors import ReadOnlyError
from ipc.packed import AddMultiRequest, AddPackedRequest
from ipc.replies import InfoReply, PingReply
from ipc.requests import AddBatchRequest, AddItem, AddRequest, InfoRequest, PingRequest

KEY = bytes(32)


def monitor_with(usage: dict[str, float], low=0.90, high=0.95) -> DiskMonitor:
    def usage_fn(path):
        value = usage[path]
        if isinstance(value, Exception):
            raise value
        return value
    return DiskMonitor(list(usage), high, low, usage_fn=usage_fn)


def test_read_only_above_max_and_writable_again_only_at_resume():
    usage = {"/j": 0.50, "/l": 0.50}
    m = monitor_with(usage)
    assert m.check() is False and m.read_only is False
    usage["/l"] = 0.95  # the worst directory decides
    assert m.check() is True and m.read_only is True
    usage["/l"] = 0.92  # between the two: no flapping
    assert m.check() is False and m.read_only is True
    usage["/l"] = 0.90
    assert m.check() is True and m.read_only is False
    assert m.last_usage == {"/j": 0.50, "/l": 0.90}


def test_unreadable_usage_counts_as_full():
    m = monitor_with({"/j": 0.1, "/gone": OSError(5, "EIO")})
    assert m.check() is True and m.read_only is True


def test_thresholds_must_be_ordered():
    with pytest.raises(ValueError, match="usage_resume"):
        DiskMonitor(["/x"], usage_max=0.8, usage_resume=0.9)


class Recorder:
    def __init__(self):
        self.seen = []

    def handle(self, peer, req):
        self.seen.append(req)
        if isinstance(req, InfoRequest):
            return InfoReply({"bookie_id": "b1", "counters": {"adds": 3}}, req.request_id)
        return PingReply(req.request_id)


def test_gate_refuses_adds_but_not_recovery_adds_reads_or_info():
    usage = {"/d": 0.99}
    m = monitor_with(usage)
    m.check()
    inner = Recorder()
    gate = ReadOnlyGate(inner, m)
    adds = [AddRequest(1, 0, KEY, b"x"),
            AddBatchRequest([AddItem(1, 0, KEY, b"x")]),
            AddPackedRequest.of(1, KEY, [0], [b"x"]),
            AddMultiRequest([(1, KEY, 1), (2, KEY, 1)], [0, 0], [1, 1], b"xy")]
    for req in adds:
        with pytest.raises(ReadOnlyError, match="read-only"):
            gate.handle(b"peer", req)
    assert inner.seen == []  # nothing reached the storage
    recovery = AddRequest(1, 0, KEY, b"x", recovery=True)
    gate.handle(b"peer", recovery)
    gate.handle(b"peer", PingRequest())
    info = gate.handle(b"peer", InfoRequest()).info
    assert inner.seen[0] is recovery and len(inner.seen) == 3
    assert info["read_only"] is True and info["disk_usage"] == {"/d": 0.99}
    assert info["counters"] == {"adds": 3, "read_only_refused_adds": 4}

    usage["/d"] = 0.5
    m.check()
    gate.handle(b"peer", adds[0])  # writable again: passes through
    assert inner.seen[-1] is adds[0]
    assert gate.handle(b"peer", InfoRequest()).info["read_only"] is False


def test_usage_is_what_df_shows(tmp_path):
    """Operators compare `bkctl status` fs_used with df: same formula (df
    rounds Use% up to a whole percent)."""
    import subprocess

    from appliance.bookie.disk_monitor import disk_usage_fraction

    out = subprocess.run(["df", "--output=pcent", str(tmp_path)], capture_output=True,
                         text=True, check=True).stdout.split()[-1]
    ours = disk_usage_fraction(str(tmp_path)) * 100
    assert int(out.rstrip("%")) - 1.5 <= ours <= int(out.rstrip("%")) + 0.5
