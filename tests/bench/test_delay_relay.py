"""The delay relay (``tests.harness.delay_relay``), the stand-in for
``tc netem`` on kernels without it: bytes cross it intact and in order, and
each direction arrives no earlier than the delay after it was sent.  On
loopback with a fixed target (the namespace benches reach it through
iptables REDIRECT instead)."""

from __future__ import annotations

import socket
import sys
import threading
import time

from appliance.bench.launcher import spawn, stop_process, wait_for
from tests.harness import module_env

DELAY_MS = 40


def _echo_server() -> tuple[socket.socket, threading.Thread]:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return srv, thread


def test_bytes_cross_intact_in_order_and_each_way_is_delayed(tmp_path):
    srv, thread = _echo_server()
    ready = tmp_path / "ready"
    relay = spawn([sys.executable, "-m", "tests.harness.delay_relay", "--port", "0",
                   "--host", "127.0.0.1", "--delay-ms", str(DELAY_MS), "--ready-file",
                   str(ready), "--target", f"127.0.0.1:{srv.getsockname()[1]}"],
                  tmp_path / "relay.log", env=module_env())
    try:
        wait_for(lambda: ready.exists() and ready.read_text(), 30, what="the relay")
        port = int(ready.read_text())
        with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
            payload = bytes(range(256)) * 400  # 100 KB: several chunks
            started = time.monotonic()
            c.sendall(payload)
            got = b""
            while len(got) < len(payload):
                got += c.recv(65536)
            elapsed_ms = (time.monotonic() - started) * 1000
        assert got == payload
        assert elapsed_ms >= 2 * DELAY_MS  # there and back, each delayed
    finally:
        stop_process(relay)
        srv.close()
        thread.join(5)
