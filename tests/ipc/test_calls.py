"""``ipc.calls``: waiting for replies over the client transport (the
re-replicator's copies, the probes); real ZeroMQ, bookies on threads."""

from __future__ import annotations

import pytest
import zmq

from appliance.errors import OK, BKTimeoutError, BookieUnavailableError
from ipc.calls import Calls, call_once
from ipc.client import Transport
from ipc.replies import InfoReply, PingReply
from ipc.requests import InfoRequest, PingRequest
from tests.ipc.test_client import Silent


@pytest.fixture
def calls(thread_server):
    """A ``Calls`` (timeout 300 ms) over a transport with bookies "b1"
    (answers) and "quiet" (never answers); closed after."""
    t = Transport()
    t.add_bookie("b1", thread_server().server.endpoint)
    t.add_bookie("quiet", thread_server(Silent()).server.endpoint)
    yield Calls(t, 300)
    t.close()


def test_call_waits_for_its_own_reply_and_keeps_the_others(calls):
    first = calls.send("b1", PingRequest())
    second = calls.send("b1", PingRequest())
    event = calls.wait(second)  # the first's reply arrives too: it is kept
    assert (event.request_id, event.status, type(event.reply)) == (second, OK, PingReply)
    assert calls.wait(first).request_id == first
    assert calls.call("quiet", PingRequest()).status == BKTimeoutError.code


def test_fired_requests_run_their_callback_on_a_later_wait_or_drain(calls):
    seen = []
    calls.fire("b1", PingRequest(), seen.append)
    calls.fire("nobody", PingRequest(), seen.append)  # refused at once: an event too
    assert [e.status for e in seen] == [BookieUnavailableError.code]
    calls.call("b1", PingRequest())
    calls.drain_fired(5000)
    assert sorted(e.status for e in seen) == sorted([OK, BookieUnavailableError.code])


def test_call_once_asks_and_closes_and_never_hangs(thread_server, short_tmp):
    event = call_once(thread_server().server.endpoint, InfoRequest(), 5000)
    assert event.status == OK and isinstance(event.reply, InfoReply)
    quiet = call_once(thread_server(Silent()).server.endpoint, PingRequest(), 100)
    assert (quiet.status, quiet.reply) == (BKTimeoutError.code, None)
    with pytest.raises(zmq.ZMQError):
        call_once("nonsense://x", PingRequest(), 100)
