"""WriteHandle.add_many_async: consecutive entries, one future each, checks
before anything is queued, back-pressure over batches larger than the
in-flight limit."""

from __future__ import annotations

import pytest

import appliance
from tests.support.launch import wait_registered

PW = b"pw"


def test_add_many_gives_consecutive_ids_and_reads_back(make_cluster):
    cluster = make_cluster(3, quorums=(3, 3, 2), client={"inflight_adds_max": 700})
    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 3)
        lh = bk.create_ledger(3, 3, 2, password=PW)
        assert lh.add(b"first") == 0
        payloads = [b"m%d" % i * (1 + i % 3) for i in range(2500)]  # > inflight_adds_max
        futures = lh.add_many_async(payloads)
        assert [f.result(timeout=60) for f in futures] == list(range(1, 2501))
        with pytest.raises(TypeError, match="payload must be bytes"):
            lh.add_many_async([b"ok", "not bytes", b"ok"])  # nothing of it is queued
        with pytest.raises(ValueError, match="entry limit"):
            lh.add_many_async([b"ok", bytes(6 * 1024 * 1024)])
        assert lh.add_many_async([bytearray(b"last")])[0].result(timeout=60) == 2501
        assert lh.add_many_async([]) == []
        lh.close()
        rh = bk.open_ledger(lh.id, password=PW)
        got = [e.payload for e in rh.read(0, rh.last_add_confirmed)]
        assert got == [b"first", *payloads, b"last"]
