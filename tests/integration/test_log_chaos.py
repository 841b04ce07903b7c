"""The log layer under faults, with real processes: writers killed with
SIGKILL and replaced (each new writer recovers the last one's segment),
bookies killed and restarted, truncation, all while a ``bkctl log read
--follow`` reader tails the log.  A checker counts acknowledged-lost,
unacknowledged-seen, out-of-order and duplicate records: all must be 0.
A child that exits early fails the test at once; on any failure the
children's stderr and the log's segments are shown."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import appliance
from appliance import DLSN
from tests.support.bkctl import REPO
from tests.support.launch import wait_for, wait_registered

LOG = "chaos"
ROUNDS = 4
ACKS_PER_ROUND = 300


class Lines:
    """A child's stdout lines, collected by a thread."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        for raw in self.proc.stdout:
            with self._lock:
                self.lines.append(raw.decode().rstrip("\n"))

    def snapshot(self) -> list[str]:
        with self._lock:
            return list(self.lines)

    def done(self) -> list[str]:
        self._thread.join(timeout=60)
        return self.snapshot()


def _spawn(err: Path, *argv: str) -> subprocess.Popen:
    """A child with its stdout piped to the test and its stderr kept in ``err``."""
    with open(err, "ab") as stderr:
        return subprocess.Popen([sys.executable, "-m", *argv], stdout=subprocess.PIPE,
                                stderr=stderr, cwd=REPO,
                                env={**os.environ, "PYTHONPATH": str(REPO)},
                                start_new_session=True)


def _acks(lines: list[str]) -> dict[str, DLSN]:
    out = {}
    for line in lines:
        parts = line.split(" ")
        if len(parts) == 3 and parts[0] == "ACK":  # a line cut by SIGKILL has fewer parts
            out[parts[2]] = DLSN.parse(parts[1])
    return out


def check(seen: list[dict], acked: dict[str, DLSN], sent_tags: set[str],
          start: DLSN) -> dict[str, int]:
    """The four counts over what a reader from ``start`` delivered."""
    counts = {"acknowledged_lost": 0, "unacknowledged_seen": 0, "out_of_order": 0,
              "duplicate": 0}
    positions = [DLSN.parse(d["dlsn"]) for d in seen]
    payloads = [bytes.fromhex(d["hex"]) if "hex" in d else None for d in seen]
    counts["out_of_order"] = sum(1 for a, b in zip(positions, positions[1:], strict=False)
                                 if b <= a)
    counts["out_of_order"] += sum(1 for a, b in zip(seen, seen[1:], strict=False)
                                  if b["txid"] <= a["txid"])
    texts = [p.decode() for p in payloads]
    counts["duplicate"] = len(texts) - len(set(texts))
    counts["unacknowledged_seen"] = sum(1 for t in texts if t.split("-")[0] not in sent_tags)
    got = dict(zip(texts, positions, strict=True))
    for payload, dlsn in acked.items():
        if dlsn >= start and got.get(payload) != dlsn:
            counts["acknowledged_lost"] += 1
    return counts


def _records(lines: list[str]) -> list[dict]:
    import base64

    out = []
    for line in lines:
        doc = json.loads(line)
        doc["hex"] = base64.b64decode(doc["payload"]).hex()
        out.append(doc)
    return out


def _acked(writer: subprocess.Popen, lines: Lines, count: int) -> bool:
    """Has the writer acknowledged ``count`` records?  One that exited
    first fails the test at once (its stderr is shown)."""
    if len(_acks(lines.snapshot())) >= count:
        return True
    code = writer.poll()
    assert code is None, f"a writer exited ({code}) before acknowledging {count} records"
    return False


def _reached(follower: subprocess.Popen, tail: Lines, last: DLSN) -> bool:
    """Has the follower printed a record at or past ``last``?  A follower
    that exited fails the test at once (its stderr is shown)."""
    if any(DLSN.parse(d["dlsn"]) >= last for d in _records(tail.snapshot())):
        return True
    code = follower.poll()
    assert code is None, f"the follower exited ({code}) before reaching {last}"
    return False


def _show_state(root: Path, config: str, tail: Lines) -> None:
    """On a failure: the children's stderr, the follower's last record and
    the log's segments (printed: pytest shows them with the failure)."""
    for err in sorted(root.glob("*.err")):
        print(f"--- {err.name} ---\n{err.read_text(errors='replace')[-6000:]}")
    lines = tail.snapshot()
    print(f"--- follower: {len(lines)} records, last {lines[-1] if lines else None}")
    try:
        with appliance.connect(config) as bk:
            md = bk.log(LOG).metadata()
            print(f"--- log: truncated before {md.truncated_before}")
            for seg in md.segments:
                print(f"    {seg}")
    except Exception as exc:  # noqa: BLE001 - only shown
        print(f"--- log metadata unreadable: {exc}")


def test_writer_kills_handovers_bookie_kills_and_truncation_lose_nothing(make_cluster):
    cluster = make_cluster(5, quorums=(3, 3, 2), autorecovery={"enabled": False},
                           log={"segment_records_max": 250, "flush_interval_us": 500})
    config = str(cluster.config_path)
    with appliance.connect(config) as bk:
        wait_registered(bk, 5)
        bk.log(LOG).writer().close()  # the log exists before the reader starts
    root = cluster.root
    follower = _spawn(root / "follower.err", "cli.main", "log", "read", LOG, "--follow",
                      "--json", "--config", config)
    tail = Lines(follower)
    writers: list[tuple[subprocess.Popen, Lines]] = []
    acked: dict[str, DLSN] = {}
    tags: set[str] = set()
    truncated_to = DLSN.FIRST
    try:
        for round_no in range(ROUNDS):
            tag = f"w{round_no}"
            tags.add(tag)
            proc = _spawn(root / f"writer-{tag}.err", "tests.integration.log_writer_proc",
                          config, LOG, tag)
            lines = Lines(proc)
            writers.append((proc, lines))
            wait_for(lambda p=proc, lines=lines: _acked(p, lines, ACKS_PER_ROUND // 2),
                     120, what=f"writer {tag} acknowledging")
            victim = f"bookie-{round_no % 5 + 1}"
            cluster.kill(victim)  # a bookie dies mid-write: the writer changes ensembles
            wait_for(lambda p=proc, lines=lines: _acked(p, lines, ACKS_PER_ROUND),
                     120, what=f"writer {tag} acknowledging past a dead bookie")
            if round_no % 2 == 0:  # this writer dies; the next one recovers its segment
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=60)
            # (an odd round's writer keeps writing: the next writer fences it)
            cluster.start_bookie(victim)
            if round_no == 1:  # drop segments the follower has certainly passed
                wait_for(lambda: len(tail.snapshot()) > 300, 120, what="the follower")
                seen = _records(tail.snapshot())
                with appliance.connect(config) as bk:
                    bk.log(LOG).truncate(DLSN.parse(seen[300]["dlsn"]))
                    truncated_to = bk.log(LOG).metadata().truncated_before
        final = _spawn(root / "writer-final.err", "tests.integration.log_writer_proc",
                       config, LOG, "final")
        final_lines = Lines(final)
        tags.add("final")
        wait_for(lambda: _acked(final, final_lines, 100), 120, what="final writer")
        final.send_signal(signal.SIGTERM)
        assert final.wait(timeout=120) == 0
        for round_no, (proc, lines) in enumerate(writers):
            code = proc.wait(timeout=120)
            if round_no % 2:  # superseded while writing: fenced, and said so
                assert code == 3 and "FENCED" in lines.done(), (round_no, code)
            acked.update(_acks(lines.done()))
        acked.update(_acks(final_lines.done()))

        last = max(acked.values())
        wait_for(lambda: _reached(follower, tail, last), 120,
                 what="the follower reaching the last acknowledged record")
        follower.send_signal(signal.SIGINT)
        assert follower.wait(timeout=60) == 0
        seen = _records(tail.done())
        counts = check(seen, acked, tags, DLSN.FIRST)
        assert counts == {"acknowledged_lost": 0, "unacknowledged_seen": 0, "out_of_order": 0,
                          "duplicate": 0}, counts
        assert len(acked) >= ROUNDS * ACKS_PER_ROUND

        # a fresh reader from the start sees the same records from the truncation point on
        with appliance.connect(config) as bk:
            with bk.log(LOG).reader() as r:
                again = []
                while True:
                    batch = r.read(max_records=10_000, timeout_s=2)
                    if not batch:
                        break
                    again += batch
        assert again[0].dlsn >= truncated_to
        tail_part = [d for d in seen if DLSN.parse(d["dlsn"]) >= again[0].dlsn]
        assert [(str(r.dlsn), r.payload.hex()) for r in again] == \
            [(d["dlsn"], d["hex"]) for d in tail_part]
        assert truncated_to > DLSN.FIRST  # the truncation happened
    except BaseException:
        _show_state(root, config, tail)
        raise
    finally:
        for proc, _ in writers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for proc in [follower] + ([final] if "final" in locals() else []):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def test_the_checker_counts_each_kind_of_failure():
    def rec(dlsn, txid, payload):
        return {"dlsn": dlsn, "txid": txid, "hex": payload.hex()}

    acked = {"w0-0": DLSN(1, 0, 0), "w0-1": DLSN(1, 0, 1), "w0-2": DLSN(1, 1, 0)}
    good = [rec("1/0/0", 1, b"w0-0"), rec("1/0/1", 2, b"w0-1"), rec("1/1/0", 3, b"w0-2"),
            rec("1/2/0", 4, b"w0-3")]  # w0-3 was written, never acknowledged: allowed
    zero = {"acknowledged_lost": 0, "unacknowledged_seen": 0, "out_of_order": 0,
            "duplicate": 0}
    assert check(good, acked, {"w0"}, DLSN.FIRST) == zero
    assert check(good[:1] + good[2:], acked, {"w0"}, DLSN.FIRST)["acknowledged_lost"] == 1
    assert check(good + [rec("1/3/0", 5, b"x9-0")], acked, {"w0"},
                 DLSN.FIRST)["unacknowledged_seen"] == 1
    assert check([good[1], good[0]] + good[2:], acked, {"w0"}, DLSN.FIRST)["out_of_order"] == 2
    dup = good + [rec("1/3/0", 5, b"w0-2")]
    assert check(dup, acked, {"w0"}, DLSN.FIRST)["duplicate"] == 1
    assert check(good[2:], acked, {"w0"}, DLSN(1, 1, 0)) == zero  # before the start: not lost
