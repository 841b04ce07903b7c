"""Entries left short by a writer that is gone are healed by the bookie's
scrub, without a command: three bookies, E3/W3/A2, one bookie SIGSTOPped
longer than ``client.add_timeout_ms`` while a writer process adds (acked at
the ack quorum by the two others), the writer killed -9 (it cannot heal),
the ledger recovered and closed by another client, the bookie SIGCONTed:
within 2 minutes (default ``server.scrub_interval_ms``) that bookie alone
serves every entry.  Every test sends SIGCONT and kills its writer in
``finally``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import appliance
from appliance.supervisor.probe import bookie_info
from tests.integration.ledger_writer_proc import payload
from tests.integration.test_delayed_ensemble_change import held_prefix
from tests.support.launch import wait_for, wait_registered

PW = b"secret"
ADD_TIMEOUT_MS = 1_000
ADDS = 2_000  # 2 KiB each: far more than socket buffers hold for the stopped bookie
HEAL_DEADLINE_S = 120.0  # the documented bound: healed within 2 minutes
# The stopped bookie must stay registered through the stall and the recovery:
# a recovery that cannot send a write-back to an unregistered bookie of the
# ensemble, with no spare, fails (NotEnoughBookies) even though the two
# others make the ack quorum (a gap of recovery, not of the scrub).
SESSION_TIMEOUT_MS = 20_000
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def read_line(proc: subprocess.Popen, prefix: str, timeout_s: float) -> str:
    """The writer's next stdout line, which must start with ``prefix``."""
    found: list[str] = []

    def arrived() -> bool:
        line = proc.stdout.readline()  # the writer prints one line per step
        found.append(line)
        return True

    wait_for(arrived, timeout_s, what=f"the writer to print {prefix}")
    assert found[-1].startswith(prefix), (found, proc.poll())
    return found[-1]


def test_entries_a_killed_writer_left_short_are_healed_by_the_scrub(make_cluster):
    c = make_cluster(3, client={"add_timeout_ms": ADD_TIMEOUT_MS},
                     metadata={"session_timeout_ms": SESSION_TIMEOUT_MS})
    writer = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.ledger_writer_proc", str(c.config_path),
         str(ADDS), str(3 * ADD_TIMEOUT_MS / 1000.0)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO,
        env={**os.environ, "PYTHONPATH": REPO})
    victim_pid = None
    try:
        with appliance.connect(str(c.config_path)) as bk:
            wait_registered(bk, 3)
            ledger_id = int(read_line(writer, "LEDGER", 60).split()[1])
            ensemble = bk.ledger_metadata(ledger_id).ensembles[0][1]
            victim, others = ensemble[2], ensemble[:2]
            victim_pid = c.procs[victim].pid
            os.kill(victim_pid, signal.SIGSTOP)
            writer.stdin.write("go\n")
            writer.stdin.flush()
            assert read_line(writer, "ACKED", 120).split() == ["ACKED", str(ADDS)]
            writer.kill()  # -9: its short entries die with it
            writer.wait(30)
            lh = bk.open_ledger(ledger_id, password=PW)  # recovery, the victim stopped
            md = bk.ledger_metadata(ledger_id)
            assert (md.state, md.last_entry_id) == ("CLOSED", ADDS)
            assert md.ensembles == ((0, ensemble),)  # no spare: no ensemble change
            lh.close()
            os.kill(victim_pid, signal.SIGCONT)
            victim_pid = None
            endpoint = c.config.bookie(victim).endpoint
            resumed = time.monotonic()
            wait_for(lambda: held_prefix(endpoint, ledger_id, ADDS) == ADDS + 1,
                     HEAL_DEADLINE_S, interval_s=0.5, what=f"{victim} to hold every entry")
            heal_s = time.monotonic() - resumed
            scrub = bookie_info(endpoint, 5_000)["scrub"]
            assert scrub["ledgers_short"] == 1 and scrub["entries_missing"] > ADDS // 2, scrub
            for b in others:
                c.kill(b)
            got = bk.open_ledger(ledger_id, password=PW).read(0, ADDS)
            assert [e.payload for e in got] == [b"before"] + [payload(i) for i in range(ADDS)]
            print(f"{victim} healed {heal_s:.1f}s after SIGCONT; scrub: {scrub}")
    finally:
        if victim_pid is not None:
            os.kill(victim_pid, signal.SIGCONT)
        if writer.poll() is None:
            writer.kill()
        writer.wait(30)
