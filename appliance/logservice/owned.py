"""One log owned by this log server: its tagged log writer and its duplicate
filter (``appliance.protocol.log_service.DedupTable``).

Opening (on the server's pool of ``LOG_SERVICE_OPENS_MAX`` threads, the
server keeps serving other logs): a
``LogWriter(tagged=True)`` takes the log over, which fences and recovers
the previous owner's segment (so a stale owner cannot add a record after
this point), then the filter is rebuilt from the tags of the records in the
segments written during the last ``LOG_SERVICE_REBUILD_MS``.  Only then are
writes taken.

Writes (the server's thread): the records of one request are judged one by
one (new, duplicate, gap); the new ones of every producer go into the same
writer, which packs them many to an entry (a group commit: one ledger add
for the records of many producers).  The reply for a request leaves when
all its records have a position.

Back-pressure: a request that would send entries now that the log's
ledger handle has no room for (``[client] inflight_adds_max`` adds or
``inflight_bytes_max`` bytes in flight, acks not coming: its bookies
stalled) is answered "retry" before any of it is judged
(``LogWriter.has_room``): the producer resends after its back-off.  The
server's one thread serves every log, so it never waits for one log's
room: the other logs' producers, and pings, go on.

Failure: a write the writer fails (fenced by an exclusive writer, or a
ledger error) may or may not be in the log, so the filter can no longer
tell; the log is then dropped whole (``failed``): its requests are answered
"retry", the server releases the lease, and whoever opens it next rebuilds
the filter from the log itself.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from concurrent.futures import Future

from appliance.client.add_future import outcome
from appliance.logs.writer import LogWriter
from appliance.protocol import limits
from appliance.protocol.gather import GatherGate
from appliance.protocol.log_entry import unpack_tags
from appliance.protocol.log_service import (
    DUPLICATE,
    FULL,
    GAP,
    NEW,
    RETRY,
    DedupTable,
    dlsn_runs,
)
from appliance.protocol.logs import COMPLETED, DLSN

log = logging.getLogger("appliance.logservice")

OPENING, OPEN, CLOSING, FAILED, CLOSED = "opening", "open", "closing", "failed", "closed"


class _Run:
    """The duplicate filter's position for each record of a request written
    as one run (one object for all of them): the run's future (its result:
    position runs ``[seg, entry, first slot, n]``) and its first ``seq``."""

    __slots__ = ("future", "seq")

    def __init__(self, future: Future, seq: int):
        self.future, self.seq = future, seq

    def position(self, seq: int) -> tuple:
        """Record ``seq``'s (seg, entry, slot), once the future is done."""
        k = seq - self.seq
        for seg, entry, slot, n in outcome(self.future)[0]:
            if k < n:
                return seg, entry, slot + k
            k -= n
        raise ValueError(f"seq {seq} is not in this run")


def rebuild_filter(client, md, table: DedupTable, now_ms: int, password: bytes) -> int:
    """Learn every tagged record of the completed segments written during the
    last ``LOG_SERVICE_REBUILD_MS``; the number of records learnt."""
    done = [s for s in md.live_segments if s.state == COMPLETED]
    start = 0
    for i, seg in enumerate(done):
        if seg.ctime_ms <= now_ms - limits.LOG_SERVICE_REBUILD_MS:
            start = i  # the segment being written when the window began
    learnt = 0
    for seg in done[start:]:
        if seg.last_entry_id < 0:
            continue
        rh = client.open_ledger(seg.ledger_id, password, recovery=False)
        try:
            step = limits.LOG_READ_ENTRIES_MAX
            for first in range(0, seg.last_entry_id + 1, step):
                for entry in rh.read(first, min(first + step - 1, seg.last_entry_id)):
                    for slot, (pid, seq) in enumerate(unpack_tags(entry.payload) or ()):
                        table.learn(pid, seq, DLSN(seg.seq, entry.entry_id, slot), now_ms)
                        learnt += 1
        finally:
            rh.close()
    return learnt


class OwnedLog:
    """See the module docstring.  ``reply(identity, doc)`` is called from any
    thread when a request's answer is ready; ``wake()`` when the state
    changed (opened, failed)."""

    def __init__(self, client, name: str, owner: str, reply, wake, totals: dict | None = None,
                 observe=None, clock_ms=lambda: int(time.time() * 1000), *, acked=None,
                 opener=None, ready=None, gather_s: float = 0.0, monotonic=time.monotonic):
        self.client = client
        self.name = name
        self.owner = owner
        self._reply = reply
        self._wake = wake
        self._clock_ms = clock_ms
        self.state = OPENING
        self.error: BaseException | None = None
        self.writer: LogWriter | None = None
        self.table = DedupTable(limits.LOG_SERVICE_PRODUCERS_MAX, limits.LOG_SERVICE_RECENT_MAX,
                                limits.LOG_SERVICE_PRODUCER_IDLE_MS)
        self.stats = {"records": 0, "duplicates": 0, "requests": 0}
        self._totals = totals if totals is not None else {}  # the server's, for its metrics
        self._observe = observe  # a write request's latency (s), or None
        self._lock = threading.Lock()
        self._held_since: float | None = None  # buffered records wait since (send_buffered)
        self.gate = GatherGate(gather_s)  # producers just answered, awaited (send_buffered)
        self._monotonic = monotonic
        self._acked = acked  # acked(self): an entry with records acknowledged (control entries)
        # ready(self): the entry whose ack lets held records leave was acknowledged
        self._on_room = (lambda: ready(self)) if ready is not None else wake
        if opener is None:
            threading.Thread(target=self._open, name=f"open-{name}", daemon=True).start()
        else:
            opener.submit(self._open)

    def _open(self) -> None:
        try:
            writer = LogWriter(self.client, self.client.logs, self.name, b"",
                               self.client.log_config, self.owner, tagged=True, driven=True)
            md, _ = self.client.logs.read_log(self.name)
            learnt = rebuild_filter(self.client, md, self.table, self._clock_ms(), b"")
        except Exception as exc:  # noqa: BLE001 - the log is dropped and retried by producers
            log.warning("log %s: could not take it over: %s", self.name, exc)
            self.error, self.state = exc, FAILED
        else:
            if self._acked is not None:
                writer.on_acked = lambda: self._acked(self)
            self.writer, self.state = writer, OPEN
            self._count("takeovers", 1)
            log.info("log %s: owned (epoch %d); %d records learnt for %d producers", self.name,
                     writer.epoch, learnt, len(self.table))
        self._wake()

    # -- writes (the server's thread) -----------------------------------------------------
    def hello(self, producer_id: bytes) -> int | None:
        return self.table.next_seq(producer_id)

    def write(self, identity: bytes, head: dict, producer_id: bytes, seq: int, oldest: int,
              payloads: list) -> dict | None:
        """Judge and write one request's records; an error reply now, or None
        (the reply follows once every record has a position)."""
        now = self._clock_ms()
        t0 = time.perf_counter()
        self.stats["requests"] += 1
        self.gate.arrived(head.get("pid"))
        if not self.writer.has_room(payloads):
            self._count("busy", 1)
            return {"op": "error", "code": RETRY, "message": f"log {self.name}: its ledger "
                    "has as many adds in flight as it may take ([client] inflight_adds_max, "
                    "inflight_bytes_max); retry"}
        if self.table.admit_run(producer_id, seq, len(payloads), now):
            return self._write_new(identity, head, producer_id, seq, payloads, t0)
        answers: list = []
        new_payloads, new_tags = [], []
        for i, payload in enumerate(payloads):
            verdict = self.table.admit(producer_id, seq + i, now, oldest)
            if verdict.kind == NEW:
                new_payloads.append(payload)
                new_tags.append((producer_id, seq + i))
                answers.append(None)
            elif verdict.kind == DUPLICATE:
                answers.append(verdict.position)
                self._count("duplicates", 1)
            elif verdict.kind in (GAP, FULL) and i == 0:
                return {"op": "error", "code": verdict.kind, "expected": verdict.expected,
                        "message": _refusal(self.name, verdict)}
            elif verdict.kind in (GAP, FULL):
                break  # answer the records before it; the producer resends the rest
            else:  # OLD: stored long ago, position forgotten
                answers.append("old")
        try:
            futures = self.writer.write_many_async(new_payloads, tags=new_tags) \
                if new_payloads else []
        except Exception as exc:  # noqa: BLE001 - the writer is broken: drop the log
            self._fail(exc)
            return {"op": "error", "code": "retry", "message": str(exc)}
        it = iter(futures)
        for i, answer in enumerate(answers):
            if answer is None:
                fut = next(it)
                answers[i] = fut
                self.table.store(producer_id, seq + i, fut)
        self._count("records", len(futures))
        self._answer_when_done(identity, head, answers, t0, seq)
        return None

    def _write_new(self, identity: bytes, head: dict, producer_id: bytes, seq: int,
                   payloads: list, t0: float) -> dict | None:
        """``write`` when every record is new (``DedupTable.admit_run``): one
        future for the request's records (``LogWriter.write_run_async``)."""
        try:
            fut = self.writer.write_run_async(
                payloads, [(producer_id, s) for s in range(seq, seq + len(payloads))])
        except Exception as exc:  # noqa: BLE001 - the writer is broken: drop the log
            self._fail(exc)
            return {"op": "error", "code": "retry", "message": str(exc)}
        self.table.store_many(producer_id, seq, [_Run(fut, seq)] * len(payloads))
        self._count("records", len(payloads))
        fut.add_done_callback(lambda f: self._send_runs(identity, head, f, t0))
        return None

    def _send_runs(self, identity: bytes, head: dict, fut: Future, t0: float) -> None:
        """The ledger's thread: the reply to a request written as one run."""
        runs, error = outcome(fut)
        if error is not None:
            self._fail(error)
            self._reply(identity, {**head, "op": "error", "code": "retry", "message": str(error)})
            return
        # answered first: the reply may bring the producer's next write before
        # this thread goes on, and a producer that wrote again is not awaited
        self.gate.answered(head.get("pid"), self._monotonic())
        self._reply(identity, {**head, "op": "written", "runs": runs})
        if self._observe is not None:
            self._observe(time.perf_counter() - t0)

    def send_buffered(self, now: float, linger_s: float, entries_max: int) -> float | None:
        """The server's thread, after a turn of its loop: the records buffered
        leave now unless an entry is in flight (``LogWriter.send_if_idle``:
        the server is woken when it is acknowledged), or once they waited
        ``linger_s`` (then with up to ``entries_max`` entries in flight).
        None once nothing is left buffered, else when to call again (inf:
        once ``ready`` is called, when the ack that makes room came)."""
        if self.state != OPEN:
            return None
        try:
            if not self.writer.entries_inflight:  # gather the producers just answered
                until = self.gate.hold_until(self._held_since or now, now)
                if until is not None:
                    self._held_since = self._held_since or now
                    return until
            if self.writer.send_if_idle(self._on_room):
                self._held_since = None
                return None
            if self._held_since is None:
                self._held_since = now
            due = self._held_since + linger_s
            if now >= due and self.writer.send_if_idle(self._on_room, entries_max):
                self._held_since = None
                return None
        except Exception as exc:  # noqa: BLE001 - the writer is broken: drop the log
            self._fail(exc)
            return None
        return due if now < due else math.inf  # woken by the ack that makes room

    def control(self, now: float, interval_s: float) -> float | None:
        """The server's thread: the writer's control entry once it was idle
        ``interval_s`` (``LogWriter.control_if_due``); when to call again,
        or None."""
        if self.state != OPEN:
            return None
        try:
            return self.writer.control_if_due(now, interval_s)
        except Exception as exc:  # noqa: BLE001 - the writer is broken: drop the log
            self._fail(exc)
            return None

    def _count(self, name: str, n: int) -> None:
        self.stats[name] = self.stats.get(name, 0) + n
        self._totals[name] = self._totals.get(name, 0) + n

    def _answer_when_done(self, identity: bytes, head: dict, answers: list, t0: float,
                          seq: int) -> None:
        """Answer once the request's last pending record is stored: the writer
        settles records in the order it took them (entries are acknowledged
        in order), so the last one settles last (one callback per request)."""
        last = next((a.future if isinstance(a, _Run) else a for a in reversed(answers)
                     if isinstance(a, Future | _Run)), None)
        if last is None:
            self._send_answers(identity, head, answers, t0, seq)
        else:
            last.add_done_callback(
                lambda _f: self._send_answers(identity, head, answers, t0, seq))

    def _send_answers(self, identity: bytes, head: dict, answers: list, t0: float,
                      seq: int) -> None:
        positions = []
        for i, answer in enumerate(answers):
            if isinstance(answer, _Run):  # a retry of a record still pending (or just stored)
                done = outcome(answer.future)
                if done is not None and done[1] is None:
                    done = (answer.position(seq + i), None)
            elif isinstance(answer, Future):
                done = outcome(answer)
            if isinstance(answer, Future | _Run):
                error = (self.error or RuntimeError("a record settled out of order")) \
                    if done is None else done[1]
                if error is not None:
                    self._fail(error)
                    self._reply(identity, {**head, "op": "error", "code": "retry",
                                           "message": str(error)})
                    return
                answer = done[0]
            positions.append(None if answer == "old" else answer)
        self.gate.answered(head.get("pid"), self._monotonic())  # first, as in _send_runs
        self._reply(identity, {**head, "op": "written", "runs": dlsn_runs(positions)})
        if self._observe is not None:
            self._observe(time.perf_counter() - t0)

    def _fail(self, exc: BaseException) -> None:
        with self._lock:
            if self.state in (OPEN, OPENING):
                log.warning("log %s: dropped after a failed write: %s", self.name, exc)
                self.error, self.state = exc, FAILED
        self._wake()

    # -- close ----------------------------------------------------------------------------------
    def close(self) -> None:
        """Flush and close the writer (completing its segment); blocking."""
        with self._lock:
            writer, self.state = self.writer, CLOSING
        if writer is not None:
            try:
                writer.close()
            except Exception as exc:  # noqa: BLE001 - fenced or broken: the next owner recovers
                log.info("log %s: closed with %s", self.name, exc)
            self._totals["entries"] = self._totals.get("entries", 0) + writer.stats["entries"]
        self.state = CLOSED


def _refusal(name: str, verdict) -> str:
    if verdict.kind == GAP:
        return f"log {name}: sequence gap, next expected {verdict.expected}"
    return (f"log {name}: {limits.LOG_SERVICE_PRODUCERS_MAX} producers wrote within "
            f"{limits.LOG_SERVICE_PRODUCER_IDLE_MS} ms; no room for another")
