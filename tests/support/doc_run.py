"""Run a Markdown document's code blocks against a test appliance, so the
docs cannot drift from the product (issue 48).  The blocks come from
``tests.support.doc_blocks``; how each language runs:

* ``sh``: line by line, each a ``bkctl`` command run by
  ``tests.support.bkctl`` (this checkout's bkctl, ``--config`` the test
  appliance's), fed at most by one command before a ``|`` (``seq 1 1000 |
  bkctl ...``).  Two kinds of line stand for what the test did itself, and
  are not run: ``source .venv/bin/activate`` (the test runs this
  checkout's bkctl) and ``make run`` / ``bkctl up`` (the test started its
  own appliance, ``bkctl up --detach`` on a temp config).  A line that runs
  until Ctrl-C (``--follow``, or its comment says Ctrl-C) is started, its
  first output checked within a deadline, then stopped with SIGINT, as
  Ctrl-C would, and must exit 0.  A comment that states values (``# prints
  its id: 0``, ``# 998 999 1000``: numbers and DLSNs after the last ``: ``)
  is compared with the output; any other comment needs a check in the
  caller's table (``checks``: command -> function of stdout that asserts),
  so no stated output goes unchecked, and a check the document no longer
  needs fails too.
* ``python``: run as a script in a process of its own, with the document's
  ``"configs/local.toml"`` replaced by the test appliance's config file;
  it must exit 0 (and ``checks`` may hold a function of its stdout, keyed
  by a line of the block).
* ``toml``: parsed (tomllib) and loaded by the appliance's config loader
  (``appliance.config.load_config``), a snippet without ``[metadata]``
  inside a minimal config, from a ``configs/`` folder as in the checkout.

Any other block (no language, another language) fails the run unless the
document skips it with a reason (``<!-- doc-test: skip (why) -->``).
"""

from __future__ import annotations

import json
import os
import queue
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.support.bkctl import CLI_TIMEOUT_S, REPO, bkctl, start_bkctl
from tests.support.doc_blocks import Block, blocks
from tests.support.launch import stop_process

DOC_CONFIG = "configs/local.toml"
FOLLOW_DEADLINE_S = 60.0  # a tail's first output, under a loaded machine
STOP_DEADLINE_S = 30.0  # after SIGINT
STANDS_FOR = {
    "source .venv/bin/activate": "the test runs this checkout's bkctl itself",
    "make run": "the test started its own appliance (bkctl up --detach, temp config)",
    "bkctl up": "the test started its own appliance (bkctl up --detach, temp config)",
}
VALUES = re.compile(r"[0-9][0-9/]*(?: [0-9][0-9/]*)*")
MINIMAL_CONFIG = '[metadata]\nuri = "sqlite:///meta.db"\n\n' + "".join(  # 3 bookies: E3
    f'[[bookies]]\nid = "b{i}"\njournal_dir = "b{i}/journal"\nledger_dir = "b{i}/ledgers"\n'
    f'endpoint = "ipc://b{i}.sock"\n\n' for i in (1, 2, 3))

Checks = dict[str, Callable[[str], object]]


class DocRunError(AssertionError):
    """A block of a document does not do what the document says."""


@dataclass(frozen=True)
class ShLine:
    where: str          # path:line of the line itself
    command: str
    comment: str | None

    @property
    def runs_until_ctrl_c(self) -> bool:
        words = self.command.split()
        return "--follow" in words or "-f" in words or "Ctrl-C" in (self.comment or "")


def sh_lines(block: Block) -> list[ShLine]:
    """The commands of an sh block, each with its comment (``# ...``)."""
    out = []
    for i, raw in enumerate(block.text.splitlines(), start=block.line + 1):
        command, comment = _split_comment(raw)
        if command:
            out.append(ShLine(f"{block.path}:{i}", command, comment))
    return out


def _split_comment(line: str) -> tuple[str, str | None]:
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].strip(), line[i + 1:].strip()
    return line.strip(), None


class DocRunner:
    """Runs blocks against the appliance of ``config``; ``checks``: the
    caller's table (see the module docstring); ``workdir``: for scripts."""

    def __init__(self, config: Path, workdir: Path, checks: Checks | None = None):
        self.config, self.workdir = Path(config), Path(workdir)
        self.checks = dict(checks or {})
        self.used: set[str] = set()
        self.done: list[str] = []  # what ran, or what a line stood for: the test's record

    def run_document(self, path: Path, leave: Callable[[Block], str | None] = lambda b: None):
        """Every block of ``path`` in order; ``leave(block)``: why this test
        leaves a block to another (None: run it).  Fails on the first block
        that does not do what the document says, and if a check went unused."""
        for block in blocks(path):
            why = block.skip_reason or leave(block)
            if why:
                self.done.append(f"{block}: not run here ({why})")
                continue
            self.run_block(block)
        unused = set(self.checks) - self.used
        if unused:
            raise DocRunError(f"{path}: checks for {sorted(unused)} found nothing to check: "
                              f"the document changed; update the test's table")

    def run_block(self, block: Block) -> None:
        if block.lang == "sh":
            for line in sh_lines(block):
                self.run_sh_line(line)
        elif block.lang == "python":
            self.run_python(block)
        elif block.lang == "toml":
            check_toml(block, self.workdir)
            self.done.append(f"{block}: loaded by the config loader")
        else:
            raise DocRunError(f"{block}: a block the tests cannot run: tag it sh, python or "
                              f"toml, or skip it with <!-- doc-test: skip (why) -->")

    # -- sh ------------------------------------------------------------------------------
    def run_sh_line(self, line: ShLine) -> None:
        stands = next((why for lead, why in STANDS_FOR.items()
                       if line.command == lead or line.command.startswith(lead + " ")), None)
        if stands:
            self.done.append(f"{line.where}: '{line.command}' not run: {stands}")
            return
        stages = [s.strip() for s in line.command.split(" | ")]
        if len(stages) > 2 or not stages[-1].startswith("bkctl "):
            raise DocRunError(f"{line.where}: cannot run '{line.command}': a line is one bkctl "
                              f"command, fed at most by one other; or skip the block "
                              f"with a reason")
        feed = _feed(stages[0], line) if len(stages) == 2 else None
        args = shlex.split(stages[-1])[1:]
        if line.runs_until_ctrl_c:
            self._run_until_ctrl_c(line, args)
        else:
            out = bkctl(*args, config=self.config, input=feed)
            if out.returncode != 0:
                raise DocRunError(f"{line.where}: '{line.command}' exited {out.returncode}: "
                                  f"{_last_line(out.stderr.decode(errors='replace'))}")
            self.check(line, out.stdout.decode(errors="replace"))
        self.done.append(f"{line.where}: '{line.command}' ran")

    def _run_until_ctrl_c(self, line: ShLine, args: list[str]) -> None:
        proc = start_bkctl(*args, config=self.config)
        try:
            lines: queue.Queue = queue.Queue()
            threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout],
                             daemon=True).start()
            seen, deadline, failure = "", time.monotonic() + FOLLOW_DEADLINE_S, None
            while time.monotonic() < deadline:
                try:
                    seen += lines.get(timeout=0.2)
                except queue.Empty:
                    continue
                try:
                    self.check(line, seen)
                    break
                except Exception as exc:  # noqa: BLE001 - output so far: not all there yet
                    failure = exc
            else:
                raise DocRunError(f"{line.where}: '{line.command}' printed {seen[:300]!r} "
                                  f"within {FOLLOW_DEADLINE_S:.0f} s ({failure})")
            proc.send_signal(signal.SIGINT)  # Ctrl-C, as the document says
            code = proc.wait(STOP_DEADLINE_S)
        finally:
            if proc.poll() is None:
                stop_process(proc, STOP_DEADLINE_S, signal.SIGKILL)
        if code != 0:
            raise DocRunError(f"{line.where}: '{line.command}' exited {code} on Ctrl-C: "
                              f"{_last_line(proc.stderr.read())}")

    def check(self, line: ShLine, stdout: str) -> None:
        """The line's stated output: values in its comment, or the table's check."""
        values = _stated_values(line.comment)
        if values is not None:
            if stdout.split() != values:
                raise DocRunError(f"{line.where}: '{line.command}' printed {stdout[:200]!r}; "
                                  f"the document says {' '.join(values)}")
        elif line.command in self.checks:
            self.used.add(line.command)
            self.checks[line.command](stdout)
        elif line.comment:
            raise DocRunError(f"{line.where}: '{line.command}' says '{line.comment}' and "
                              f"nothing checks it: add a check to the test's table")

    # -- python --------------------------------------------------------------------------
    def run_python(self, block: Block) -> None:
        script = self.workdir / f"block_{Path(block.path).stem}_{block.line}.py"
        script.write_text(block.text.replace(json.dumps(DOC_CONFIG), json.dumps(str(self.config))))
        out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                             cwd=self.workdir, timeout=CLI_TIMEOUT_S,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
        if out.returncode != 0:
            raise DocRunError(f"{block}: the block exited {out.returncode}: "
                              f"{_last_line(out.stderr)}")
        key = next((k for k in self.checks if k in block.text), None)
        if key is not None:
            self.used.add(key)
            self.checks[key](out.stdout)
        self.done.append(f"{block}: ran as a script against the test appliance")


def check_toml(block: Block, workdir: Path):
    """A TOML block parses, and loads as (part of) a config; the config."""
    from appliance.config import load_config
    from appliance.errors import ConfigError

    try:
        doc = tomllib.loads(block.text)
    except tomllib.TOMLDecodeError as exc:
        raise DocRunError(f"{block}: not TOML: {exc}") from None
    text = block.text if "metadata" in doc else MINIMAL_CONFIG + block.text
    folder = workdir / "configs"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"doc_{block.line}.toml"
    path.write_text(text)
    try:
        return load_config(path)
    except ConfigError as exc:
        raise DocRunError(f"{block}: the config loader refuses it: {exc}") from None


def _feed(command: str, line: ShLine) -> bytes:
    out = subprocess.run(["sh", "-c", command], capture_output=True, timeout=60)
    if out.returncode != 0:
        raise DocRunError(f"{line.where}: '{command}' exited {out.returncode}")
    return out.stdout


def _stated_values(comment: str | None) -> list[str] | None:
    if not comment:
        return None
    tail = comment.rsplit(": ", 1)[-1].strip()
    return tail.split() if VALUES.fullmatch(tail) else None


def _last_line(text: str) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return lines[-1] if lines else "(nothing on stderr)"


def check_bench_block(block: Block, covered_in: list[Path]) -> list[str]:
    """A block not run because it benchmarks for minutes (its skip reason
    says so): each line is a ``bkctl bench`` command that bkctl parses as
    written (the command, its options and their values), and one of the test
    files ``covered_in`` runs that bench (on tiny sizes).  Returns the benches."""
    from cli.main import cli

    covered = "".join(p.read_text() for p in covered_in)
    lines = [shlex.split(x.split("#")[0]) for x in block.text.splitlines() if x.strip()]
    if not lines or any(w[:2] != ["bkctl", "bench"] for w in lines):
        raise DocRunError(f"{block}: a skipped block here holds bkctl bench commands only")
    for words in lines:
        if f'"bench", "{words[2]}"' not in covered:
            raise DocRunError(f"{block}: bench {words[2]} is run by none of "
                              f"{[p.name for p in covered_in]}")
        command = cli.commands["bench"].commands[words[2]]
        with command.make_context(words[2], words[3:]):  # a bad option raises UsageError
            pass
    return [w[2] for w in lines]
