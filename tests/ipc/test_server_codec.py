"""FrameServer with a codec of its own (``ipc.server.WireCodec``): the loop,
its guards and its thread-safe ``wake`` serve another wire than the
bookie's (the log service's servers use this)."""

from __future__ import annotations

import threading

from appliance.errors import BadRequestError
from tests.ipc.support import recv_within
from tests.support.launch import wait_for


class UpperWire:
    """Requests are one frame ``b"up:<text>"``; replies are one frame."""

    @staticmethod
    def decode(frames, limits):
        if len(frames) != 1 or not frames[0].bytes.startswith(b"up:"):
            raise BadRequestError("want one frame starting up:")
        return frames[0].bytes[3:]

    @staticmethod
    def encode(reply, limits):
        return [reply]

    @staticmethod
    def rejection(frames, exc):
        return b"bad:" + str(exc).encode()

    @staticmethod
    def failure(request, exc, counters):
        counters["handler_failures"] += 1
        return b"failed:" + str(exc).encode()


class Upper:
    """Answers at once, or (``later:``) parks the request: the test's thread
    queues its answer later and wakes the loop, whose ``after_step`` sends it."""

    def __init__(self):
        self.server = None
        self.queued: list = []
        self.lock = threading.Lock()  # the test's thread appends, the loop's takes
        self.parked = None  # (peer, text, steps when parked): the loop's thread
        self.steps = 0

    def handle(self, peer, text):
        if text == b"boom":
            raise ValueError("boom")
        if text.startswith(b"later:"):
            self.parked = (peer, text[6:], self.steps)
            return None
        return text.upper()

    def queue(self, peer, text):
        with self.lock:
            self.queued.append((peer, text))
        self.server.wake()

    def after_step(self):
        self.steps += 1
        with self.lock:
            queued, self.queued = self.queued, []
        for peer, text in queued:
            self.server.send_reply(peer, b"later:" + text.upper())


def test_a_codec_of_its_own_is_used_for_requests_replies_and_errors(thread_server, dealer):
    handler = Upper()
    ts = thread_server(handler, codec=UpperWire(), poll_ms_max=60_000)
    handler.server = ts.server
    sock = dealer(ts.server.endpoint)
    sock.send(b"up:hello")
    assert recv_within(sock) == [b"HELLO"]
    sock.send(b"nonsense")
    assert recv_within(sock)[0].startswith(b"bad:want one frame")
    sock.send(b"up:boom")
    assert recv_within(sock) == [b"failed:boom"]
    wait_for(lambda: ts.server.counters["handler_failures"] == 1, what="failure counted")
    assert ts.server.counters["bad_messages"] == 1
    # parked, and the loop's turn over (it now polls for a minute): only
    # wake() from this thread gets the answer out
    sock.send(b"up:later:quiet")
    wait_for(lambda: handler.parked is not None and handler.steps > handler.parked[2],
             what="the request parked and its turn over")
    peer, text, _ = handler.parked
    handler.queue(peer, text)
    assert recv_within(sock) == [b"later:QUIET"]
