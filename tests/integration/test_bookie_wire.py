"""The real bookie process on the wire: 10,000 random, truncated and mutated
messages; it keeps its pid, answers each message once, and serves correctly
afterwards (a durable add, a read, a fenced add refused)."""

from __future__ import annotations

import zmq

from appliance.checks.digest import make_digest, master_key
from appliance.errors import OK, LedgerFencedError, UnauthorizedError
from appliance.protocol.entry import pack_entry
from ipc.replies import ErrorReply, decode_reply
from ipc.requests import AddRequest, InfoRequest, ReadRequest, encode_request
from tests.ipc.support import exchange_windowed, recv_within
from tests.ipc.test_fuzz import MESSAGES, WINDOW, _fuzz_messages


def test_ten_thousand_bad_frames_leave_the_bookie_serving(make_cluster):
    # mutated WAIT_LAC timeouts would park up to the bound: keep it short
    cluster = make_cluster(1, quorums=(1, 1, 1), server={"wait_lac_timeout_ms_max": 50})
    bookie = cluster.config.bookies[0]
    pid = cluster.procs[bookie.id].pid
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(bookie.endpoint)
        sent, replies = exchange_windowed(sock, _fuzz_messages(seed=7, count=MESSAGES), WINDOW)
        assert sent == len(replies) == MESSAGES
        assert sock.poll(100) == 0, "a message got more than one reply"
        assert cluster.procs[bookie.id].poll() is None

        sock.send_multipart(encode_request(InfoRequest(request_id=1)))
        info = decode_reply(recv_within(sock)).info
        assert info["pid"] == pid and info["counters"]["bad_messages"] > MESSAGES // 2

        key = master_key(b"pw")
        record = pack_entry(4242, 0, -1, 5, b"hello", make_digest("crc32c", key))
        sock.send_multipart(encode_request(AddRequest(4242, 0, key, record, request_id=2)))
        assert decode_reply(recv_within(sock)).status == OK
        sock.send_multipart(encode_request(ReadRequest(4242, 0, master_key=key, request_id=3)))
        assert bytes(decode_reply(recv_within(sock)).data) == record
        wrong = master_key(b"other")
        sock.send_multipart(encode_request(AddRequest(4242, 1, wrong, record, request_id=4)))
        assert decode_reply(recv_within(sock)).status == UnauthorizedError.code
        sock.send_multipart(encode_request(ReadRequest(4242, 0, True, key, request_id=5)))
        assert decode_reply(recv_within(sock)).status == OK
        again = pack_entry(4242, 1, 0, 10, b"fenced", make_digest("crc32c", key))
        sock.send_multipart(encode_request(AddRequest(4242, 1, key, again, request_id=6)))
        reply = decode_reply(recv_within(sock))
        assert isinstance(reply, ErrorReply) and reply.status == LedgerFencedError.code
    finally:
        sock.close(linger=0)
        ctx.term()
