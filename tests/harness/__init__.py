"""The test harness that is not part of the installed product: a multi-host
appliance on one machine (network namespaces, a ZooKeeper ensemble, tcp
bookies: ``hosts``), the clients run inside those namespaces
(``host_worker``), a userspace delay relay (``delay_relay``), the ensemble
members (``zk_ensemble``) and the multi-host write benchmark (``hosts_bench``,
run with ``python -m tests.harness.bench_hosts``, as root); and a developer's
A/B bench of bookies run from two checkouts (``bookie_msg``).

It needs root, ``ip netns`` and iptables, so it lives beside the tests
(as TigerBeetle keeps ``src/testing/``), not in the package ``bkctl``
installs; the product imports nothing from here (``tests/test_layers.py``).

Its modules run in subprocesses with ``python -m tests.harness.X``:
``module_env()`` puts this checkout on their ``PYTHONPATH``, whatever
their working directory.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def module_env() -> dict[str, str]:
    """The environment for ``python -m tests.harness.X``: ours, with this
    checkout first on ``PYTHONPATH``."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{path}" if path else str(REPO)}
