"""Scenario traces (``tests/sim/testdata/*.txt``): each file tells one
scenario step by step with what the real cores did under every step; the
test replays it through the scripted simulation and compares line by line.

``UPDATE_TRACES=1 pytest tests/sim/test_traces.py`` rewrites the expected
output in place (comments and commands are kept).  Without it, any
difference fails with a unified diff; so does a violation the checker
reports that the file does not expect (``expect-violation NAME``).
How to read and add a trace: docs/PROTOCOL_CORE.md, "Scenario traces".
"""

import difflib
import os
from pathlib import Path

import pytest

from tests.sim.trace import TraceError, parse, render, run_trace

TESTDATA = Path(__file__).parent / "testdata"
TRACES = sorted(TESTDATA.glob("*.txt"))


def test_there_are_traces():
    assert len(TRACES) >= 2


@pytest.mark.parametrize("path", TRACES, ids=[p.stem for p in TRACES])
def test_trace(path):
    text = path.read_text()
    items, outputs, problems = run_trace(text)
    actual = render(items, outputs)
    if os.environ.get("UPDATE_TRACES") == "1":
        if actual != text:
            path.write_text(actual)
    elif actual != text:
        diff = difflib.unified_diff(text.splitlines(), actual.splitlines(),
                                    f"{path.name} (expected)", f"{path.name} (actual)",
                                    lineterm="")
        pytest.fail("the trace differs (UPDATE_TRACES=1 rewrites it):\n" + "\n".join(diff),
                    pytrace=False)
    assert problems == [], f"{path.name}: " + "; ".join(problems)


def test_rendering_a_parsed_file_gives_it_back():
    text = "# a comment\n\ncreate E=1 Qw=1 Qa=1\n----\nline one\nline two\n\n# end\n"
    items = parse(text)
    outputs = [item.expected for item in items if not isinstance(item, str)]
    assert render(items, outputs) == text


LOST_ACK = """create E=3 Qw=3 Qa=2 disable=recovery-read-fence
----

drop SendAdd dst=bookie-1 entry=0
----

hold SendAdd dst=bookie-3 entry=0
----

add 1
----

run 10
----

drop SendReadLac dst=bookie-3 fence=true
----

recover
----

run 50
----

release
----

run 50
----
"""


def test_a_violation_the_file_does_not_expect_is_a_problem():
    _, outputs, problems = run_trace(LOST_ACK)
    assert outputs[-1][-1].startswith("VIOLATION ack-after-close")
    assert len(problems) == 1 and "expect-violation ack-after-close" in problems[0]
    _, _, problems = run_trace(LOST_ACK + "\nexpect-violation ack-after-close\n----\n")
    assert problems == []


def test_expecting_a_violation_that_did_not_happen_fails():
    text = "create E=1 Qw=1 Qa=1\n----\n\nexpect-violation no-divergence\n----\n"
    with pytest.raises(TraceError, match="line 4: expect-violation.*reported none"):
        run_trace(text)


@pytest.mark.parametrize("text,message", [
    ("add 1\n----\n", "before any 'create'"),
    ("create E=1 Qw=1 Qa=1\n----\n\nfly\n----\n", "unknown command 'fly'"),
    ("create E=1 Qw=1 Qa=1\n\n", "must be followed by a '----' line"),
    ("create E=1 Qw=1 Qa=1\n----\n\ndrop Nothing\n----\n", "no message kind 'Nothing'"),
])
def test_a_malformed_file_is_refused(text, message):
    with pytest.raises(TraceError, match=message):
        run_trace(text)


def test_a_run_prints_one_line_per_event_and_ok_when_nothing_happened():
    _, outputs, _ = run_trace("create E=1 Qw=1 Qa=1\n----\n\nrun 10\n----\n\nadd 1\n----\n\n"
                              "run 10\n----\n")
    assert outputs[1] == ["ok"]
    assert outputs[3] == ["writer->bookie-1 SendAdd rq=1 entries=0",
                          "bookie-1->writer AddResponse rq=1 entry=0 OK",
                          "writer: CompleteAdds entries=0 LAC=0"]
