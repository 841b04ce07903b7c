"""bkctl's small courtesies against real bookies and log servers (issue 48
item 6; click's runner and real subprocesses): `ledger read` and `log read`
into a reader that stops after one line (``| head -1``) end quietly, as
``cat`` does; `log describe`'s header gives the last txid readers see (the
open segment's too); `status` calls entry-log files entry logs and shows
small sizes in KB; `top` has a row per log server."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading

import pytest
from click.testing import CliRunner

from cli.main import EXIT_BROKEN_PIPE, cli
from tests.logservice.support import log_service
from tests.support.bkctl import CLI_TIMEOUT_S, REPO, bkctl
from tests.support.launch import wait_for

ENTRIES = 3000  # of 100 bytes: far more than a pipe holds, so bkctl is still writing


@pytest.fixture
def setup(make_cluster):
    """(config, client, a ledger of ENTRIES lines, log "many" of ENTRIES
    records), with two log servers serving metrics on ports of their own."""
    with log_service(make_cluster) as (cluster, bk, _):
        lh = bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2)
        for f in [lh.add_async(b"%099d" % i) for i in range(ENTRIES)]:
            f.result()
        lh.close()
        with bk.log("many").writer() as w:
            for f in [w.write_async(b"%099d" % i) for i in range(ENTRIES)]:
                f.result()
        yield cluster.config_path, bk, lh.id


def _run(*args: str, config) -> object:
    return CliRunner().invoke(cli, [*args, "--config", str(config)], catch_exceptions=False)


def _first_line_then_close(*args: str, config) -> tuple[bytes, int, bytes]:
    """bkctl ARGS | head -1: (the line read, bkctl's exit status, its stderr)."""
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", *args, "--config", str(config)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO,
                            env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    try:
        line = proc.stdout.readline()
        proc.stdout.close()
        err = proc.stderr.read()
        return line, proc.wait(CLI_TIMEOUT_S), err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_reads_into_a_reader_that_stops_early_end_quietly(setup):
    config, _, ledger_id = setup
    for args in (("ledger", "read", str(ledger_id)), ("log", "read", "many")):
        line, code, err = _first_line_then_close(*args, config=config)
        assert line == b"%099d\n" % 0
        assert (code, err) == (EXIT_BROKEN_PIPE, b""), (args, err.decode())


def test_describe_header_gives_the_open_segments_last_txid(setup):
    config, bk, _ = setup
    w = bk.log("open").writer()
    try:
        w.write(b"first", txid=1001)
        for _ in range(4):
            w.write(b"more")  # txids 1002..1005
        w.flush()

        def shown():
            out = _run("log", "describe", "open", config=config).output
            return out if "last txid 1005 last" in out else None

        header, segment = wait_for(shown, 30, what="the open segment's records").splitlines()
        doc = json.loads(bkctl("log", "describe", "open", "--json", config=config).stdout)
    finally:
        w.close()
    assert "records 5" in segment and "(confirmed so far)" in segment
    assert "5 record(s) readable (0 in completed segments), last txid 1005," in header
    assert (doc["last_txid"], doc["completed_last_txid"], doc["readable"]) == (1005, None, 5)


def test_status_words_and_sizes_and_top_rows_for_log_servers(setup):
    config, bk, _ = setup
    status = _run("status", config=config).output
    bookie_lines = [line for line in status.splitlines() if line.startswith("bookie-")]
    assert len(bookie_lines) == 3
    for line in bookie_lines:
        assert " logs=" not in line
        # ~330 KB of entries on each bookie: said in KB, not "0.3 MB"
        assert re.search(r"live=\d+\.\d KB garbage=\d+(\.\d)? (B|KB) entry_logs=\d+", line), line

    stop = threading.Event()

    def produce():
        with bk.log("busy").producer() as p:
            while not stop.is_set():
                p.write(b"p" * 100)

    t = threading.Thread(target=produce)
    t.start()
    try:
        shown = bkctl("top", "--iterations", "1", "--interval", "0.5", config=config, text=True)
        out = bkctl("top", "--iterations", "2", "--interval", "0.5", "--json", config=config,
                    text=True)
    finally:
        stop.set()
        t.join(60)
    assert shown.returncode == 0 and out.returncode == 0, shown.stderr + out.stderr
    tables = shown.stdout.split("\nlog server")
    assert len(tables) == 2, shown.stdout
    header, *rows = tables[1].splitlines()
    assert header.split()[:3] == ["records/s", "requests/s", "write"]
    assert sorted(r.split()[0] for r in rows) == ["logserver-1", "logserver-2"]
    assert all(" ms " in r for r in rows), rows
    servers = [json.loads(line) for line in out.stdout.splitlines()][-1]["log_servers"]
    assert set(servers) == {"logserver-1", "logserver-2"}
    assert sum(s["records_per_s"] for s in servers.values()) > 0
    assert sum(s["owned_logs"] for s in servers.values()) >= 1
