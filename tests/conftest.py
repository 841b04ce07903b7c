"""Shared fixtures.  Tests never sleep to wait for something: they poll with a
deadline (``tests.support.launch.wait_for``).  No fixed ports: ipc:// under a temp
dir, or port 0."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

pytest_plugins = ["tests.support.launch", "tests.support.zookeeper"]


@pytest.fixture
def short_tmp():
    """A short temp dir: ipc:// socket paths must stay under ~100 bytes."""
    d = Path(tempfile.mkdtemp(prefix="bk"))
    yield d
    shutil.rmtree(d, ignore_errors=True)
