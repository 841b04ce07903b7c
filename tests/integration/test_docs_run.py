"""README.md and docs/LOGS.md do what they say: every code block runs, in
order, against an appliance this test starts (tests/support/doc_run.py
says how each language runs).

The appliance is the test's own, not `make run`'s: `bkctl up --detach` on
a temp config shaped like configs/local.toml (four bookies, E3/W3/A2, two
log servers, bookies' and log servers' metrics on port 0).  So the
README's `source .venv/bin/activate` line is not run (these tests run
this checkout's bkctl), and the python blocks run with
"configs/local.toml" replaced by that temp config's path.  The README's
Spark block is left to the Spark tests (it needs a Spark session).

Where a comment states an output, it is checked: values (`# prints its
id: 0`, `# 998 999 1000`) by the runner, words by the CHECKS tables here.
"""

from __future__ import annotations

import json

from tests.support.bkctl import REPO, bkctl
from tests.support.doc_blocks import blocks
from tests.support.doc_run import DocRunner, check_bench_block, check_toml, sh_lines
from tests.support.launch import supervisor_pids, write_config


def _up(appliance_config) -> object:
    config, seen = appliance_config
    write_config(config.parent, 4, every_bookie={"metrics_address": "127.0.0.1:0"},
                 log={"servers": 2, "metrics_address": "127.0.0.1:0"})
    up = bkctl("up", "--detach", config=config)
    seen.update(supervisor_pids(config))
    assert up.returncode == 0, up.stderr.decode()
    return config


def _status(out: str) -> None:
    bookies = [line.split() for line in out.splitlines() if line.startswith("bookie-")]
    assert [row[1] for row in bookies] == ["up"] * 4, out
    assert all(row[2].startswith("pid=") and row[2] != "pid=-" for row in bookies), out
    assert all(any(w.startswith("disk=") for w in row) for row in bookies), out
    assert out.count("restarts=") >= 4, out


def _status_json(out: str) -> None:
    doc = json.loads(out)
    for row in doc["bookies"]:
        assert {"state", "pid", "restarts", "uptime_s", "last_exit", "limbo_ledgers",
                "metrics_url"} <= set(row)
        assert row["metrics_url"].startswith("http://127.0.0.1:")


def _meta(out: str) -> None:
    first = out.splitlines()[0]
    assert first.startswith("ledger 0: CLOSED, last entry 999, ") and first.endswith("E3/W3/A2")
    assert sum(f"bookie-{i}" in out for i in range(1, 5)) == 3, out  # which bookies hold it


def _top(out: str) -> None:
    header = out.splitlines()[0].split()
    assert header[:4] == ["bookie", "adds/s", "err/s", "reads/s"] and "disk" in header
    servers = out.split("\nlog server")[1].splitlines()
    assert servers[0].split()[:2] == ["records/s", "requests/s"]
    assert sorted(r.split()[0] for r in servers[1:]) == ["logserver-1", "logserver-2"]


def _python_tour(out: str) -> None:
    lines = out.splitlines()
    assert lines[:2] == ["0 b'payload'", "1/0/0 1 b'1'"], lines[:3]


README_CHECKS = {
    "bkctl status": _status,
    "bkctl status --json": _status_json,
    "bkctl ledger meta 0": _meta,
    "bkctl ledger list": lambda out: _equal(out.split(), ["0"]),
    "bkctl log read orders --follow": lambda out: _equal(out.splitlines()[:1], ["1"]),
    "bkctl log describe orders": lambda out: _equal(out.splitlines()[1].split()[:3],
                                                    ["segment", "1:", "ledger"]),
    "bkctl top": _top,
    "print(e.entry_id, e.payload)": _python_tour,
}


def _equal(got, want) -> None:
    assert got == want, f"{got!r} != {want!r}"


# A product bug this test found (CONTRACT "Read your writes"), reported: right
# after `bkctl log append` (a producer, through the log service) returned, a
# `bkctl log read` can print nothing for up to [log]
# service_control_interval_ms (1 s): the owner's read cache is made at the
# first read, so it misses, and the bookies' last add confirmed moves only
# with the owner's next entry.  The line must still exit 0; a wrong output
# is recorded and warned about until the bug is fixed (then delete this).
def _spark(block) -> str | None:
    return "a Spark block: the Spark tests run it" if "register(spark)" in block.text else None


def test_readme_blocks_do_what_they_say(appliance_config, short_tmp):
    runner = DocRunner(_up(appliance_config), short_tmp, README_CHECKS)
    runner.run_document(REPO / "README.md", leave=_spark)
    print("\n".join(runner.done))
    _every_line_accounted_for(runner, REPO / "README.md")
    assert sum("ran as a script" in x for x in runner.done) == 1, runner.done


def _every_line_accounted_for(runner: DocRunner, path) -> None:
    """Each line of the sh blocks ran (or stood for what the test did)."""
    lines = [x for b in blocks(path, ("sh",)) if not b.skip_reason for x in sh_lines(b)]
    accounted = {entry.split(": ", 1)[0] for entry in runner.done}
    assert {x.where for x in lines} <= accounted, runner.done


def test_logs_md_blocks_do_what_they_say(appliance_config, short_tmp):
    runner = DocRunner(_up(appliance_config), short_tmp)
    runner.run_document(REPO / "docs" / "LOGS.md")
    print("\n".join(runner.done))
    assert sum("ran as a script" in x for x in runner.done) == 3, runner.done
    assert sum("loaded by the config loader" in x for x in runner.done) == 1, runner.done
    _every_line_accounted_for(runner, REPO / "docs" / "LOGS.md")


def test_logs_md_benchmark_lines_parse_and_run_tiny_elsewhere():
    """LOGS.md's benchmark block is not run (minutes each): its lines are
    bkctl bench commands bkctl parses as written, run tiny by tests/bench."""
    [block] = [b for b in blocks(REPO / "docs" / "LOGS.md", ("sh",)) if b.skip_reason]
    assert "tests/bench" in block.skip_reason, block.skip_reason
    assert check_bench_block(block, sorted((REPO / "tests" / "bench").glob("test_*.py"))) \
        == ["log", "log", "log", "log"]


def test_logs_md_cold_storage_example_lands_beside_the_data(short_tmp):
    """Put in a config of configs/ (as configs/local.toml), the cold
    storage example's directory is the repository's data/cold."""
    [block] = blocks(REPO / "docs" / "LOGS.md", ("toml",))
    config = check_toml(block, short_tmp)  # written to short_tmp/configs/
    assert config.cold_storage.uri == (short_tmp / "data" / "cold").as_uri()
