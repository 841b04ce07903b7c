"""`bkctl bench hosts` end to end (a small run): it prints one JSON document
with the write figures across hosts and leaves no namespace behind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_bench_hosts_prints_figures_and_cleans_up(tmp_path):
    bkctl = str(Path(sys.executable).with_name("bkctl"))
    done = subprocess.run([bkctl, "bench", "hosts", "--entries", "300", "--inflight", "50",
                           "--json", "--dir", str(tmp_path)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(done.stdout)
    assert (doc["entries"], doc["size"], doc["hosts"], doc["bookies"]) == (300, 1024, 3, 6)
    assert (doc["ensemble"], doc["write_quorum"], doc["ack_quorum"]) == (3, 3, 2)
    assert doc["adds_per_s"] > 0 and 0 < doc["p50_ms"] <= doc["p99_ms"]
    assert list(tmp_path.iterdir()) == []  # its data removed
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "bkmh" not in namespaces.replace(_own_prefix(), "")


def _own_prefix() -> str:
    """Namespaces of the suite's shared cluster (alive meanwhile) are not leftovers."""
    import os

    return f"bkmh{os.getpid()}"
