"""configs/prometheus/alerts.yml, checked with the real ``promtool``
(installed on first use: tests/support/promtool.py): the rules parse, the
unit tests in alerts_test.yml pass, every alert has a case where it fires
and one where it does not, and promtool does fail a broken rule and a
wrong expectation (so a green run means something)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.promtool import promtool

RULES_DIR = Path(__file__).resolve().parents[1] / "configs" / "prometheus"
RULES = RULES_DIR / "alerts.yml"
RULE_TESTS = RULES_DIR / "alerts_test.yml"
ALERTS = {"BookieDown", "BookieReadOnly", "BookieDiskAlmostFull", "BookieLimboNotClearing",
          "BookieAddLatencyHigh", "LedgersUnderReplicated", "ClientAddLatencyHigh",
          "LogServerDown"}


@pytest.fixture(scope="module")
def tool() -> Path:
    return promtool()


def _promtool(tool: Path, *args, cwd: Path = RULES_DIR) -> subprocess.CompletedProcess:
    return subprocess.run([str(tool), *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def test_promtool_accepts_the_rules(tool):
    proc = _promtool(tool, "check", "rules", RULES)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in proc.stdout


def test_the_unit_tests_of_the_rules_pass(tool):
    proc = _promtool(tool, "test", "rules", RULE_TESTS)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def _cases(text: str) -> dict[str, set[str]]:
    """{alert: {"fires", "silent"}}: the kinds of expectation alerts_test.yml has."""
    out: dict[str, set[str]] = {}
    alert = None
    for line in text.splitlines():
        if m := re.match(r"\s*alertname:\s*(\S+)", line):
            alert = m.group(1)
        elif (m := re.match(r"\s*exp_alerts:\s*(\S*)", line)) and alert:
            out.setdefault(alert, set()).add("silent" if m.group(1) == "[]" else "fires")
    return out


def test_every_alert_is_tested_firing_and_not_firing():
    names = set(re.findall(r"^\s*- alert:\s*(\S+)", RULES.read_text(), re.M))
    assert names == ALERTS
    cases = _cases(RULE_TESTS.read_text())
    assert {a: cases.get(a, set()) for a in names} == {a: {"fires", "silent"} for a in names}


def test_a_broken_rule_fails_the_check(tool, tmp_path):
    broken = tmp_path / "alerts.yml"
    broken.write_text(RULES.read_text().replace(
        "expr: bookkeeper_bookie_read_only == 1", "expr: bookkeeper_bookie_read_only == (1"))
    assert broken.read_text() != RULES.read_text()
    proc = _promtool(tool, "check", "rules", broken, cwd=tmp_path)
    assert proc.returncode != 0
    assert "FAILED" in proc.stdout + proc.stderr


def test_a_rule_that_no_longer_does_what_its_test_says_fails(tool, tmp_path):
    """Raising the under-replication limit to 15 minutes: the test's alert at
    13 minutes is missing, and promtool says so."""
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    text = RULES.read_text()
    assert "underreplicated_oldest_seconds) > 600" in text
    (tmp_path / "alerts.yml").write_text(text.replace("oldest_seconds) > 600",
                                                      "oldest_seconds) > 900"))
    proc = _promtool(tool, "test", "rules", RULE_TESTS.name, cwd=tmp_path)
    assert proc.returncode != 0
    assert "alertname: LedgersUnderReplicated, time: 13m" in proc.stdout + proc.stderr


def test_the_example_scrape_config_is_valid_and_scrapes_every_three_host_bookie(tool):
    from appliance.config import load_config

    proc = _promtool(tool, "check", "config", RULES_DIR / "prometheus.yml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    hosts = sorted((RULES_DIR.parent / "three-host").glob("host*.toml"))
    assert hosts
    addresses = {b.metrics_address for h in hosts for b in load_config(h).bookies}
    targets = set(re.findall(r'"(\d+\.\d+\.\d+\.\d+:\d+)"',
                             (RULES_DIR / "prometheus.yml").read_text().split("# Applications")[0]))
    assert targets == addresses
