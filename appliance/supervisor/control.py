"""The supervisor's control channel: ``bkctl`` asks a running supervisor to
start, stop or restart one of its processes (``bkctl bookie start|stop|
restart ID``, ``bkctl log-server ...``, and ``bkctl bookie fix-cookie ID``
on a running appliance).

Before this channel, ``bkctl`` reached a running supervisor only through
its state file (``supervisor.json``: pids) and signals (``bkctl down``:
SIGTERM); one process could not be brought back without stopping them all.

Wire: a ZeroMQ ROUTER socket the supervisor binds at
``ipc://<run_dir>/supervisor.sock`` (no port; the socket file is 0600 in
an owner-only run folder, docs/SECURITY.md: only the appliance's account
can ask).
One request is one frame of JSON ``{"op": "start" | "stop" | "restart",
"id": PROCESS_ID}``; the reply is one frame of JSON: ``{"ok": true, "id",
"pid", "note"}`` or ``{"ok": false, "error": ONE_LINE}``.  A malformed
request gets an error reply, never a crash.

``ask`` (the client side) never hangs: one DEALER socket, one receive with
a deadline, closed on every path.  ``ControlSocket`` (the server side) is
driven by the supervisor's one watch thread, which owns the process table:
requests are answered there, between watches, never concurrently with one.
"""

from __future__ import annotations

import json
import os

import zmq

from appliance.protocol import limits
from ipc.server import restrict_socket_file
from ipc.wake import WakePipe

SOCKET_NAME = "supervisor.sock"
OPS = ("start", "stop", "restart")


def control_endpoint(config) -> str:
    """Where the supervisor of ``config`` listens: ipc:// in its run folder."""
    return f"ipc://{config.run_path / SOCKET_NAME}"


def control_unavailable(config) -> str | None:
    """Why the supervisor of ``config`` can take no requests (its socket
    path is too long for a unix socket), or None.  The supervisor then runs
    without the channel rather than not at all."""
    path = os.path.abspath(config.run_path / SOCKET_NAME)
    if len(path.encode()) <= limits.IPC_PATH_BYTES_MAX:
        return None
    return (f"its control socket {path} is over {limits.IPC_PATH_BYTES_MAX} bytes: set "
            "[supervisor] run_dir to a shorter folder and restart the appliance "
            "(bkctl down, bkctl up)")


def ask(config, op: str, process_id: str, timeout_ms: int,
        context: zmq.Context | None = None) -> dict | None:
    """Send one request to the supervisor of ``config``; its reply, or None
    if it did not answer within ``timeout_ms``."""
    ctx = context or zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    try:
        sock.connect(control_endpoint(config))
        sock.send(json.dumps({"op": op, "id": process_id}).encode())
        if not sock.poll(timeout_ms, zmq.POLLIN):
            return None
        return json.loads(sock.recv())
    except (zmq.ZMQError, ValueError):
        return None
    finally:
        sock.close(linger=0)


def parse_request(frame: bytes) -> tuple[str, str] | str:
    """(op, process id) of a request frame, or the one-line reason it is refused."""
    if len(frame) > limits.SUPERVISOR_CONTROL_REQUEST_BYTES_MAX:
        return (f"request of {len(frame)} bytes refused "
                f"(at most {limits.SUPERVISOR_CONTROL_REQUEST_BYTES_MAX})")
    try:
        doc = json.loads(frame)
    except ValueError:
        return "request is not JSON"
    if not isinstance(doc, dict) or doc.get("op") not in OPS or \
            not isinstance(doc.get("id"), str):
        return f"request must be {{\"op\": one of {', '.join(OPS)}, \"id\": a process id}}"
    return doc["op"], doc["id"]


class ControlSocket:
    """The supervisor's end: bound at ``control_endpoint(config)``; ``wake()``
    (any thread, or a signal handler) ends a ``wait`` early.  Without a
    socket (``unavailable``: see ``control_unavailable``) a ``wait`` only
    waits."""

    def __init__(self, config, context: zmq.Context | None = None):
        self._path = config.run_path / SOCKET_NAME
        self._path.unlink(missing_ok=True)  # left by a supervisor that died
        self._wake = WakePipe()
        self._poller = zmq.Poller()
        self._poller.register(self._wake.fd, zmq.POLLIN)
        self.unavailable = control_unavailable(config)
        self._sock = None
        if self.unavailable is None:
            self._sock = (context or zmq.Context.instance()).socket(zmq.ROUTER)
            self._sock.linger = 0
            self._sock.bind(control_endpoint(config))
            restrict_socket_file(str(self._path))  # 0600: the appliance's account alone
            self._poller.register(self._sock, zmq.POLLIN)

    def wake(self) -> None:
        self._wake.wake()

    def wait(self, timeout_ms: int, handle) -> None:
        """Wait up to ``timeout_ms`` for requests (or a wake); answer each
        with ``handle(op, process_id) -> dict``."""
        ready = dict(self._poller.poll(max(0, timeout_ms)))
        if self._wake.fd in ready:
            self._wake.drain()
        if self._sock is None:
            return
        for _ in range(limits.SUPERVISOR_CONTROL_REQUESTS_PER_WAIT_MAX):
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) != 2:
                continue  # not a DEALER's one-frame request: nothing to answer
            parsed = parse_request(frames[1])
            reply = {"ok": False, "error": parsed} if isinstance(parsed, str) \
                else handle(*parsed)
            self._sock.send_multipart([frames[0], json.dumps(reply).encode()])

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close(linger=0)
            self._path.unlink(missing_ok=True)
        self._wake.close()
