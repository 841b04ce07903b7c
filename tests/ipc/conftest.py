"""Fixtures for the wire tests: an in-memory bookie in a real subprocess
(``python -m ipc.memserver``) and a FrameServer on a thread, both always
stopped by the test that started them, also on failure."""

from __future__ import annotations

import pytest
import zmq

from ipc.memserver import MemoryBookie
from ipc.server import FrameServer
from tests.ipc.support import ServerProcess, ThreadServer


@pytest.fixture
def server_process(short_tmp):
    """Factory: ``server_process(*args)`` starts a memserver; all are stopped after."""
    started: list[ServerProcess] = []

    def make(*args: str, endpoint: str | None = None) -> ServerProcess:
        sp = ServerProcess(endpoint or f"ipc://{short_tmp}/b{len(started)}.sock", *args)
        started.append(sp)
        return sp.start()

    yield make
    for sp in started:
        sp.stop()


@pytest.fixture
def thread_server(short_tmp):
    """Factory: ``thread_server(handler=None, start=True, **kw)`` -> ThreadServer
    (default handler: a MemoryBookie attached to the server)."""
    started: list[ThreadServer] = []

    def make(handler=None, start: bool = True, endpoint: str | None = None, **kwargs):
        handler = handler or MemoryBookie()
        server = FrameServer(endpoint or f"ipc://{short_tmp}/t{len(started)}.sock", handler,
                             **kwargs)
        if hasattr(handler, "attach"):
            handler.attach(server)
        ts = ThreadServer(server)
        started.append(ts)
        return ts.start() if start else ts

    yield make
    for ts in started:
        if ts.thread.is_alive():
            ts.stop()
        else:
            ts.server.close()


@pytest.fixture
def dealer():
    """Factory for raw DEALER sockets (linger 0), all closed after the test."""
    ctx = zmq.Context()
    socks = []

    def make(endpoint: str) -> zmq.Socket:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        socks.append(sock)
        return sock

    yield make
    for sock in socks:
        sock.close(linger=0)
    ctx.term()
