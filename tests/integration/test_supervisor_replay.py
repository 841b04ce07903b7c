"""A bookie restarted after kill -9 with a large unflushed journal replays it
without being killed for not answering pings (a replay is not a hang)."""

from __future__ import annotations

import os
import re
import signal

import appliance
from appliance.config import load_config
from appliance.supervisor.probe import bookie_info
from tests.support.bkctl import bkctl
from tests.support.launch import (
    kill_pids,
    supervisor_pids,
    wait_for,
    wait_registered,
    write_config,
)

ENTRY = 1024 * 1024
TOTAL = 1024 * ENTRY  # >= 1 GB through the victim


def test_kill_9_after_1_gb_one_restart_no_ping_kill(short_tmp):
    # pings strict enough that the old rule (ping timeout from spawn) killed a
    # replaying bookie; start_timeout_ms generous
    config = write_config(short_tmp, 3, supervisor={"ping_interval_ms": 100,
                                                    "ping_timeout_ms": 500,
                                                    "start_timeout_ms": 120_000},
                          storage={"checkpoint_interval_s": 3600.0,
                                   "checkpoint_bytes": 8 * 1024 ** 3})
    seen: set[int] = set()
    try:
        result = bkctl("up", "--detach", config=config)
        seen.update(supervisor_pids(config))
        assert result.returncode == 0, result.stderr
        cfg = load_config(config)
        victim = cfg.bookies[1]
        with appliance.connect(str(config)) as bk:
            wait_registered(bk, 3)
            lh = bk.create_ledger(3, 3, 2)  # every bookie holds every entry
            payload = os.urandom(ENTRY)
            futures = [lh.add_async(payload) for _ in range(TOTAL // ENTRY)]
            assert futures[-1].result(timeout=300) == TOTAL // ENTRY - 1
            lh.close()
        old_pid = bookie_info(victim.endpoint, 2000)["pid"]
        os.kill(old_pid, signal.SIGKILL)
        new = wait_for(lambda: (i := bookie_info(victim.endpoint, 500)) and i["pid"] != old_pid
                       and i, 120, what="bookie restarted and serving")
        seen.add(new["pid"])
        log = _supervisor_log(cfg)
        starts = re.findall(rf"started bookie {victim.id} \(pid (\d+)", log)
        assert len(starts) == 2, log  # the first start and exactly one restart
        assert "stopped answering" not in log and "did not start serving" not in log, log
        served = wait_for(lambda: (t := _supervisor_log(cfg)) and
                          f"pid {new['pid']}) serving" in t and t, 30, what="serving logged")
        took = re.search(rf"bookie {victim.id} \(pid {new['pid']}\) serving after (\d+) ms",
                         served)
        assert took and int(took.group(1)) < 120_000, served
        assert new["storage"]["recovered_journal_records"] > 0  # it did replay its journal
        with appliance.connect(str(config)) as bk:
            rh = bk.open_ledger(lh.id)
            assert rh.last_add_confirmed == TOTAL // ENTRY - 1
            assert rh.read(TOTAL // ENTRY - 1, TOTAL // ENTRY - 1)[0].payload == payload
        down = bkctl("down", config=config)
        assert down.returncode == 0, (down.stderr, _run_logs(cfg))
    finally:
        seen.update(supervisor_pids(config))
        kill_pids(seen)


def _supervisor_log(cfg) -> str:
    return (cfg.run_path / "supervisor.log").read_text()


def _run_logs(cfg, tail_bytes: int = 3000) -> dict[str, str]:
    """The end of every log of the run dir (the supervisor's, each process's)."""
    return {p.name: p.read_text(errors="replace")[-tail_bytes:]
            for p in sorted(cfg.run_path.glob("*.log"))}
