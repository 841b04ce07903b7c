"""A log server that dies under its supervisor is known dead at once
(`bkctl up --detach`, a real kill -9): the supervisor, woken by SIGCHLD,
deletes the dead server's registration and leases from the metadata store,
so its logs move to a live server and its restart registers without waiting
for its metadata session to expire.  The session timeout here is 10 minutes:
without the supervisor's release, none of this would happen within the
test's deadlines.  A producer rides over it and every record it wrote is
read back once, in order."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

import appliance
from appliance.meta.logservice import LogServiceRegistry
from tests.support.bkctl import bkctl
from tests.support.launch import kill_pids, supervisor_pids, wait_for, write_config

SESSION_MS = 600_000  # the metadata session: far beyond every deadline below
DEADLINE_S = 120.0  # a bound on a loaded machine, not a target
RECORDS = 100


@pytest.fixture
def appliance_config(short_tmp):
    config = write_config(short_tmp, 3, log={"servers": 2},
                          metadata={"session_timeout_ms": SESSION_MS})
    seen: set[int] = set()
    try:
        up = bkctl("up", "--detach", config=config, text=True)
        seen.update(supervisor_pids(config))
        assert up.returncode == 0, up.stderr
        yield config
    finally:
        seen.update(supervisor_pids(config))
        kill_pids(seen)


def _log_server_pids(config) -> dict[str, int]:
    doc = json.loads(bkctl("status", "--json", config=config, text=True).stdout)
    return {r["id"]: r["pid"] for r in doc["log_servers"]}


def test_a_killed_owner_hands_its_logs_over_without_waiting_out_its_session(appliance_config):
    config = appliance_config
    with appliance.connect(str(config)) as bk:
        registry = LogServiceRegistry(bk.logs.store)
        p = bk.log("failover").producer()
        try:
            written = [p.write(b"before %03d" % i) for i in range(RECORDS)]
            owner = registry.owner("failover")["server"]
            victim = _log_server_pids(config)[owner]
            os.kill(victim, signal.SIGKILL)
            killed_at = time.monotonic()
            wait_for(lambda: (registry.owner("failover") or {}).get("server") != owner or
                     registry.owner("failover") is None, DEADLINE_S,
                     what=f"the lease of {owner} (pid {victim}) released")
            released_s = time.monotonic() - killed_at
            # its restart registers at once (the stale registration is gone)
            wait_for(lambda: registry.servers().get(owner, {}).get("pid") not in (None, victim),
                     DEADLINE_S, what=f"{owner} restarted and registered")
            registered_s = time.monotonic() - killed_at
            written += [p.write(b"after %03d" % i) for i in range(RECORDS)]
            stall_s = time.monotonic() - killed_at
        finally:
            p.close()
        print(f"lease released {released_s:.2f} s, restart registered {registered_s:.2f} s, "
              f"{RECORDS} writes after the kill done {stall_s:.2f} s after it")
        with bk.log("failover").reader() as r:
            got = []
            while len(got) < 2 * RECORDS:
                more = r.read(max_records=1000, timeout_s=60)
                assert more, f"stalled after {len(got)} records"
                got += more
            assert r.read(max_records=10, timeout_s=0) == []
    assert [rec.payload for rec in got] == [b"before %03d" % i for i in range(RECORDS)] + \
        [b"after %03d" % i for i in range(RECORDS)]
    assert [rec.dlsn for rec in got] == written
