"""bkctl's small courtesies, without an appliance (issue 48 item 6): a
reader that stops early (``bkctl status | head -1``) ends bkctl quietly, as
it ends ``cat``; sizes are in the unit that reads best; ``bkctl log
--help`` says a log has many producers; configs/local.toml serves the log
servers' metrics as it serves the bookies'.  Click's runner and real
subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys

from click.testing import CliRunner

from appliance.config import load_config
from cli import admin as cli_admin
from cli import main as cli_main
from cli.common import human_bytes
from cli.main import EXIT_BROKEN_PIPE, cli
from tests.support.bkctl import REPO, bkctl
from tests.support.launch import write_config


def test_a_reader_gone_ends_bkctl_quietly_in_clicks_runner(tmp_path, monkeypatch):
    def reader_gone(rows):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(cli_admin, "_echo_status", reader_gone)
    config = write_config(tmp_path, 1, quorums=(1, 1, 1))
    result = CliRunner().invoke(cli, ["status", "--config", str(config)])
    assert result.exit_code == EXIT_BROKEN_PIPE == 141
    assert "Broken pipe" not in result.output and "Error" not in result.output


def test_status_to_a_closed_pipe_exits_quietly_like_cat(tmp_path):
    """``bkctl status | head -1`` with head already gone: no 'Broken pipe'
    line, the status a shell gives ``cat`` in the same place."""
    config = write_config(tmp_path, 2, quorums=(1, 1, 1))
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        out = subprocess.run([sys.executable, "-m", "cli.main", "status", "--config", str(config)],
                             stdout=write_end, stderr=subprocess.PIPE, cwd=REPO, timeout=120,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    finally:
        os.close(write_end)
    assert out.stderr == b""
    assert out.returncode == EXIT_BROKEN_PIPE


def test_a_broken_pipe_that_is_not_stdouts_is_still_an_error(monkeypatch):
    """Only stdout's reader going away is quiet: stdout here is a pipe
    whose reader is still open."""
    read_end, write_end = os.pipe()
    try:
        with os.fdopen(write_end, "w", closefd=False) as fake_stdout:
            monkeypatch.setattr(sys, "stdout", fake_stdout)
            assert cli_main._stdout_reader_gone() is False
            os.close(read_end)
            read_end = None
            assert cli_main._stdout_reader_gone() is True
    finally:
        os.close(write_end)
        if read_end is not None:
            os.close(read_end)


def test_sizes_read_in_the_unit_that_fits():
    assert [human_bytes(n) for n in (0, 812, 25_000, 999_960, 4_200_000, 1.5e9)] == [
        "0 B", "812 B", "25.0 KB", "1.0 MB", "4.2 MB", "1.5 GB"]


def test_status_shows_cold_bytes_in_human_units(tmp_path):
    config = write_config(tmp_path, 1, quorums=(1, 1, 1), cold_storage={"uri": "cold"})
    result = CliRunner().invoke(cli, ["status", "--config", str(config)])
    tiers = [line for line in result.output.splitlines() if line.startswith("tiers:")]
    assert tiers == [f"tiers: hot - (live entry-log bytes on the bookies), cold 0 B in 0 "
                     f"segment(s) at {(tmp_path / 'cold').as_uri()}"], result.output


def test_log_help_says_a_log_has_many_producers():
    result = CliRunner().invoke(cli, ["log", "--help"])
    assert result.exit_code == 0
    assert "one writer, tailing readers" not in result.output
    assert "producers" in result.output and "exclusive writer" in result.output
    top = bkctl("--help", text=True)
    [line] = [line for line in top.stdout.splitlines() if line.strip().startswith("log ")]
    assert "many producers" in line


def test_local_toml_serves_log_server_metrics_as_it_serves_the_bookies():
    config = load_config(REPO / "configs" / "local.toml")
    assert config.log.servers > 0
    assert config.log.metrics_address == "127.0.0.1:0"
    assert {b.metrics_address for b in config.bookies} == {config.log.metrics_address}
