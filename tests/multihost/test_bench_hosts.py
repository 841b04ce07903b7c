"""The multi-host write bench (``python -m tests.harness.bench_hosts``) end to
end (a small run): it prints one JSON document with the write figures
across hosts and leaves no namespace behind."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.harness import module_env


def test_bench_hosts_prints_figures_and_cleans_up(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "tests.harness.bench_hosts", "--entries",
                             "300", "--inflight", "50", "--json", "--dir", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=module_env())
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, err[-2000:]
    doc = json.loads(out)
    assert (doc["entries"], doc["size"], doc["hosts"], doc["bookies"]) == (300, 1024, 3, 6)
    assert (doc["ensemble"], doc["write_quorum"], doc["ack_quorum"]) == (3, 3, 2)
    assert doc["adds_per_s"] > 0 and 0 < doc["p50_ms"] <= doc["p99_ms"]
    assert list(tmp_path.iterdir()) == []  # its data removed
    tag = f"bkmh{proc.pid}"  # the names of its namespaces and links
    for listing in (["ip", "netns", "list"], ["ip", "-o", "link", "show"]):
        assert tag not in subprocess.run(listing, capture_output=True, text=True).stdout
