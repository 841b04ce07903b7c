"""Helpers for the wire tests: a memserver subprocess, a FrameServer on a
thread, and a bounded receive."""

from __future__ import annotations

import selectors
import signal
import subprocess
import sys
import threading
import time

import zmq

from appliance.bench.launcher import spawn, stop_process, wait_started
from ipc.server import FrameServer

READY_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 10.0  # SIGTERM, then SIGKILL after this long


class ServerProcess:
    """A ``python -m ipc.memserver`` subprocess; ``start()`` waits for READY.
    Started, waited for and stopped with the launcher's helpers, like the
    bookies of ``tests.support.launch``."""

    def __init__(self, endpoint: str, *extra_args: str):
        self.endpoint = endpoint
        self.args = extra_args
        self.proc: subprocess.Popen | None = None

    def start(self) -> ServerProcess:
        cmd = [sys.executable, "-m", "ipc.memserver", "--endpoint", self.endpoint, *self.args]
        self.proc = spawn(cmd, stdout=subprocess.PIPE, text=True, start_new_session=False)
        try:
            with selectors.DefaultSelector() as sel:
                sel.register(self.proc.stdout, selectors.EVENT_READ)
                wait_started(self.proc, lambda: sel.select(0), "memserver", None,
                             READY_TIMEOUT_S)
            line = self.proc.stdout.readline()
            if not line.startswith("READY "):
                raise RuntimeError(f"memserver failed to start: {line!r}")
        except BaseException:
            self.stop()
            raise
        self.endpoint = line.split()[1]
        return self

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        stop_process(self.proc, STOP_TIMEOUT_S, signal.SIGKILL)

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        stop_process(self.proc, STOP_TIMEOUT_S)
        self.proc.stdout.close()
        return self.proc.returncode


class ThreadServer:
    """A FrameServer serving on a background thread."""

    def __init__(self, server: FrameServer):
        self.server = server
        self.thread = threading.Thread(target=server.serve, daemon=True)

    def start(self) -> ThreadServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.stop()
        self.thread.join(timeout=10)
        assert not self.thread.is_alive(), "FrameServer.serve did not return after stop()"
        self.server.close()


def recv_within(sock: zmq.Socket, timeout_s: float = 10.0) -> list[bytes]:
    """One multipart message, or TimeoutError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        remaining_ms = int((deadline - time.monotonic()) * 1000)
        if remaining_ms <= 0:
            raise TimeoutError(f"no message within {timeout_s}s")
        if sock.poll(remaining_ms):
            return sock.recv_multipart()


def exchange_windowed(sock: zmq.Socket, messages, window: int,
                      reply_timeout_s: float = 20.0) -> tuple[int, list]:
    """Send every message of ``messages`` (an iterable of frame lists), at most
    ``window`` unanswered at a time, and decode one reply per message.

    Returns (messages sent, decoded replies in arrival order); a reply that
    does not decode raises, a missing one raises TimeoutError.
    """
    from ipc.replies import decode_reply

    it = iter(messages)
    sent, replies = 0, []
    more = True
    while more or len(replies) < sent:
        while more and sent - len(replies) < window:
            frames = next(it, None)
            if frames is None:
                more = False
                break
            sock.send_multipart(frames)
            sent += 1
        if len(replies) < sent:
            replies.append(decode_reply(recv_within(sock, reply_timeout_s)))
    return sent, replies
