"""The multi-host cluster the suite shares: 3 host namespaces (a ZooKeeper
member and a supervisor with two tcp bookies each) and a client namespace
(``tests.harness.hosts``).  One cluster for the whole package (it takes
~15 s to start); each test leaves it as it found it (partitions healed,
ZooKeeper members restarted, every bookie registered), in ``finally``
blocks.  Everything it started is killed and every namespace deleted at
the end, also on failure or Ctrl-C.

Skipped, with one line saying why, where network namespaces cannot be
made (not root, no ``ip``) or Java is missing.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.harness.hosts import HostCluster, HostsOptions, netns_unavailable_reason

# A partitioned host's bookies leave the registry after the metadata session
# timeout; an add to one of them fails after the add timeout.  The first must
# be well below the second, so that clients no longer see the cut-off host's
# bookies when they pick replacements (docs/DEPLOYMENT.md, step 4).
ADD_TIMEOUT_MS = 7_000
SESSION_TIMEOUT_MS = 3_000
# Autorecovery marks the ledgers of a bookie unregistered this long.
LOST_BOOKIE_DELAY_MS = 3_000


def pytest_collection_modifyitems(config, items):
    reason = None
    for item in items:
        if "tests/multihost/" in str(item.fspath).replace("\\", "/"):
            reason = reason or netns_unavailable_reason() or "ok"
            if reason != "ok":
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="package")
def hosts():
    root = Path(tempfile.mkdtemp(prefix="bkmh"))
    options = HostsOptions(session_timeout_ms=SESSION_TIMEOUT_MS)
    options.client = {**options.client, "add_timeout_ms": ADD_TIMEOUT_MS}
    options.autorecovery = {"enabled": True, "lost_bookie_delay_ms": LOST_BOOKIE_DELAY_MS}
    try:
        with HostCluster(root, options) as cluster:
            yield cluster
    finally:
        if not os.environ.get("BK_MULTIHOST_KEEP"):  # set it to keep the logs of a failure
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def healthy(hosts):
    """The shared cluster, checked whole before the test and restored after it."""
    everyone = hosts.bookie_ids()
    hosts.wait_registered(everyone, 60)
    try:
        yield hosts
    finally:
        for name in hosts.names:
            hosts.heal(name)
        for index, member in enumerate(hosts.zk, start=1):
            if not member.running:
                hosts.start_zk(index)
        for member in hosts.zk:
            member.wait_until_serving(120)
        hosts.wait_registered(everyone, 120)
