"""Wire fuzz against a server in a real subprocess: 10,000 random, truncated
and mutated messages; every one gets exactly one reply, the process keeps
its pid and serves correctly afterwards.

The target is ``python -m ipc.memserver`` (FrameServer + an in-memory
handler); when the bookie server lands the same test is pointed at it.
"""

from __future__ import annotations

import random
import socket
import struct

import zmq
from zmq.utils.monitor import recv_monitor_message

from appliance.errors import OK, BadRequestError, ProtocolVersionError
from ipc.frames import ADD_ROW, VERSION, Op
from ipc.replies import ErrorReply, decode_reply
from ipc.requests import (
    AddBatchRequest,
    AddItem,
    AddRequest,
    InfoRequest,
    PingRequest,
    ReadBatchRequest,
    ReadLacRequest,
    ReadRequest,
    WaitLacRequest,
    encode_request,
)
from tests.ipc.support import exchange_windowed, recv_within

MESSAGES = 10_000
WINDOW = 64
KEY = bytes(range(32))


def _valid(rng: random.Random) -> list[bytes]:
    ledger, entry = rng.randrange(4), rng.randrange(8)
    choices = [
        lambda: PingRequest(),
        lambda: AddRequest(ledger, entry, KEY, rng.randbytes(rng.randrange(64))),
        lambda: ReadRequest(ledger, entry, fence=rng.random() < 0.2, master_key=KEY),
        lambda: ReadLacRequest(ledger, master_key=KEY if rng.random() < 0.5 else None),
        lambda: WaitLacRequest(ledger, entry, rng.randrange(30),
                               master_key=KEY if rng.random() < 0.5 else None),
        lambda: AddBatchRequest([AddItem(ledger, entry + i, KEY, b"b" * i)
                                 for i in range(1, rng.randrange(2, 6))]),
        lambda: ReadBatchRequest(ledger, entry, entry + 5, 4, 4096,
                                 master_key=KEY if rng.random() < 0.5 else None),
    ]
    request = rng.choice(choices)()
    request.request_id = rng.randrange(2**64)
    return [bytes(f) for f in encode_request(request)]


def _garbage(rng: random.Random) -> list[bytes]:
    kind = rng.randrange(7)
    if kind == 0:  # random frames
        return [rng.randbytes(rng.randrange(80)) for _ in range(rng.randrange(1, 5))]
    frames = _valid(rng)
    head = bytearray(frames[0])
    if kind == 1:  # truncated header
        return [bytes(head[: rng.randrange(len(head))]), *frames[1:]]
    if kind == 2:  # a frame dropped or added
        return frames[:-1] if len(frames) > 1 else [*frames, rng.randbytes(8)]
    if kind == 3:  # one byte of the header mutated
        head[rng.randrange(len(head))] = rng.randrange(256)
        return [bytes(head), *frames[1:]]
    if kind == 4:  # unknown version or op
        head[rng.choice((0, 1))] = rng.choice((0, 2, 9, 77, 255))
        return [bytes(head), *frames[1:]]
    if kind == 5:  # ADD_BATCH whose count disagrees with its frames
        count = rng.choice((0, 3, 1025, 2**32 - 1))
        head = struct.pack("!BBHQQqI", VERSION, Op.ADD_BATCH, 0, 1, 0, -1, count)
        return [head, ADD_ROW.pack(1, 0, KEY) * 2, b"x", b"y"]
    return [bytes(head) + rng.randbytes(rng.randrange(1, 9)), *frames[1:]]  # trailing junk


def _fuzz_messages(seed: int, count: int):
    rng = random.Random(seed)
    for i in range(count):
        yield _valid(rng) if i % 10 == 0 else _garbage(rng)


def test_ten_thousand_bad_frames_leave_the_server_serving(server_process, dealer):
    server = server_process("--wait-lac-timeout-ms-max", "50")
    pid = server.pid
    sock = dealer(server.endpoint)
    sent, replies = exchange_windowed(sock, _fuzz_messages(seed=20240611, count=MESSAGES),
                                      WINDOW)
    rejected = sum(isinstance(r, ErrorReply) and r.status in (
        BadRequestError.code, ProtocolVersionError.code) for r in replies)
    assert sent == len(replies) == MESSAGES
    assert sock.poll(100) == 0, "a message got more than one reply"
    assert server.alive() and server.pid == pid

    sock.send_multipart(encode_request(InfoRequest(request_id=1)))
    info = decode_reply(recv_within(sock)).info
    assert info["pid"] == pid
    assert info["counters"]["bad_messages"] == rejected > MESSAGES // 2

    payload = b"still serving"
    sock.send_multipart(encode_request(AddRequest(999, 0, KEY, payload, request_id=2)))
    assert decode_reply(recv_within(sock)).status == OK
    sock.send_multipart(encode_request(ReadRequest(999, 0, request_id=3)))
    read = decode_reply(recv_within(sock))
    assert read.request_id == 3 and bytes(read.data) == payload


def test_non_zmtp_garbage_on_the_tcp_port_does_not_hurt(server_process, dealer):
    server = server_process(endpoint="tcp://127.0.0.1:0")
    host, port = server.endpoint.removeprefix("tcp://").rsplit(":", 1)
    rng = random.Random(7)
    for _ in range(50):
        with socket.create_connection((host, int(port)), timeout=5) as raw:
            raw.sendall(rng.randbytes(rng.randrange(1, 512)))
    sock = dealer(server.endpoint)
    sock.send_multipart(encode_request(PingRequest(request_id=42)))
    assert decode_reply(recv_within(sock)).request_id == 42
    assert server.alive()


def test_oversize_frames_drop_the_peer_not_the_server(server_process, dealer):
    server = server_process()
    greedy = dealer(server.endpoint)
    monitor = greedy.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    try:
        greedy.send_multipart([bytes(80 * 1024 * 1024)])  # over MAXMSGSIZE
        event = recv_monitor_message(monitor) if monitor.poll(20000) else {}
        assert event.get("event") == zmq.EVENT_DISCONNECTED, "the server kept the peer"
    finally:
        greedy.disable_monitor()
        monitor.close(linger=0)
    polite = dealer(server.endpoint)
    polite.send_multipart(encode_request(PingRequest(request_id=5)))
    assert decode_reply(recv_within(polite)).request_id == 5
    polite.send_multipart(encode_request(InfoRequest(request_id=6)))
    counters = decode_reply(recv_within(polite)).info["counters"]
    # The 80 MiB frame never reached the Python loop: only PING and INFO did.
    assert counters["requests"] == 2 and counters["bad_messages"] == 0
    assert server.alive()
