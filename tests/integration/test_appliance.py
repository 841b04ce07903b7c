"""The appliance as users run it: bkctl in real subprocesses, the
supervisor restarting bookies, kill -9 of the whole appliance."""

from __future__ import annotations

import base64
import json
import os
import signal
from pathlib import Path

import psutil
import pytest

import appliance
from tests.support.bkctl import bkctl
from tests.support.launch import supervisor_pids, wait_for, wait_registered


def _up(config: Path, seen: set[int]) -> None:
    result = bkctl("up", "--detach", config=config)
    seen.update(supervisor_pids(config))
    assert result.returncode == 0, result.stderr.decode()


def test_bkctl_end_to_end(appliance_config, short_tmp):
    config, seen = appliance_config
    _up(config, seen)
    shown = bkctl("status", "--json", config=config)
    assert shown.returncode == 0, shown.stderr.decode()  # every bookie serves
    status = json.loads(shown.stdout)
    assert [b["state"] for b in status["bookies"]] == ["up"] * 4
    assert all(b["pid"] and b["disk_bytes"] > 0 for b in status["bookies"])
    assert all(0.0 < b["fs_used"] < 1.0 for b in status["bookies"])

    data = b"".join(b"line %d \xff\x00 binary\n" % i for i in range(3000))
    src = short_tmp / "in.bin"
    src.write_bytes(data)
    appended = bkctl("ledger", "append", "-e", "3", "-w", "3", "-a", "2", "--password", "pw",
                     str(src), config=config)
    assert appended.returncode == 0, appended.stderr.decode()
    ledger_id = appended.stdout.decode().strip()
    read = bkctl("ledger", "read", ledger_id, "--password", "pw", config=config)
    assert read.returncode == 0, read.stderr.decode()
    assert read.stdout == data
    piped = bkctl("ledger", "append", "-", config=config, input=b"a\nb\n")
    assert piped.returncode == 0
    assert bkctl("ledger", "read", piped.stdout.decode().strip(), config=config).stdout == b"a\nb\n"
    meta = json.loads(bkctl("ledger", "meta", ledger_id, "--json", config=config).stdout)
    assert (meta["state"], meta["last_entry_id"]) == ("CLOSED", 2999)
    listed = json.loads(bkctl("ledger", "list", "--json", config=config).stdout)
    assert int(ledger_id) in listed

    down = bkctl("down", config=config)
    assert down.returncode == 0, down.stderr.decode()
    wait_for(lambda: not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"
                             for p in seen), 30, what="every process stopped")
    shown = bkctl("status", "--json", config=config)
    assert shown.returncode == 1  # a health check: nothing serves
    status = json.loads(shown.stdout)
    assert [b["state"] for b in status["bookies"]] == ["down"] * 4


def test_bkctl_down_stops_an_appliance_running_in_a_terminal(appliance_config):
    """`make run` is `bkctl up` in the foreground: `bkctl down` from another
    terminal must stop that supervisor (which stops its bookies), not kill
    the bookies under a supervisor that restarts them."""
    import subprocess
    import sys

    from tests.support.bkctl import REPO

    config, seen = appliance_config
    up = subprocess.Popen([sys.executable, "-m", "cli.main", "up", "--config", str(config)],
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seen.add(up.pid)
    try:
        wait_for(lambda: [b["state"] for b in json.loads(bkctl(
            "status", "--json", config=config).stdout)["bookies"]] == ["up"] * 4, 60,
            what="four bookies up")
        bookie_pids = set(supervisor_pids(config)[1:])
        seen.update(bookie_pids)
        down = bkctl("down", config=config)
        assert down.returncode == 0, down.stderr.decode()
        assert up.wait(timeout=60) == 0  # the foreground supervisor itself stopped
        alive = {p for p in bookie_pids if psutil.pid_exists(p)
                 and psutil.Process(p).status() != "zombie"}
        assert alive == set()  # and no bookie was restarted behind it
        status = json.loads(bkctl("status", "--json", config=config).stdout)
        assert [b["state"] for b in status["bookies"]] == ["down"] * 4
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()


def test_cli_errors_are_one_line_without_traceback(appliance_config, short_tmp):
    config, _ = appliance_config
    broken = short_tmp / "broken.toml"
    broken.write_text(config.read_text().replace("[client]", "[client]\nensmble = 3"))
    for args in (("up", "--detach"), ("status",), ("ledger", "list")):
        result = bkctl(*args, config=broken)
        err = result.stderr.decode().strip()
        assert result.returncode != 0
        assert "Traceback" not in err and len(err.splitlines()) == 1, err
        assert "client.ensmble" in err and "ensemble" in err
    missing = bkctl("status", config=short_tmp / "nope.toml")
    assert missing.returncode != 0 and "Traceback" not in missing.stderr.decode()
    assert len(missing.stderr.decode().strip().splitlines()) == 1


def test_supervisor_restarts_a_crashed_bookie(appliance_config):
    config, seen = appliance_config
    cpu = max(os.sched_getaffinity(0))  # bookie-2 pinned to one CPU, the others not
    text = config.read_text()
    config.write_text(text.replace('ledger_dir = "b2/ledgers"\n',
                                   f'ledger_dir = "b2/ledgers"\ncpus = [{cpu}]\n', 1))
    _up(config, seen)
    from appliance.config import load_config
    from appliance.supervisor.probe import bookie_info

    cfg = load_config(config)
    victim = cfg.bookies[1]
    old_pid = bookie_info(victim.endpoint, 2000)["pid"]
    os.kill(old_pid, signal.SIGKILL)
    new = wait_for(lambda: (i := bookie_info(victim.endpoint, 500)) and i["pid"] != old_pid
                   and i, 30, what="bookie restarted")
    seen.add(new["pid"])
    assert psutil.Process(new["pid"]).cpu_affinity() == [cpu]  # pinned again after restart
    other_pid = bookie_info(cfg.bookies[0].endpoint, 2000)["pid"]
    assert sorted(psutil.Process(other_pid).cpu_affinity()) == sorted(os.sched_getaffinity(0))
    assert bkctl("down", config=config).returncode == 0


def test_bookies_keep_serving_when_the_supervisor_dies(appliance_config):
    config, seen = appliance_config
    _up(config, seen)
    sup_pid = supervisor_pids(config)[0]
    os.kill(sup_pid, signal.SIGKILL)
    with appliance.connect(str(config)) as bk:
        lh = bk.create_ledger(3, 3, 2)
        assert [lh.add(b"x%d" % i) for i in range(10)] == list(range(10))
        lh.close()
    _up(config, seen)  # a new supervisor adopts the running bookies
    pids_after = supervisor_pids(config)
    assert pids_after[0] != sup_pid and set(pids_after[1:]) <= seen
    assert bkctl("down", config=config).returncode == 0


def test_whole_appliance_killed_and_restarted_keeps_acknowledged_entries(appliance_config):
    config, seen = appliance_config
    _up(config, seen)
    acked: dict[int, list[bytes]] = {}
    with appliance.connect(str(config)) as bk:
        wait_registered(bk, 4)
        for n in (1, 50, 700):
            lh = bk.create_ledger(3, 3, 2, password=b"pw")
            payloads = [os.urandom(64) for _ in range(n)]
            futures = [lh.add_async(p) for p in payloads]
            assert [f.result(timeout=60) for f in futures] == list(range(n))
            acked[lh.id] = payloads  # left OPEN: the writer "dies" with the appliance
    for pid in supervisor_pids(config):
        os.kill(pid, signal.SIGKILL)
    _up(config, seen)
    with appliance.connect(str(config)) as bk:
        wait_registered(bk, 4)
        for ledger_id, payloads in acked.items():
            rh = bk.open_ledger(ledger_id, password=b"pw")  # recovers
            assert rh.last_add_confirmed == len(payloads) - 1
            got = rh.read(0, rh.last_add_confirmed)
            assert [e.payload for e in got] == payloads
    assert bkctl("down", config=config).returncode == 0


def test_passwords_from_a_file_or_the_environment_reach_real_ledgers(make_cluster, tmp_path):
    """The ledger is written with --password-file and read back with
    $BKCTL_PASSWORD; the wrong one is refused."""
    cluster = make_cluster(3, quorums=(3, 3, 2))
    secret = tmp_path / "pw"
    secret.write_text("correct horse\n")
    secret.chmod(0o600)
    made = bkctl("ledger", "append", "-e", "3", "-w", "3", "-a", "2", "--password-file",
                 str(secret), "-", config=cluster.config_path, input="a\nb\nc\n", text=True,
                 env={"BKCTL_PASSWORD": None})
    assert made.returncode == 0, made.stderr
    ledger_id = made.stdout.strip().splitlines()[-1]
    ok = bkctl("ledger", "read", ledger_id, "--json", config=cluster.config_path, text=True,
               env={"BKCTL_PASSWORD": "correct horse"})
    assert ok.returncode == 0, ok.stderr
    payloads = [base64.b64decode(row["payload"]) for row in json.loads(ok.stdout)]
    assert payloads == [b"a", b"b", b"c"]
    wrong = bkctl("ledger", "read", ledger_id, config=cluster.config_path, text=True,
                  env={"BKCTL_PASSWORD": "wrong"})
    assert wrong.returncode != 0 and "Unauthorized" in wrong.stderr + wrong.stdout


def test_ledgers_store_a_salted_scrypt_record_and_older_v1_ledgers_still_open(make_cluster):
    from appliance.errors import UnauthorizedError
    from appliance.protocol.keys import master_key, password_hash

    cluster = make_cluster(3, quorums=(3, 3, 2))
    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 3)
        lh = bk.create_ledger(3, 3, 2, password=b"right")
        lh.add(b"x")
        lh.close()
        other = bk.create_ledger(3, 3, 2, password=b"right")
        records = [bk.ledger_metadata(i).password_hash for i in (lh.id, other.id)]
        assert all(len(r) == 52 and r[0] == 2 for r in records)
        assert password_hash(master_key(b"right")) not in records  # not the fast v1 hash
        assert [e.payload for e in bk.open_ledger(lh.id, password=b"right").read(0, 0)] == [b"x"]
        with pytest.raises(UnauthorizedError):
            bk.open_ledger(lh.id, password=b"wrong")
        # a ledger created before salted records (v1 in its metadata) still opens
        old = bk.ledgers.create_ledger(3, 3, 2, sorted(bk.registry.available())[:3],
                                       password_hash=password_hash(master_key(b"old")))
        assert bk.open_ledger(old.ledger_id, password=b"old").last_add_confirmed == -1
        with pytest.raises(UnauthorizedError):
            bk.open_ledger(old.ledger_id, password=b"wrong")


def test_delete_needs_the_password_or_force(make_cluster):
    from appliance.errors import NoSuchLedgerError, UnauthorizedError

    cluster = make_cluster(3, quorums=(3, 3, 2))
    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 3)
        a = bk.create_ledger(3, 3, 2, password=b"pw")
        b = bk.create_ledger(3, 3, 2, password=b"pw")
        c = bk.create_ledger(3, 3, 2, password=b"pw")
        open_ = bk.create_ledger(3, 3, 2)  # no password
        with pytest.raises(UnauthorizedError):
            bk.delete_ledger(a.id, b"wrong")
        with pytest.raises(UnauthorizedError):
            bk.delete_ledger(a.id, b"wrong", force=True)  # a wrong password is never forced
        assert bk.ledger_metadata(a.id).ledger_id == a.id  # still there
        bk.delete_ledger(a.id, b"pw")
        with pytest.raises(NoSuchLedgerError):
            bk.ledger_metadata(a.id)
        # another connection that never proved the password: refused without it
        with appliance.connect(str(cluster.config_path)) as other:
            with pytest.raises(UnauthorizedError, match="has a password"):
                other.delete_ledger(b.id)
            other.delete_ledger(open_.id)  # no password on it: anybody may
            assert open_.id not in other.list_ledgers()
        for env in ({"BKCTL_PASSWORD": "wrong"}, {"BKCTL_PASSWORD": None}):
            refused = bkctl("ledger", "delete", str(b.id), config=cluster.config_path,
                            text=True, env=env)
            assert refused.returncode != 0 and "Unauthorized" in refused.stderr
            assert "force=True" not in refused.stderr  # the CLI's words: --force
        assert "--force" in refused.stderr and "none was given" in refused.stderr
        assert bk.ledger_metadata(b.id).ledger_id == b.id
        forced = bkctl("ledger", "delete", str(b.id), "--force", config=cluster.config_path,
                       text=True, env={"BKCTL_PASSWORD": None})
        assert forced.returncode == 0, forced.stderr
        assert b.id not in bk.list_ledgers()
        bk.delete_ledger(c.id)  # this connection created it with the password (CONTRACT)
        assert c.id not in bk.list_ledgers()
