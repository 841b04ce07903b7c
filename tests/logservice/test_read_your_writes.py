"""Read your writes across processes (CONTRACT.md "Log service"): a record
whose write returned is seen by every reader that starts afterwards, in any
process, at once.

The bookies learn that an entry is acknowledged only from the next entry the
writer sends (its piggybacked LAC), so the last entry of a log that went
quiet stays past their LAC until something follows it.  Here nothing does:
the owner's control entries and the ledger's explicit LAC are off, so a
reader that trusted the bookies' LAC alone would miss the last records for
ever (before the fix, `bkctl log read --from-txid 998` printed nothing 3
times in 4).  The reader asks the owner instead, which says how far its
writer is acknowledged (``appliance.logs.tail``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.logservice.support import log_service
from tests.support.bkctl import bkctl

ROUNDS = 4
READ_ONE = """
import sys, appliance
with appliance.connect(sys.argv[1]) as bk, bk.log(sys.argv[2]).reader() as r:
    got = r.read(max_records=100000, timeout_s=0)
    print(len(got), got[-1].payload.decode() if got else "-")
"""


@pytest.fixture
def service(make_cluster):
    with log_service(make_cluster, ("logserver-1",), client={"explicit_lac_interval_ms": 0},
                     log={"service_control_interval_ms": 0, "control_interval_ms": 0}) \
            as (cluster, bk, _):
        yield cluster, bk


def test_bkctl_read_right_after_bkctl_append_sees_the_last_records(service):
    cluster, _ = service
    for i in range(ROUNDS):
        name = f"orders-{i}"
        lines = "".join(f"{n}\n" for n in range(1, 1001))
        wrote = bkctl("log", "append", name, "-", config=cluster.config_path, input=lines,
                      text=True)
        assert wrote.returncode == 0, wrote.stderr
        read = bkctl("log", "read", name, "--from-txid", "998", config=cluster.config_path,
                     text=True)
        assert read.returncode == 0, read.stderr
        assert read.stdout.split() == ["998", "999", "1000"], f"round {i}: {read.stdout!r}"


def test_a_reader_in_another_process_sees_a_producers_write_at_once(service):
    cluster, bk = service
    p = bk.log("events").producer()
    try:
        for i in range(ROUNDS):
            p.write(f"record-{i}".encode())  # returned: acknowledged
            seen = subprocess.run([sys.executable, "-c", READ_ONE, str(cluster.config_path),
                                   "events"], capture_output=True, text=True, timeout=240)
            assert seen.returncode == 0, seen.stderr
            assert seen.stdout.split() == [str(i + 1), f"record-{i}"], seen.stdout
    finally:
        p.close()
