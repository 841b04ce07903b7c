"""Polling and port helpers for tests (import from tests.helpers)."""

from __future__ import annotations

import socket
import time


def wait_for(predicate, timeout_s: float = 10.0, interval_s: float = 0.01, what: str = ""):
    """Poll ``predicate`` until it returns a truthy value or the deadline passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s}s waiting for {what or predicate}")
        time.sleep(interval_s)


def free_tcp_port() -> int:
    """A port the kernel just handed out (bind to 0), for servers that need a number."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
