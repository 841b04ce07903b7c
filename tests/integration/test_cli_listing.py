"""What a user sees of ledgers and logs in bkctl, against real bookies
(click's runner and real subprocesses): `ledger list` leaves out log
segments unless `--all` (then marked with their log); binary payloads
reach a pipe as they are and a terminal escaped; `log read --json` is one
object per record (dlsn, txid, payload base64), one a line."""

from __future__ import annotations

import base64
import json
import os
import pty
import subprocess
import sys

import pytest
from click.testing import CliRunner

import appliance
from cli.common import ESCAPED_NOTE
from cli.main import cli
from tests.support.bkctl import CLI_TIMEOUT_S, REPO, bkctl
from tests.support.launch import wait_registered

BINARY = [b"\x00\x01\xfe\xff", b"\x1b[31mred", b"plain text"]


@pytest.fixture
def setup(make_cluster):
    """(config, user ledger ids, {segment ledger id: seq}, the log's records)."""
    cluster = make_cluster(3, quorums=(3, 3, 2), autorecovery={"enabled": False})
    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 3)
        mine = []
        for payloads in (BINARY, [b"x"]):
            lh = bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2)
            for p in payloads:
                lh.add(p)
            lh.close()
            mine.append(lh.id)
        written = []
        for _ in range(2):  # a writer per segment
            with bk.log("events").writer() as w:
                written += [(w.write(p), p) for p in BINARY]
        segments = {s.ledger_id: s.seq for s in bk.logs.read_log("events")[0].segments}
    assert len(segments) >= 2 and not set(segments) & set(mine)
    return cluster.config_path, mine, segments, written


def _run(*args: str, config) -> object:
    return CliRunner().invoke(cli, [*args, "--config", str(config)], catch_exceptions=False)


def test_ledger_list_leaves_log_segments_out_unless_all(setup):
    config, mine, segments, _ = setup
    assert _run("ledger", "list", config=config).output.split() == [str(i) for i in mine]
    listed = bkctl("ledger", "list", "--json", config=config)
    assert listed.returncode == 0 and json.loads(listed.stdout) == mine  # a list of ids
    every = sorted(mine + list(segments))
    docs = json.loads(_run("ledger", "list", "--all", "--json", config=config).output)
    assert docs == [{"ledger_id": i, "log": "events" if i in segments else None,
                     "segment": segments.get(i)} for i in every]
    plain = bkctl("ledger", "list", "--all", config=config, text=True).stdout.splitlines()
    assert plain == [str(i) if i not in segments else
                     f"{i}  (log events, segment {segments[i]})" for i in every]


def test_binary_payloads_reach_a_pipe_as_they_are(setup):
    config, mine, _, written = setup
    read = bkctl("ledger", "read", str(mine[0]), config=config)
    assert read.returncode == 0 and read.stdout == b"".join(p + b"\n" for p in BINARY)
    assert read.stderr == b""
    got = _run("ledger", "read", str(mine[0]), config=config)
    assert got.stdout_bytes == read.stdout
    logged = bkctl("log", "read", "events", config=config)
    assert logged.stdout == b"".join(p + b"\n" for _, p in written) and logged.stderr == b""


def test_log_read_json_is_one_object_per_record_one_a_line(setup):
    config, _, _, written = setup
    for out in (bkctl("log", "read", "events", "--json", config=config).stdout,
                _run("log", "read", "events", "--json", config=config).stdout_bytes):
        docs = [json.loads(line) for line in out.splitlines()]
        assert [set(d) for d in docs] == [{"dlsn", "txid", "payload"}] * len(written)
        assert [(d["dlsn"], base64.b64decode(d["payload"])) for d in docs] == \
            [(str(dlsn), p) for dlsn, p in written]
        assert [d["txid"] for d in docs] == list(range(1, len(written) + 1))


def _on_a_terminal(*args: str, config) -> tuple[bytes, bytes, int]:
    """bkctl with stdout on a pseudo-terminal: (what the terminal got, with
    its \\r\\n turned back into \\n; stderr; exit code)."""
    primary, secondary = pty.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "cli.main", *args, "--config",
                                 str(config)], stdout=secondary, stderr=subprocess.PIPE,
                                cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
        os.close(secondary)
        secondary = None
        try:
            _, err = proc.communicate(timeout=CLI_TIMEOUT_S)
        finally:
            proc.kill()
            proc.wait()
        out = b""
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # EIO: the terminal's other end is closed
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(primary)
        if secondary is not None:
            os.close(secondary)
    return out.replace(b"\r\n", b"\n"), err, proc.returncode


def test_binary_payloads_reach_a_terminal_escaped_with_one_note(setup):
    config, mine, _, written = setup
    escaped = b"\\x00\\x01\\xfe\\xff\n\\x1b[31mred\nplain text\n"
    out, err, code = _on_a_terminal("ledger", "read", str(mine[0]), config=config)
    assert code == 0 and out == escaped and b"\x1b" not in out
    assert err.decode().count(ESCAPED_NOTE) == 1
    out, err, code = _on_a_terminal("log", "read", "events", config=config)
    assert code == 0 and out == escaped * 2 and err.decode().count(ESCAPED_NOTE) == 1
