"""CURVE on the wire (``ipc.curve``, ``FrameServer(curve_keys=...)``,
``Transport(curve_keys=...)``): a FrameServer on a thread, tcp on 127.0.0.1
port 0, real ZeroMQ handshakes."""

from __future__ import annotations

import logging
import os

import pytest
import zmq

from appliance.curve import generate_keys
from appliance.errors import OK, BookieUnavailableError, ConfigError, UnauthorizedError
from ipc.client import Transport
from ipc.curve import KeyDirectory, ZapHandler, load_key_pair
from ipc.replies import PingReply
from ipc.requests import PingRequest
from tests.ipc.test_client import events_for
from tests.support.launch import wait_for


@pytest.fixture
def keys(short_tmp):
    """server / good (authorized) / bad (not) key pairs; ``authorized`` dir."""
    (short_tmp / "authorized").mkdir()
    generate_keys("server", short_tmp)
    generate_keys("good", short_tmp / "authorized")
    generate_keys("bad", short_tmp)
    return {name: load_key_pair(short_tmp / sub / f"{name}.key_secret")
            for name, sub in (("server", "."), ("good", "authorized"), ("bad", "."))} | {
        "authorized": short_tmp / "authorized", "root": short_tmp}


@pytest.fixture
def curve_server(thread_server, keys):
    return thread_server(endpoint="tcp://127.0.0.1:0", curve_keys=keys["server"],
                         authorized_keys=KeyDirectory(keys["authorized"]))


@pytest.fixture
def transports():
    made = []

    def make(**kwargs) -> Transport:
        t = Transport(reconnect_ivl_ms=50, reconnect_ivl_max_ms=200, **kwargs)
        made.append(t)
        return t

    yield make
    for t in made:
        t.close()


def ping(t: Transport, bookie: str = "b1"):
    rid = t.send(bookie, PingRequest(), 5000)
    [event] = events_for(t, 1)
    assert event.request_id == rid
    return event


def test_an_authorized_client_round_trips_and_the_bookie_publishes_its_key(
        curve_server, transports, keys):
    assert curve_server.server.curve_public_key == keys["server"].public.decode()
    t = transports(curve_keys=keys["good"])
    t.add_bookie("b1", curve_server.server.endpoint, keys["server"].public)
    event = ping(t)
    assert (event.status, event.reply) == (OK, PingReply(event.request_id))
    assert t.refused_bookies() == {}


def test_an_unauthorized_key_gets_unauthorized_at_once_and_others_keep_working(
        curve_server, transports, keys):
    bad = transports(curve_keys=keys["bad"])
    bad.add_bookie("b1", curve_server.server.endpoint, keys["server"].public)
    event = ping(bad)
    assert event.status == UnauthorizedError.code
    why = bad.refused_bookies()["b1"]
    assert "refused this client's CURVE key" in why and keys["bad"].public.decode() in why
    # every further request fails fast, without waiting for a timeout
    assert ping(bad).status == UnauthorizedError.code
    good = transports(curve_keys=keys["good"])
    good.add_bookie("b1", curve_server.server.endpoint, keys["server"].public)
    assert ping(good).status == OK
    assert curve_server.server._zap.counters["refused"] >= 1


def test_a_key_added_to_the_directory_is_accepted_on_a_later_attempt(
        curve_server, transports, keys):
    bad = transports(curve_keys=keys["bad"])
    bad.add_bookie("b1", curve_server.server.endpoint, keys["server"].public)
    assert ping(bad).status == UnauthorizedError.code
    os.link(keys["root"] / "bad.key", keys["authorized"] / "bad.key")
    # the transport retries the handshake at most once per reconnect_ivl_max_ms
    wait_for(lambda: ping(bad).status == OK, 10, what="the newly authorized key accepted")
    assert bad.refused_bookies() == {}


def test_a_client_without_a_key_is_refused_as_unauthorized(curve_server, transports):
    """The bookie drops a plain handshake; ZeroMQ may report a plain
    disconnect (BookieUnavailableError) before the mechanism mismatch, after
    which every request fails fast as unauthorized (the driver does better:
    it sees the key in the registry and never connects, test_curve.py in
    tests/integration)."""
    plain = transports()
    plain.add_bookie("b1", curve_server.server.endpoint)
    assert ping(plain).status in (BookieUnavailableError.code, UnauthorizedError.code)
    wait_for(lambda: "b1" in plain.refused_bookies(), 10, what="the refusal seen")
    assert "requires CURVE and this client has no key" in plain.refused_bookies()["b1"]
    assert ping(plain).status == UnauthorizedError.code


def test_an_ipc_endpoint_ignores_curve(thread_server, transports, keys):
    ts = thread_server(curve_keys=keys["server"], authorized_keys=KeyDirectory(keys["root"]))
    assert ts.server.curve_public_key is None
    t = transports(curve_keys=keys["bad"])
    t.add_bookie("b1", ts.server.endpoint, keys["server"].public)
    assert ping(t).status == OK


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _zap_request(key_raw: bytes, address: bytes = b"10.0.0.1", mechanism=b"CURVE"):
    return [b"1.0", b"7", b"appliance", address, b"", mechanism, key_raw]


def test_refusals_are_logged_once_per_peer_per_interval(keys, caplog):
    clock = _Clock()
    ctx = zmq.Context()
    zap = ZapHandler(ctx, KeyDirectory(keys["authorized"], clock=clock),
                     keys["server"].public, log_interval_s=60.0, clock=clock)
    try:
        bad_raw = zmq.utils.z85.decode(keys["bad"].public)
        good_raw = zmq.utils.z85.decode(keys["good"].public)
        with caplog.at_level(logging.WARNING, logger="ipc.curve"):
            for _ in range(5):
                assert zap._answer(_zap_request(bad_raw))[2] == b"400"
            assert zap._answer(_zap_request(bad_raw, b"10.0.0.2"))[2] == b"400"
            assert zap._answer(_zap_request(good_raw))[2] == b"200"
            own = zmq.utils.z85.decode(keys["server"].public)
            assert zap._answer(_zap_request(own))[2] == b"200"  # the host's own key
            assert zap._answer(_zap_request(b"", mechanism=b"NULL"))[2] == b"400"
            clock.now = 61.0
            zap._answer(_zap_request(bad_raw))
        lines = [r.getMessage() for r in caplog.records if "refused a client" in r.getMessage()]
        assert len(lines) == 4  # 10.0.0.1 twice (61 s apart), 10.0.0.2, the NULL peer
        assert sum("10.0.0.1 with key " + keys["bad"].public.decode() in line
                   for line in lines) == 2
        assert zap.counters == {"accepted": 2, "refused": 8, "refusals_logged": 4}
        assert zap._answer([b"garbage"])[2] == b"400"
    finally:
        zap.close()
        ctx.term()


def test_the_refusal_table_is_bounded(keys):
    clock = _Clock()
    ctx = zmq.Context()
    zap = ZapHandler(ctx, KeyDirectory(keys["authorized"], clock=clock), keys["server"].public,
                     refusals_tracked_max=8, clock=clock)
    try:
        bad_raw = zmq.utils.z85.decode(keys["bad"].public)
        for i in range(50):
            zap._answer(_zap_request(bad_raw, b"10.0.1.%d" % i))
        assert len(zap._logged_at) <= 8
    finally:
        zap.close()
        ctx.term()


def test_a_key_directory_rereads_only_when_it_changed_and_at_most_once_per_interval(keys):
    clock = _Clock()
    directory = KeyDirectory(keys["authorized"], clock=clock)
    assert directory.keys() == {keys["good"].public}
    os.link(keys["root"] / "bad.key", keys["authorized"] / "bad.key")
    assert keys["bad"].public not in directory  # checked less than a second ago
    clock.now = 1.0
    assert keys["bad"].public in directory
    (keys["authorized"] / "bad.key").unlink()
    (keys["authorized"] / "junk.key").write_text("not a certificate\n")
    clock.now = 2.0
    assert directory.keys() == {keys["good"].public}  # junk skipped, bad revoked


def test_a_missing_key_directory_accepts_nobody(keys):
    assert KeyDirectory(keys["root"] / "nowhere").keys() == frozenset()


def test_key_files_that_cannot_be_used_are_refused_with_one_line(keys):
    root = keys["root"]
    with pytest.raises(ConfigError, match="cannot read .*nope.key_secret.*bkctl keys generate"):
        load_key_pair(root / "nope.key_secret")
    with pytest.raises(ConfigError, match="holds no secret key"):
        os.chmod(root / "server.key", 0o600)
        load_key_pair(root / "server.key")
    os.chmod(root / "server.key_secret", 0o644)
    with pytest.raises(ConfigError, match="readable by other accounts.*chmod 600"):
        load_key_pair(root / "server.key_secret")
