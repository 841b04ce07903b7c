"""The one bkctl runner of the tests: ``python -m cli.main ARGS [--config
PATH]`` in a real subprocess of this tree (cwd and PYTHONPATH = the
repository), with a bound on how long it may take.  Click's in-process
runner is for the rest (``click.testing.CliRunner``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CLI_TIMEOUT_S = 240.0  # a bound, not a target: a loaded 2-core machine runs bkctl slowly


def bkctl(*args: str, config: str | os.PathLike | None = None, input: bytes | str | None = None,
          text: bool = False, timeout_s: float = CLI_TIMEOUT_S,
          env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run bkctl to its end; stdout and stderr captured (str if ``text``);
    ``env``: variables added to (or, with None values, removed from) ours."""
    argv, full = _command(args, config, env)
    return subprocess.run(argv, input=input, capture_output=True, text=text, cwd=REPO,
                          timeout=timeout_s, env=full)


def start_bkctl(*args: str, config: str | os.PathLike | None = None,
                env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start bkctl and return at once (a command that runs until Ctrl-C:
    ``log read --follow``, ``top``): stdout and stderr are pipes (text,
    line-buffered); the caller stops it (``tests.support.launch.stop_process``)."""
    argv, full = _command(args, config, env)
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            bufsize=1, cwd=REPO, env=full)


def _command(args, config, env) -> tuple[list[str], dict[str, str]]:
    argv = [sys.executable, "-m", "cli.main", *args]
    if config is not None:
        argv += ["--config", str(config)]
    full = {**os.environ, "PYTHONPATH": str(REPO)}
    for key, value in (env or {}).items():
        if value is None:
            full.pop(key, None)
        else:
            full[key] = value
    return argv, full
