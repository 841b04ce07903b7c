"""A TCP relay that adds a fixed one-way delay, for kernels without netem.

Run inside a host namespace: iptables ``REDIRECT`` sends the host's incoming
connections to its bookie ports here; the relay learns each connection's
original destination (``SO_ORIGINAL_DST``), connects to it itself (a local
connection, which ``PREROUTING`` does not redirect again) and copies bytes
both ways, each chunk leaving ``delay_ms`` after it arrived, in order.  So
every client-to-bookie round trip gains twice the delay, as ``tc netem
delay`` on every host's link would give.  It costs CPU per chunk (Python),
so it measures latency with few adds in flight, not throughput; a run with
``--delay-ms 0`` through the same relay is the baseline.

    python -m tests.harness.delay_relay --port 4181 --delay-ms 1 --ready-file F
    python -m tests.harness.delay_relay --port 0 --host 127.0.0.1 --target 127.0.0.1:9000 \
        --delay-ms 1 --ready-file F      # a fixed target, no iptables (tests)
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import struct
from pathlib import Path

SO_ORIGINAL_DST = 80  # linux/netfilter_ipv4.h
CHUNK_BYTES = 256 * 1024


async def _pump(reader, writer, delay_s: float) -> None:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()

    async def send() -> None:
        while True:
            due, data = await queue.get()
            if data is None:
                break
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
        writer.close()

    sender = asyncio.create_task(send())
    try:
        while data := await reader.read(CHUNK_BYTES):
            queue.put_nowait((loop.time() + delay_s, data))
    except ConnectionError:
        pass
    queue.put_nowait((0.0, None))
    try:
        await sender
    except ConnectionError:
        pass


def _original_destination(sock: socket.socket) -> tuple[str, int]:
    raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    port, = struct.unpack_from("!H", raw, 2)
    return socket.inet_ntoa(raw[4:8]), port


async def _serve(port: int, delay_s: float, ready_file: str | None,
                 target: tuple[str, int] | None = None, host: str = "0.0.0.0") -> None:
    async def handle(reader, writer) -> None:
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            up_reader, up_writer = await asyncio.open_connection(
                *(target or _original_destination(sock)))
        except OSError:
            writer.close()
            return
        up_writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.gather(_pump(reader, up_writer, delay_s), _pump(up_reader, writer, delay_s))

    server = await asyncio.start_server(handle, host, port)
    if ready_file:  # the bound port (port 0 picks one)
        Path(ready_file).write_text(str(server.sockets[0].getsockname()[1]))
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay-ms", type=float, required=True)
    parser.add_argument("--ready-file", help="written with the bound port once listening")
    parser.add_argument("--target", help="host:port to relay to (default: each "
                                         "connection's original destination)")
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on")
    args = parser.parse_args()
    target = None
    if args.target:
        host, _, port = args.target.rpartition(":")
        target = (host, int(port))
    asyncio.run(_serve(args.port, args.delay_ms / 1000.0, args.ready_file, target, args.host))


if __name__ == "__main__":
    main()
