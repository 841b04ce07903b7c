"""Microbench of a producer's own CPU per write (not a test).

    .venv/bin/python -m tests.logservice.bench_producer [--writes N] [--async]

A fake log server (a ZeroMQ ROUTER in a child process) answers a hello with
next_seq 1 and every write with the reply a log server sends (each request
stored as one run of one entry), through the wire functions of
``appliance.protocol.log_service``; one ``Producer`` writes N records of
100 bytes, synchronously (``write``) or pipelined (``write_async``), and the
producer process's CPU (every thread: psutil) per write is printed.
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import os
import shutil
import tempfile
import threading
import time
import types
from pathlib import Path

import psutil
import zmq

from appliance.logs.producer import Producer
from appliance.protocol import log_service as wire
from storage.metadata.sqlite_store import SqliteStore

PAYLOAD_BYTES = 100


def fake_server(endpoint: str, ready, delay_s: float) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.bind(endpoint)
    ready.set()
    entry = 0
    later: collections.deque = collections.deque()  # (due, frames): replies held delay_s
    while True:
        if later and not sock.poll(max(0, int((later[0][0] - time.monotonic()) * 1000) + 1)):
            while later and later[0][0] <= time.monotonic():
                sock.send_multipart(later.popleft()[1])
            continue
        frames = sock.recv_multipart()
        identity, head = frames[0], frames[1]
        if head == b"quit":
            return
        doc, payloads = decode_request(frames[1:])
        echo = {k: doc[k] for k in ("log", "pid", "seq", "gen") if k in doc}
        if doc["op"] == "hello":
            reply = {**echo, "op": "hello", "next_seq": 1}
        else:
            n = len(payloads)
            entry += 1
            reply = {**echo, "op": "written", "runs": [[1, entry, 0, n]]}
        if delay_s:
            later.append((time.monotonic() + delay_s, [identity, wire.encode_header(reply)]))
        else:
            sock.send_multipart([identity, wire.encode_header(reply)])


def decode_request(frames: list) -> tuple[dict, list]:
    """The server's reading of a request (also of the wire before the
    binary write, to measure the code it replaced)."""
    if hasattr(wire, "decode_request"):
        return wire.decode_request(frames)
    doc = wire.decode_header(frames[0])
    payloads = wire.unpack_records(*frames[1:3]) if doc.get("packed") else frames[1:]
    return doc, payloads


class BenchProducer(Producer):
    endpoint = ""

    def _find_owner(self) -> str | None:
        return self.endpoint


def paced(producer, payload: bytes, writes: int, rate: float) -> list:
    """``bkctl bench log --rate``'s loop: write_async on a fixed schedule
    (open loop), each record's latency from its scheduled time, taken by
    its future's callback."""
    lat, clock = [], time.monotonic
    start = clock()
    for i in range(writes):
        due = start + i / rate
        pause = due - clock()
        if pause > 0:
            time.sleep(pause)  # pacing the open loop
        producer.write_async(payload).add_done_callback(
            lambda f, due=due: lat.append(clock() - due))
    producer.flush()
    return lat


def switches() -> dict:
    """Voluntary and involuntary context switches of each thread so far."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/status") as f:
            fields = dict(line.split(":", 1) for line in f)
        out[int(tid)] = (int(fields["voluntary_ctxt_switches"]),
                         int(fields["nonvoluntary_ctxt_switches"]))
    return out


def run(writes: int, pipelined: bool, endpoint: str, threads: int = 1,
        rate: float = 0.0) -> float:
    # a metadata store with no log server registered: the producer's server
    # watch (appliance.logs.server_watch) reads it, as in a real process
    folder = Path(tempfile.mkdtemp(prefix="bench-producer-"))
    store = SqliteStore(folder / "meta.db")
    client = types.SimpleNamespace(logs=types.SimpleNamespace(store=store), curve=None,
                                   payload_bytes_max=1 << 20)
    BenchProducer.endpoint = endpoint
    producer = BenchProducer(client, "bench")
    payload = b"x" * PAYLOAD_BYTES
    producer.write(payload)  # connected, numbered
    me = psutil.Process()
    threads0 = {t.id: t.user_time + t.system_time for t in me.threads()}
    cs0 = switches()
    t0, w0 = sum(me.cpu_times()[:2]), time.monotonic()
    lat = None
    if rate:
        lat = paced(producer, payload, writes, rate)
    elif pipelined:
        for _ in range(writes):
            producer.write_async(payload)
        producer.flush()
    elif threads == 1:
        for _ in range(writes):
            producer.write(payload)
    else:  # the writes shared by threads writing through the one producer
        def writer() -> None:
            for _ in range(writes // threads):
                producer.write(payload)
        pool = [threading.Thread(target=writer) for _ in range(threads)]
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join()
    cpu, wall = sum(me.cpu_times()[:2]) - t0, time.monotonic() - w0
    per_thread = sorted((round((t.user_time + t.system_time - threads0.get(t.id, 0)) / writes
                               * 1e6, 1) for t in me.threads()), reverse=True)
    cs = {tid: tuple(round((a - b) / writes, 2) for a, b in zip(now, cs0.get(tid, (0, 0)),
                                                                strict=True))
          for tid, now in switches().items()}
    producer.close()
    store.close()
    shutil.rmtree(folder, ignore_errors=True)
    if lat:
        lat.sort()
        print(f"paced at {rate:,.0f}/s: latency p50 {lat[len(lat) // 2] * 1000:.2f} ms, "
              f"p99 {lat[int(len(lat) * 0.99)] * 1000:.2f} ms; context switches per "
              f"write by thread (voluntary, involuntary) {sorted(cs.values(), reverse=True)}")
    print(f"{'write_async' if pipelined or rate else 'write'} x{threads}: {writes} writes, "
          f"cpu {cpu / writes * 1e6:.1f} us/write, wall {wall / writes * 1e6:.1f} us/write, "
          f"requests {producer.stats['requests']}, load {os.getloadavg()[0]:.2f}; "
          f"us/write by thread {per_thread}")
    return cpu / writes


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--writes", type=int, default=20_000)
    parser.add_argument("--async", dest="pipelined", action="store_true")
    parser.add_argument("--delay-ms", type=float, default=0.0,
                        help="the fake server answers this late (a real one waits for bookies)")
    parser.add_argument("--threads", type=int, default=1,
                        help="sync writes from this many threads sharing the producer")
    parser.add_argument("--rate", type=float, default=0.0,
                        help="write_async paced at this many records/s (open loop, as "
                             "bkctl bench log --rate gives each producer)")
    parser.add_argument("--profile", action="store_true", help="cProfile the writing thread")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        endpoint = f"ipc://{tmp}/fake.sock"
        ready = multiprocessing.Event()
        server = multiprocessing.Process(target=fake_server,
                                         args=(endpoint, ready, args.delay_ms / 1000))
        server.start()
        try:
            ready.wait(10)
            if args.profile:
                import cProfile  # noqa: PLC0415 - only when asked
                import pstats  # noqa: PLC0415 - only when asked
                prof = cProfile.Profile()
                prof.runcall(run, args.writes, args.pipelined, endpoint)
                pstats.Stats(prof).sort_stats("tottime").print_stats(25)
            else:
                run(args.writes, args.pipelined, endpoint, args.threads, args.rate)
        finally:
            ctx = zmq.Context.instance()
            quit_sock = ctx.socket(zmq.DEALER)
            quit_sock.linger = 1000
            quit_sock.connect(endpoint)
            quit_sock.send(b"quit")
            quit_sock.close()
            server.join(10)
            if server.is_alive():
                server.kill()


if __name__ == "__main__":
    main()
