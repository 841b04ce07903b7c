"""The owner's read cache (``appliance.logservice.readcache.RecentRecords``)
and the read wire (``appliance.logs.tail``), without processes."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import zmq

from appliance.errors import BadRequestError
from appliance.logs.reader import LogRecord
from appliance.logs.tail import (
    ServiceTail,
    check_read,
    decode_records,
    encode_read,
    encode_records,
)
from appliance.logservice.readcache import RecentRecords, read_endpoint_for
from appliance.protocol.log_service import decode_header, encode_header, runs_dlsns
from appliance.protocol.logs import DLSN


class FakeWriter:
    def __init__(self, seq: int, next_entry: int):
        # the last record sent: slot 1 of the entry before (a control entry none)
        self.at = DLSN(seq, next_entry - 1, 2) if next_entry else DLSN(seq, 0, 0)
        self.next_entry = next_entry
        self.listener = None
        self.acknowledged = None  # (seq, entry) of the last entry acknowledged

    def acknowledged_now(self):
        return self.acknowledged

    def listen(self, listener):
        self.listener = listener
        return self.at, self.next_entry


def _entry(cache, seq, entry, n, first_txid=1, size=10):
    cache.append(seq, entry, list(range(first_txid, first_txid + n)),
                 [bytes([entry % 256]) * size for _ in range(n)])


def _read(cache, pos, max_records=100):
    """The positions and txids ``cache.read`` gives (None: a miss)."""
    got = cache.read(pos, max_records, 1 << 20)
    return None if got is None else (runs_dlsns(got[0]), got[1])


def _cache(bytes_max=1 << 20, seq=3, next_entry=5):
    woken = []
    cache = RecentRecords(bytes_max, lambda: woken.append(1))
    cache.attach(FakeWriter(seq, next_entry))
    return cache, woken


def test_records_from_a_position_across_entries_and_a_rollover():
    cache, woken = _cache()
    _entry(cache, 3, 4, 2)  # sent before the cache began: ignored
    _entry(cache, 3, 5, 3, first_txid=10)
    cache.append(3, 6, [], [])  # a control entry
    _entry(cache, 3, 7, 2, first_txid=13)
    _entry(cache, 4, 0, 1, first_txid=15)  # the next segment
    assert len(woken) == 3
    positions, txids = _read(cache, DLSN(3, 5, 1))
    assert positions == [(3, 5, 1), (3, 5, 2), (3, 7, 0), (3, 7, 1), (4, 0, 0)]
    assert txids == [11, 12, 13, 14, 15]
    assert _read(cache, DLSN(3, 7, 2), 100)[0] == [(4, 0, 0)]  # after 3/7's last
    assert _read(cache, DLSN(4, 0, 1), 100)[0] == []  # nothing yet: wait
    assert _read(cache, DLSN(3, 5, 0), 2)[0] == [(3, 5, 0), (3, 5, 1)]  # max records
    assert _read(cache, DLSN(3, 4, 2), 1)[0] == [(3, 5, 0)]  # after 3/4's last record
    assert _read(cache, DLSN(3, 4, 1), 10) is None  # before the cache: a miss


def test_eviction_moves_the_start_and_a_gap_starts_again():
    cache, _ = _cache(bytes_max=50, seq=1, next_entry=0)
    for e in range(4):
        _entry(cache, 1, e, 2, first_txid=2 * e + 1, size=10)  # 20 bytes each
    assert cache.bytes <= 50 and cache.start == DLSN(1, 1, 2)  # after 1/1's last record
    assert _read(cache, DLSN(1, 1, 1), 10) is None
    assert _read(cache, DLSN(1, 2, 0), 10)[0][0] == (1, 2, 0)
    _entry(cache, 1, 6, 1, first_txid=20)  # entries 4 and 5 never came
    assert cache.start == DLSN(1, 6, 0)
    assert _read(cache, DLSN(1, 3, 0), 10) is None
    assert _read(cache, DLSN(1, 6, 0), 10)[0] == [(1, 6, 0)]


def test_an_entry_out_of_order_empties_the_cache():
    cache, _ = _cache(seq=1, next_entry=0)
    _entry(cache, 1, 0, 2)
    _entry(cache, 2, 0, 2, first_txid=4)  # the next segment's first entry ...
    _entry(cache, 1, 1, 1, first_txid=3)  # ... before the last of this one
    assert _read(cache, DLSN(1, 0, 0)) is None and _read(cache, DLSN(2, 0, 0)) is None
    assert cache.start == DLSN(2, 1, 0)
    _entry(cache, 2, 1, 1, first_txid=6)
    assert _read(cache, DLSN(2, 1, 0))[0] == [(2, 1, 0)]


def test_the_wire_round_trip_and_bad_reads():
    doc = decode_header(encode_read("orders", DLSN(2, 3, 4), 500, 300, 7))
    assert check_read(doc) == ("orders", DLSN(2, 3, 4), 500, 300)
    frames = encode_records(7, [[2, 3, 4, 1], [2, 4, 0, 1]], [9, 10], [b"a", b"bc"])
    records = decode_records(decode_header(frames[0]), frames[1:], LogRecord._make)
    assert records == [LogRecord(DLSN(2, 3, 4), 9, b"a"), LogRecord(DLSN(2, 4, 0), 10, b"bc")]
    empty = encode_records(7, [], [], [])
    assert decode_records(decode_header(empty[0]), empty[1:], LogRecord._make) == []
    for bad in ({"op": "read", "log": "x", "from": [1, 2], "max": 1},
                {"op": "read", "log": "x", "from": [1, 2, 3], "max": 0},
                {"op": "read", "log": 5, "from": [1, 2, 3], "max": 1}):
        with pytest.raises(BadRequestError):
            check_read(bad)
    with pytest.raises(BadRequestError):
        decode_records(decode_header(frames[0]), frames[1:2], LogRecord._make)


def test_read_endpoints():
    assert read_endpoint_for("ipc:///run/logserver-1.sock") == "ipc:///run/logserver-1.sock.read"
    assert read_endpoint_for("tcp://127.0.0.1:7000") == "tcp://127.0.0.1:*"


class FakeRegistry:
    def __init__(self, owner: str, endpoints: dict):
        self.lease = {"server": owner, "endpoint": "unused"}
        self.endpoints = endpoints

    def owner(self, _name):
        return self.lease

    def servers(self):
        return {s: {"read_endpoint": e} for s, e in self.endpoints.items()}


class FakeServer:
    """A read socket answering each READ with ``answer(doc) -> frames``."""

    def __init__(self, ctx, path, answer):
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.linger = 0
        self.endpoint = f"ipc://{path}"
        self.sock.bind(self.endpoint)
        self.answer = answer
        self.asked: list[dict] = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._stop = False
        self._thread.start()

    def _run(self):
        while not self._stop:
            if self.sock.poll(20):
                identity, head = self.sock.recv_multipart()
                doc = decode_header(head)
                self.asked.append(doc)
                frames = self.answer(doc)
                if frames is not None:
                    self.sock.send_multipart([identity, *frames])

    def close(self):
        self._stop = True
        self._thread.join(5)
        self.sock.close(linger=0)


def test_the_reader_follows_a_redirect_and_a_silent_owner_sends_it_to_the_bookies(tmp_path):
    ctx = zmq.Context.instance()
    new = FakeServer(ctx, tmp_path / "new.read", lambda doc: encode_records(
        doc["rid"], [[*doc["from"], 1]], [5], [b"x"]))
    old = FakeServer(ctx, tmp_path / "old.read", lambda doc: [encode_header(
        {"op": "error", "code": "not_owner", "rid": doc["rid"], "owner": "new",
         "endpoint": new.endpoint})])
    silent = FakeServer(ctx, tmp_path / "silent.read", lambda doc: None)
    tail = ServiceTail(SimpleNamespace(logs=SimpleNamespace(store=None), curve=None), "orders")
    tail._registry = FakeRegistry("old", {"old": old.endpoint, "new": new.endpoint})
    try:
        got = tail.fetch(DLSN(2, 3, 4), 10, 0.0, LogRecord._make)
        assert got == [LogRecord(DLSN(2, 3, 4), 5, b"x")]
        assert tail.stats["redirects"] == 1 and tail.serving and tail.due(DLSN(2, 3, 5))
        tail._drop()
        tail._registry = FakeRegistry("silent", {"silent": silent.endpoint})
        assert tail.fetch(DLSN(2, 3, 5), 10, 0.0, LogRecord._make) is None  # after the grace
        assert silent.asked and tail.stats["timeouts"] == 1
        # asks again only after the recheck interval, wherever the reader is
        assert not tail.due(DLSN(2, 3, 5)) and not tail.due(DLSN(9, 0, 0))
    finally:
        tail.close()
        for server in (old, new, silent):
            server.close()


def test_a_cache_knows_how_far_its_writer_is_acknowledged():
    """Read your writes: a cache made after an entry was acknowledged cannot
    serve it, but says how far the writer is acknowledged (the miss's
    ``confirmed``), from the writer at attach and from every entry it is told
    of, also those sent before it began."""
    w = FakeWriter(3, 5)
    w.acknowledged = (3, 3)  # entry 4 was sent and is still in flight
    cache = RecentRecords(1 << 20)
    cache.attach(w)
    assert cache.read(DLSN(3, 3, 0), 10, 1 << 20) is None  # before the cache's start
    assert cache.confirmed_now() == (3, 3)
    _entry(cache, 3, 4, 2)  # sent before the cache began: not held, but acknowledged
    assert cache.confirmed_now() == (3, 4)
    _entry(cache, 3, 5, 1)
    assert cache.confirmed_now() == (3, 5)
    runs, txids, _ = cache.read(DLSN(3, 5, 0), 10, 1 << 20)
    assert runs == [[3, 5, 0, 1]]


def test_a_miss_says_how_far_the_owner_is_acknowledged(tmp_path):
    """The owner that cannot serve a position says how far its writer is
    acknowledged; the reader keeps it until its next fetch, and may ask again
    at once from a later position (not from the same one)."""
    ctx = zmq.Context.instance()
    owner = FakeServer(ctx, tmp_path / "owner.read", lambda doc: [encode_header(
        {"op": "miss", "rid": doc["rid"], "confirmed": [4, 17]})])
    tail = ServiceTail(SimpleNamespace(logs=SimpleNamespace(store=None), curve=None), "orders")
    tail._registry = FakeRegistry("owner", {"owner": owner.endpoint})
    try:
        assert tail.fetch(DLSN(4, 2, 0), 10, 0.0, LogRecord._make) is None
        assert tail.confirmed == (4, 17) and tail.stats["misses"] == 1
        assert not tail.due(DLSN(4, 2, 0)) and tail.due(DLSN(4, 18, 0))
    finally:
        tail.close()
        owner.close()


def test_the_confirmed_end_follows_a_redirect_and_none_without_an_owner(tmp_path):
    """``confirmed_end`` (Spark's planning, read your writes): the owner's
    acknowledged (seg, entry), through a "not owner" redirect; None when
    nothing is acknowledged yet or no server owns the log."""
    ctx = zmq.Context.instance()
    ends = iter([[2, 9], None])
    owner = FakeServer(ctx, tmp_path / "owner.read", lambda doc: [encode_header(
        {"op": "confirmed", "rid": doc["rid"], "at": next(ends)})])
    old = FakeServer(ctx, tmp_path / "old.read", lambda doc: [encode_header(
        {"op": "error", "code": "not_owner", "rid": doc["rid"], "owner": "owner",
         "endpoint": owner.endpoint})])
    tail = ServiceTail(SimpleNamespace(logs=SimpleNamespace(store=None), curve=None), "orders")
    tail._registry = FakeRegistry("old", {"old": old.endpoint, "owner": owner.endpoint})
    try:
        assert tail.confirmed_end() == (2, 9)
        assert owner.asked[0]["op"] == "confirmed" and owner.asked[0]["log"] == "orders"
        assert tail.confirmed_end() is None  # nothing acknowledged yet
        tail._drop()
        tail._registry = FakeRegistry(None, {})
        assert tail.confirmed_end() is None  # no owner
    finally:
        tail.close()
        owner.close()
        old.close()


class _Answer:
    """A read service answering every read with a miss (``confirmed`` 7.7)."""

    def handle(self, peer, doc):
        return [encode_header({"op": "miss", "rid": doc["rid"], "confirmed": [7, 7]})]


def test_a_tcp_read_service_is_reached_over_curve_and_refuses_a_client_without_a_key(
        short_tmp):
    """A reader reaches a log server's tcp read endpoint as a CURVE client of
    the key the server registered; a client without a key is told the
    server requires CURVE and reads the bookies."""
    from appliance.curve import ClientCurve, generate_keys
    from appliance.logservice.wire import HEADER_WIRE
    from ipc.curve import KeyDirectory, load_key_pair
    from ipc.server import FrameServer
    from tests.ipc.support import ThreadServer

    (short_tmp / "authorized").mkdir()
    generate_keys("server", short_tmp)
    generate_keys("reader", short_tmp / "authorized")
    server_keys = load_key_pair(short_tmp / "server.key_secret")
    reader = ClientCurve(load_key_pair(short_tmp / "authorized" / "reader.key_secret"))
    frames = FrameServer("tcp://127.0.0.1:0", _Answer(), codec=HEADER_WIRE,
                         curve_keys=server_keys,
                         authorized_keys=KeyDirectory(short_tmp / "authorized"))
    ts = ThreadServer(frames).start()
    registry = FakeRegistry("ls1", {"ls1": frames.endpoint})
    registry.servers = lambda: {"ls1": {"read_endpoint": frames.endpoint,
                                        "curve_public_key": server_keys.public.decode()}}
    tails = [ServiceTail(SimpleNamespace(logs=SimpleNamespace(store=None), curve=c), "orders")
             for c in (reader, None)]
    try:
        for tail in tails:
            tail._registry = registry
        assert tails[0].fetch(DLSN(7, 1, 0), 10, 0.0, LogRecord._make) is None
        assert tails[0].confirmed == (7, 7) and tails[0].stats["requests"] == 1
        assert tails[1].fetch(DLSN(7, 1, 0), 10, 0.0, LogRecord._make) is None
        assert tails[1].confirmed is None and tails[1].stats["requests"] == 0
    finally:
        for tail in tails:
            tail.close()
        ts.stop()
