"""Real bookies, ADD_PACKED messages of N entries at a fixed message rate:
each bookie's CPU per message and its request -> reply latency.

    python -m tests.harness.bookie_msg --entries 1,5,20 --rate 2000 --duration-s 10
    python -m tests.harness.bookie_msg --code /tmp/old --code .     # A/B, same minutes

Starts one bookie process per ``--code`` checkout (default: this one;
``python -m appliance.bookie`` run from that checkout, SQLite metadata,
journal on, the config's defaults otherwise, each with its own directories)
in a temporary folder.  Then, for each N, the client sends ``rate``
ADD_PACKED messages a second of N 1 KB entries of one ledger, each message
to every bookie (as a writer sends to its ensemble), open loop: message i is
due at ``start + i / rate`` and its latency is counted from that due time
(no coordinated omission: a message held back by the in-flight bound
``--inflight``, per bookie, waits on the clock).  A bookie's CPU is its
process's user + system time (psutil) over the measured seconds, after a
warm-up second, also per thread ("main" is the loop's); ``loop_wakeups``
and ``journal_syncs`` per message come from the bookie's INFO.  Bookies fed
the same messages in the same seconds are an A/B that the machine's other
load hits alike.

Prints one JSON document: per N and bookie, CPU us per message and per
entry, latency p50/p90/p99/max in ms, and the load average before/after.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import psutil
import zmq

from appliance.bench import launcher
from appliance.config import load_config
from appliance.protocol.entry import HEADER
from appliance.protocol.errors import OK
from ipc.packed import AddPackedRequest
from ipc.replies import InfoReply, decode_reply
from ipc.requests import InfoRequest, encode_request
from storage import LedgerStorage

KEY = bytes(range(32))
WARMUP_S = 1.0


def _entries(ledger_id: int, first: int, n: int, payload: bytes) -> list[bytes]:
    return [HEADER.pack(ledger_id, first + i, first + i - 1, len(payload)) + payload
            for i in range(n)]


def _info(sock) -> dict:
    sock.send_multipart(encode_request(InfoRequest(request_id=1 << 40)))
    while True:
        reply = decode_reply(sock.recv_multipart())
        if isinstance(reply, InfoReply):
            return reply.info


def _thread_cpu(pid: int) -> dict[str, tuple[float, float]]:
    """CPU seconds (user, system) per thread of process ``pid``, named by
    its kernel name and id ("main" for the loop thread; Python's other
    threads are "python:<tid>", e.g. the journal's, which ``py-spy dump``
    names)."""
    out: dict[str, tuple[float, float]] = {}
    for t in psutil.Process(pid).threads():
        try:
            name = Path(f"/proc/{pid}/task/{t.id}/comm").read_text().strip()
        except OSError:
            name = "gone"
        name = "main" if t.id == pid else f"{name}:{t.id}"
        out[name] = (t.user_time, t.system_time)
    return out


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


class _Target:
    """One bookie under test: its socket, process, and this run's tallies."""

    def __init__(self, name: str, sock, pid: int):
        self.name, self.sock, self.proc = name, sock, psutil.Process(pid)
        self.reset()

    def reset(self) -> None:
        self.due: dict[int, float] = {}
        self.latencies: list[float] = []
        self.done = 0
        self.cpu0 = 0.0
        self.threads0: dict = {}

    def mark(self) -> None:
        t = self.proc.cpu_times()
        self.cpu0 = t.user + t.system
        self.threads0 = _thread_cpu(self.proc.pid)

    def result(self, n: int, messages: int, elapsed: float) -> dict:
        t = self.proc.cpu_times()
        threads1 = _thread_cpu(self.proc.pid)
        cpu = t.user + t.system - self.cpu0
        lat = sorted(self.latencies)
        zero = (0.0, 0.0)
        return {"bookie": self.name, "entries_per_message": n, "messages": messages,
                "seconds": round(elapsed, 3), "messages_per_s": round(messages / elapsed, 1),
                "cpu_us_per_message": round(cpu / messages * 1e6, 1),
                "cpu_us_per_entry": round(cpu / messages / n * 1e6, 1),
                "bookie_cpu_share": round(cpu / elapsed, 3),
                "p50_ms": round(_percentile(lat, 0.50) * 1000, 3),
                "p90_ms": round(_percentile(lat, 0.90) * 1000, 3),
                "p99_ms": round(_percentile(lat, 0.99) * 1000, 3),
                "max_ms": round(lat[-1] * 1000, 3),
                "thread_cpu_us_per_message_user_sys": {
                    name: [round((threads1[name][i] - self.threads0.get(name, zero)[i])
                                 / messages * 1e6, 1) for i in (0, 1)]
                    for name in sorted(threads1) if threads1[name] != self.threads0.get(name)}}


def run_one(targets: list[_Target], ledger_id: int, n: int, rate: float, duration_s: float,
            inflight_max: int, entry_bytes: int) -> list[dict]:
    """Send for WARMUP_S + duration_s at ``rate`` messages/s to every target;
    measure the part after the warm-up."""
    payload = os.urandom(entry_bytes - HEADER.size)
    total = int((WARMUP_S + duration_s) * rate)
    warm = int(WARMUP_S * rate)
    poller = zmq.Poller()
    for target in targets:
        poller.register(target.sock, zmq.POLLIN)
    by_sock = {target.sock: target for target in targets}
    for target in targets:
        target.reset()
    sent = 0
    next_entry = 0
    t_measure = 0.0
    start = time.perf_counter() + 0.01

    def room() -> bool:
        return all(sent - target.done < inflight_max for target in targets)

    while any(target.done < total for target in targets):
        now = time.perf_counter()
        while sent < total and room() and start + sent / rate <= now:
            if sent == warm:
                for target in targets:
                    target.mark()
                t_measure = now
            datas = _entries(ledger_id, next_entry, n, payload)
            req = AddPackedRequest.of(ledger_id, KEY, range(next_entry, next_entry + n), datas)
            req.request_id = sent
            next_entry += n
            frames = encode_request(req)
            for target in targets:
                target.due[sent] = start + sent / rate
                target.sock.send_multipart(frames, copy=False)
            sent += 1
        if sent < total and room():
            timeout_ms = max(0.0, (start + sent / rate - time.perf_counter()) * 1000)
        else:
            timeout_ms = 1000
        for sock, _ in poller.poll(timeout_ms):
            target = by_sock[sock]
            while True:
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                got = time.perf_counter()
                reply = decode_reply(frames)
                if reply.status != OK or any(s != OK for s in reply.statuses):
                    raise RuntimeError(f"add to {target.name} failed: {reply}")
                due = target.due.pop(reply.request_id)
                if reply.request_id >= warm:
                    target.latencies.append(got - due)
                target.done += 1
    elapsed = time.perf_counter() - t_measure
    return [target.result(n, total - warm, elapsed) for target in targets]


def _start_bookies(root: Path, codes: list[str], sections: dict) -> list:
    """Format and start one bookie per checkout; returns their Popen objects."""
    config_path = launcher.write_config(root / "bench.toml", len(codes), **sections)
    config = load_config(config_path)
    procs = []
    for i, code in enumerate(codes, 1):
        bookie_id = f"bookie-{i}"
        spec = config.bookie(bookie_id)
        Path(spec.journal_dir).mkdir(parents=True)
        Path(spec.ledger_dir).mkdir(parents=True)
        LedgerStorage.format(bookie_id, spec.journal_dir, spec.ledger_dir,
                             config.storage.to_options())
        # ``-m`` puts the working directory first on sys.path: run from the checkout
        cwd = os.path.abspath(code)
        env = {**os.environ, "PYTHONPATH": cwd}
        ready = root / f"{bookie_id}.ready"
        procs.append((launcher.spawn([sys.executable, "-m", "appliance.bookie", "--config",
                                      str(config_path), "--id", bookie_id, "--ready-file",
                                      str(ready)], root / f"{bookie_id}.log", env=env, cwd=cwd),
                      ready, root / f"{bookie_id}.log"))
    for i, (proc, ready, log_path) in enumerate(procs, 1):
        launcher.wait_started(proc, ready.exists, f"bookie-{i}", log_path)
    return [proc for proc, _, _ in procs]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", default="1,5,20", help="entries per message, comma-separated")
    parser.add_argument("--rate", type=float, default=2000.0, help="messages per second")
    parser.add_argument("--duration-s", type=float, default=10.0)
    parser.add_argument("--inflight", type=int, default=64,
                        help="messages in flight at most, per bookie")
    parser.add_argument("--entry-bytes", type=int, default=1024)
    parser.add_argument("--code", action="append", default=[],
                        help="a checkout to run a bookie from (repeat for an A/B); default .")
    parser.add_argument("--workdir", default=None, help="where the temporary folder goes")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="config key for the bookies, e.g. storage.journal_group_wait_us=500")
    args = parser.parse_args(argv)
    codes = args.code or ["."]
    sections: dict[str, dict] = {"client": {"ensemble": 1, "write_quorum": 1, "ack_quorum": 1}}
    for item in args.set:
        key, value = item.split("=", 1)
        section, name = key.split(".", 1)
        sections.setdefault(section, {})[name] = int(value) if value.lstrip("-").isdigit() \
            else value
    root = Path(tempfile.mkdtemp(prefix="bkmsg", dir=args.workdir))
    bookies: list = []
    ctx = zmq.Context()
    try:
        bookies = _start_bookies(root, codes, sections)
        targets = []
        for i, (code, proc) in enumerate(zip(codes, bookies, strict=True), 1):
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect((root / f"bookie-{i}.ready").read_text().strip())
            targets.append(_Target(f"bookie-{i} ({code})", sock, proc.pid))
            print(f"bookie-{i} ({code}) pid {proc.pid}", file=sys.stderr, flush=True)
        results = []
        load_before = os.getloadavg()
        for i, n in enumerate(int(x) for x in args.entries.split(",")):
            before = [_info(target.sock) for target in targets]
            rows = run_one(targets, 1000 + i, n, args.rate, args.duration_s, args.inflight,
                           args.entry_bytes)
            sent = int((WARMUP_S + args.duration_s) * args.rate)
            for target, row, info0 in zip(targets, rows, before, strict=True):
                info1 = _info(target.sock)
                for key, counters in (("loop_wakeups", "counters"),
                                      ("journal_syncs", "storage")):
                    field = "wakeups" if key == "loop_wakeups" else key
                    row[f"{key}_per_message"] = round(
                        (info1[counters][field] - info0[counters][field]) / sent, 2)
            results += rows
        print(json.dumps({"rate": args.rate, "inflight": args.inflight,
                          "entry_bytes": args.entry_bytes,
                          "load_before": [round(x, 2) for x in load_before],
                          "load_after": [round(x, 2) for x in os.getloadavg()],
                          "results": results}, indent=1))
        for target in targets:
            target.sock.close()
        return 0
    finally:
        for proc in bookies:
            launcher.stop_process(proc)
        ctx.term()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
