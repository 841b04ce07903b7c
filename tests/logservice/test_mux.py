"""Multi-log requests against a real log server (a raw DEALER socket speaks
the wire): each section is answered alone, routed to its log and producer
(written, not_owner with the owner's endpoint, bad for a malformed one); a
message sent twice stores its records once; a malformed message is one
"bad" answer; a single-log write is still understood."""

from __future__ import annotations

import json
import time

import pytest
import zmq

import appliance
from appliance.protocol.log_service import (
    MUX_REPLY_KIND,
    WRITTEN_KIND,
    decode_header,
    decode_mux_reply,
    decode_written,
    encode_header,
    encode_mux,
    encode_write,
    owner_of,
)
from tests.logservice.support import LogServers, read_all
from tests.support.launch import wait_registered

P1, P2, P3 = b"\x01" * 16, b"\x02" * 16, b"\x03" * 16
ANSWER_TIMEOUT_S = 60.0  # a bound on a loaded machine, not a target


@pytest.fixture
def service(make_cluster):
    cluster = make_cluster(3, quorums=(3, 3, 2), autorecovery={"enabled": False})
    with appliance.connect(str(cluster.config_path)) as bk:
        wait_registered(bk, 3)
        servers = LogServers(cluster, bk)
        ctx = zmq.Context()
        try:
            servers.start("logserver-1")
            servers.start("logserver-2")
            yield bk, servers, ctx
        finally:
            ctx.destroy(linger=0)
            servers.kill_all()


def _name_on(server: str, prefix: str) -> str:
    return next(f"{prefix}{i}" for i in range(1000)
                if owner_of(f"{prefix}{i}", ["logserver-1", "logserver-2"]) == server)


def _answers(sock, want: set, timeout_s: float = ANSWER_TIMEOUT_S) -> dict:
    """The routed answers received until every (log, pid) of ``want`` has one
    (the last of each kept), as {(log, pid): reply frame}."""
    got: dict = {}
    deadline = time.monotonic() + timeout_s
    while not want <= set(got):
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"no answer for {want - set(got)}"
        if sock.poll(int(remaining * 1000)):
            frame = sock.recv()
            assert frame[0] == MUX_REPLY_KIND, frame[:200]
            for name, pid, reply in decode_mux_reply(frame, 4096, 1 << 24):
                got[name.decode(), pid] = reply
    return got


def test_a_multi_log_request_is_answered_section_by_section(service):
    bk, servers, ctx = service
    mine, other = _name_on("logserver-1", "mine"), _name_on("logserver-2", "other")
    registered = servers.registry.servers()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(registered["logserver-1"]["endpoint"])
    message = encode_mux([
        encode_write(mine.encode(), P1, 1, 1, 1, [b"r0", b"r1"]),
        encode_write(other.encode(), P1, 1, 1, 1, [b"elsewhere"]),
        encode_write(mine.encode(), P2, 1, 1, 1, [b"cut short"])[:-3],
        encode_header({"op": "hello", "log": mine, "pid": P3.hex(), "gen": 1}),
    ])
    # the first answers for ``mine`` are "retry" (the server takes the log over)
    deadline = time.monotonic() + ANSWER_TIMEOUT_S
    while True:
        sock.send(message)
        got = _answers(sock, {(mine, P1), (other, P1), (mine, P2), (mine, P3)})
        if got[mine, P1][0] == WRITTEN_KIND:
            break
        assert json.loads(got[mine, P1])["code"] == "retry"
        assert time.monotonic() < deadline, "the log was not taken over"
    gen, seq, runs = decode_written(got[mine, P1])
    assert (gen, seq, [n for *_, n in runs]) == (1, 1, [2])
    redirect = json.loads(got[other, P1])
    assert (redirect["code"], redirect["owner"], redirect["endpoint"]) == \
        ("not_owner", "logserver-2", registered["logserver-2"]["endpoint"])
    assert json.loads(got[mine, P2])["code"] == "bad"
    hello = decode_header(got[mine, P3])
    assert hello["op"] in ("hello", "error")  # answered (hello once the log is open)

    # the same message again (a retry): the records are answered, not stored again
    sock.send(message)
    again = _answers(sock, {(mine, P1), (other, P1), (mine, P2), (mine, P3)})
    assert decode_written(again[mine, P1]) == (gen, seq, runs)
    assert decode_header(again[mine, P3]) == {"op": "hello", "log": mine, "pid": P3.hex(),
                                               "gen": 1, "next_seq": None}

    # a malformed message: one "bad" answer for the whole of it
    sock.send(message[:-1])
    assert sock.poll(int(ANSWER_TIMEOUT_S * 1000))
    bad = json.loads(sock.recv())
    assert bad["op"] == "error" and bad["code"] == "bad" and "multi-log" in bad["message"]

    # a single-log write (the older form) is still understood, on the same socket
    sock.send(encode_write(mine.encode(), P1, 2, 3, 3, [b"r2"]))
    assert sock.poll(int(ANSWER_TIMEOUT_S * 1000))
    single = sock.recv()
    assert single[0] == WRITTEN_KIND and decode_written(single)[:2] == (2, 3)
    sock.close()
    records = read_all(bk, mine, 3, nothing_more=True)
    assert [r.payload for r in records] == [b"r0", b"r1", b"r2"]
