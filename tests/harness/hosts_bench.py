"""The multi-host write benchmark (``python -m tests.harness.bench_hosts``):
durable 1 KB adds across hosts over tcp.

Builds the namespace cluster of ``tests.harness.hosts`` (3 hosts with two
bookies each, a ZooKeeper ensemble, a client namespace), optionally adds
``tc netem`` delay between every pair of hosts, then runs the ordinary
closed-loop write benchmark (``bkctl bench write --config``, one ledger,
E/W/A as asked) from the client namespace and tears everything down, also
on failure.  The figures are those of ``appliance.bench.ledgers`` (adds/s,
latency percentiles from the writer's side), plus how the cluster was set
up.  ``delay_mode``: ``netem``, or ``relay`` (a userspace relay in front
of the bookies, for kernels without netem; with ``delay_ms`` 0 it is the
relay's own baseline) or ``auto`` (``HostCluster.delay``).  ``curve=True``
gives every host and the client a CURVE key pair (``hosts.curve_security``),
so on and off are the same run otherwise.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

from tests.harness.hosts import (
    CLIENT,
    HostCluster,
    HostsOptions,
    curve_security,
    netns_unavailable_reason,
)

BENCH_TIMEOUT_S = 3_600.0


def run_hosts_bench(entries: int, *, size: int = 1024, quorums: tuple[int, int, int] = (3, 3, 2),
                    inflight: int = 1_000, delay_ms: float = 0.0, workdir: str | None = None,
                    curve: bool = False, delay_mode: str = "netem") -> dict:
    """The results document of one run (``bkctl bench write --json`` keys
    plus ``hosts``, ``delay_ms``, ``curve``); with ``curve``, every host and
    the client have key pairs (``hosts.curve_security``)."""
    reason = netns_unavailable_reason()
    if reason:
        raise RuntimeError(f"bench hosts cannot run here: {reason}")
    root = Path(tempfile.mkdtemp(prefix="bkmh", dir=workdir))
    try:
        security = curve_security(root / "curve") if curve else None
        with HostCluster(root / "cluster", HostsOptions(security=security)) as cluster:
            made = cluster.delay(delay_ms, delay_mode) if delay_ms or delay_mode == "relay" \
                else "none"
            e, w, a = quorums
            config = (cluster.client_config(root / "curve" / "keys" / "client.key_secret")
                      if curve else None)
            done = cluster.bkctl(CLIENT, "bench", "write", "--entries", str(entries), "--size",
                                 str(size), "--inflight", str(inflight), "-e", str(e), "-w",
                                 str(w), "-a", str(a), "--json", timeout_s=BENCH_TIMEOUT_S,
                                 config=config)
            if done.returncode != 0:
                raise RuntimeError(f"bench write failed in the client namespace: "
                                   f"{done.stderr.strip()[-2000:]}")
            doc = json.loads(done.stdout)
            doc.update(hosts=len(cluster.names), bookies=len(cluster.bookie_ids()),
                       delay_ms=delay_ms, delay_mode=made, curve=curve)
            return doc
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":  # python -m tests.harness.hosts_bench ENTRIES
    print(json.dumps(run_hosts_bench(int(sys.argv[1]) if len(sys.argv) > 1 else 10_000)))
