"""The log owner core's trace files (tests/protocol/testdata/log_owner_*.txt):
every command's actions are what the file says (``log_owner_trace``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.protocol.log_owner_trace import Trace, parse

FILES = sorted((Path(__file__).parent / "testdata").glob("log_owner_*.txt"))


def test_there_are_trace_files():
    assert FILES


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_trace(path):
    trace = Trace()
    for command, expected in parse(path.read_text()):
        assert trace.run(command) == expected, f"{path.name}: {command}"
