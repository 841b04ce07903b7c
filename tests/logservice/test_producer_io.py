"""A producer against a fake log server (a ZeroMQ ROUTER on a thread of the
test): when its request timeout counts from.  The real servers' behaviour
is in test_producers.py and test_failover.py."""

from __future__ import annotations

import threading
import time
import types

import pytest
import zmq

from appliance.errors import LogServiceUnavailableError
from appliance.logs.producer import Producer
from appliance.logs.producer_loop import ProducerLoop
from appliance.protocol import limits
from appliance.protocol import log_service as wire
from storage.metadata.sqlite_store import SqliteStore
from tests.support.launch import wait_for

WAIT_S = 10.0


class FakeServer:
    """Answers a hello with next_seq 1 and each write as stored in one
    entry of its own; a write's answer is held while ``hold`` is set."""

    def __init__(self, path):
        self.sock = zmq.Context.instance().socket(zmq.ROUTER)
        self.sock.linger = 0
        self.endpoint = f"ipc://{path}"
        self.sock.bind(self.endpoint)
        self.hold = threading.Event()
        self.refuse: str | None = None  # answer writes "held" with this message
        self.writes: list[tuple[int, int]] = []  # (first seq, records) of each request
        self.stored: list[tuple] = []  # (pid hex, first seq, records, entry) of each request
        self.kinds: list[str] = []  # "single" or "mux", each message
        self.identities: set = set()  # the connections that sent
        self._held: list = []
        self._entry = 0
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop:
            if not self.hold.is_set():
                while self._held:
                    self.sock.send_multipart(self._held.pop(0))
            if not self.sock.poll(5):
                continue
            identity, frame = self.sock.recv_multipart()
            self.identities.add(identity)
            if frame[:1] != bytes([wire.MUX_KIND]):
                self.kinds.append("single")
                answer, held = self._answer(*wire.decode_request([frame]))
                reply = [identity, wire.encode_header(answer)]
            else:
                self.kinds.append("mux")
                routed, held = [], False
                for section in wire.decode_mux(frame, 4096, 1 << 24):
                    doc, payloads = wire.decode_request([section])
                    answer, wait = self._answer(doc, payloads)
                    held = held or wait
                    routed.append((doc["log"].encode(), bytes.fromhex(doc["pid"]),
                                   wire.encode_header(answer)))
                reply = [identity, wire.encode_mux_reply(routed)]
            if held:
                self._held.append(reply)
            else:
                self.sock.send_multipart(reply)

    def _answer(self, doc, payloads) -> tuple[dict, bool]:
        """A request's answer, and whether it is held while ``hold`` is set."""
        echo = {k: doc[k] for k in ("log", "pid", "seq", "gen") if k in doc}
        if doc["op"] == "hello":
            return {**echo, "op": "hello", "next_seq": 1}, False
        if self.refuse is not None:
            return {**echo, "op": "error", "code": wire.HELD, "message": self.refuse}, False
        self._entry += 1
        self.writes.append((doc["seq"], len(payloads)))
        self.stored.append((doc["pid"], doc["seq"], len(payloads), self._entry))
        return {**echo, "op": "written", "runs": [[1, self._entry, 0, len(payloads)]]}, True

    def close(self):
        self._stop = True
        self._thread.join(WAIT_S)
        self.sock.close(linger=0)


class FakeClock:
    def __init__(self):
        self.now = time.monotonic()

    def __call__(self) -> float:
        return self.now


class CountingProducer(Producer):
    """Its owner is the fake server."""

    endpoint = ""

    def _find_owner(self):
        return self.endpoint


@pytest.fixture
def server(tmp_path):
    fake = FakeServer(tmp_path / "server.sock")
    # a metadata store with no log server registered: the producer's server
    # watch (appliance.logs.server_watch) reads it and never fires
    fake.store = SqliteStore(tmp_path / "meta.db")
    yield fake
    fake.close()
    fake.store.close()


def _producer(server, clock=time.monotonic, name: str = "fake") -> CountingProducer:
    CountingProducer.endpoint = server.endpoint
    client = types.SimpleNamespace(logs=types.SimpleNamespace(store=server.store), curve=None,
                                   payload_bytes_max=1 << 20)
    return CountingProducer(client, name, clock=clock)


def test_a_write_after_an_idle_spell_longer_than_the_request_timeout_is_sent_once(server):
    clock = FakeClock()
    producer = _producer(server, clock)
    try:
        assert producer.write(b"before the spell") is not None
        clock.now += limits.LOG_PRODUCER_REQUEST_TIMEOUT_MS / 1000 * 2  # idle, answered
        server.hold.set()
        fut = producer.write_async(b"after the spell")
        wait_for(lambda: len(server.writes) == 2, WAIT_S, what="the request")
        loop = ProducerLoop.get()
        ticks = loop.snapshot()["ticks"]
        # the I/O thread looks at the timeout at its ticks while the reply is held
        wait_for(lambda: loop.snapshot()["ticks"] >= ticks + 2, WAIT_S, what="two ticks")
        server.hold.clear()
        assert fut.result(WAIT_S) is not None
        assert producer.stats["timeouts"] == 0
        assert server.writes == [(1, 1), (2, 1)]  # not sent again after a reconnection
    finally:
        server.hold.clear()
        producer.close()


def test_a_write_refused_until_its_deadline_fails_naming_the_last_refusal(server):
    """A log held by an exclusive writer that never closes: the producer
    retries until its deadline, then fails with the server's last refusal
    in its error (which writer holds the log, and what to do), not a bare
    "no log server took it"."""
    server.refuse = "log fake is held by exclusive writer vm:4242: producers wait until it closes"
    clock = FakeClock()
    p = _producer(server, clock)
    try:
        fut = p.write_async(b"x")
        wait_for(lambda: p.stats["retries"] >= 1, WAIT_S, what="a held answer")
        clock.now += limits.LOG_PRODUCER_DEADLINE_MS / 1000 + 1
        with pytest.raises(LogServiceUnavailableError,
                           match=r"not stored within 60000 ms \(the last refusal: log fake is "
                                 r"held by exclusive writer vm:4242"):
            fut.result(timeout=WAIT_S)
    finally:
        with pytest.raises(LogServiceUnavailableError):  # close raises the producer's error
            p.close()


@pytest.mark.parametrize("same_log", [True, False])
def test_producers_of_one_process_share_a_connection_and_each_gets_its_own_positions(
        server, same_log):
    """Two producers (of one log, or of two) writing to one server: one
    connection; the first's requests go alone, the other's as multi-log
    sections; every write is answered with the position the server gave
    that producer's record."""
    producers = [_producer(server, name="fake" if same_log else f"fake-{k}") for k in range(2)]
    first = producers[0]
    try:
        got = {(first.id.hex(), 0): first.write(b"alone")}  # alone in its turn: single
        futures = [(p, i + (p is first), p.write_async(b"%d" % i))
                   for i in range(60) for p in producers]
        got.update({(p.id.hex(), i): fut.result(WAIT_S) for p, i, fut in futures})
    finally:
        for p in producers:
            p.close()
    expected = {(pid, seq + k): (1, entry, k)
                for pid, seq, n, entry in server.stored for k in range(n)}
    assert {key: tuple(dlsn) for key, dlsn in got.items()} == \
        {key: expected[key[0], key[1] + 1] for key in got}
    assert len(server.identities) == 1
    assert {"single", "mux"} <= set(server.kinds)


def test_a_write_in_flight_when_its_server_is_replaced_is_resent_to_the_new_one(server):
    """The server watch tells the loop its log server was replaced (a new
    process at the same endpoint, as the simulation's seeds do:
    tests/sim/logservicesim): the write in flight is sent again there and
    answered, and the producer goes on writing."""
    producer = _producer(server)
    try:
        server.hold.set()
        fut = producer.write_async(b"in flight")
        wait_for(lambda: len(server.writes) == 1, WAIT_S, what="the request")
        ProducerLoop.get().server_gone(server.endpoint)
        wait_for(lambda: len(server.writes) == 2, WAIT_S, what="the request sent again")
        server.hold.clear()
        assert fut.result(WAIT_S) is not None
        assert producer.write(b"after") is not None
        assert server.writes == [(1, 1), (1, 1), (2, 1)]
    finally:
        server.hold.clear()
        producer.close()
