"""ZeroMQ wire protocol and transports (layouts: ``ipc/PROTOCOL.md``).

* ``ipc.frames``: version, op codes, flags, fixed header layouts, limits;
* ``ipc.requests`` / ``ipc.replies``: one class per op, pure encode/decode;
* ``ipc.server``: ``FrameServer``, the bookie-side ROUTER loop (deferred
  replies, extra fds, timers);
* ``ipc.client``: ``Transport``, DEALERs to many bookies behind one I/O thread;
  its state lives in ``ipc.request_table`` (requests, deadlines, ``Event``)
  and ``ipc.bookie_connections`` (sockets, reconnects, heartbeats, CURVE);
* ``ipc.curve``: CURVE on tcp: key files and directories, the bookie's ZAP
  handler, socket options;
* ``ipc.memserver``: an in-memory bookie (test double, fuzz/bench target);
* ``ipc.bench``: round-trip benchmark.
"""
