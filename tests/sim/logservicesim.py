"""The log service (seed 003's write proxy) in a deterministic simulation.

One to three logs, each written by an idempotent producer of every producer
process, through log servers that crash, restart and pause; the network
loses, duplicates, delays and reorders messages.  What runs is the real duplicate filter
(``appliance.protocol.log_service.DedupTable``) and the real spread
(``owner_of``); around them, a model of the rest, kept to what matters for
exactly-once:

* the ownership lease: one holder at a time, taken only when free or when
  its holder's session expired (a session expires ``session_ms`` after its
  server crashed or while it is paused);
* fencing: taking the log bumps the log's epoch; an old owner's group
  commit that had not reached the log is, at the fence, either kept (the
  recovery found it on a quorum: stored, never acknowledged) or dropped;
  its later commits fail (the old owner then drops the log and answers
  "retry");
* the new owner rebuilds its filter from the records in the log (``learn``
  in log order), as ``appliance.logservice.owned.rebuild_filter`` does;
* group commit: the new records of every request wait ``commit_ms`` and go
  to the log together; a request is answered once all its records have a
  position;
* producers: a window of unacknowledged writes, numbered 1, 2, 3, ...; a
  request unanswered for ``timeout_ms`` (or answered retry / gap / not
  owner) makes the producer send every unacknowledged write again, to the
  owner it finds (the lease holder, else the hashing over live servers);
* multi-log requests (``mux``, most seeds): the requests a process's
  producers send to one server at one moment leave as one message, a
  section each (``appliance.logs.producer_loop``); the server judges every
  section alone (its own log, lease, owner, filter: one section may be
  written while another is answered not_owner or retry), and the answers
  it has for one process at one moment leave as one message.  Both
  messages are lost, duplicated, delayed and reordered as a whole, and
  they cross crashes and leases moving between their sections' logs.

* back-pressure (``ledger_window``, a quarter of the seeds each 1 or 2): a
  request that finds that many of its log's commits on their way is
  answered "retry" before any of it is judged, as the owner answers one
  its log's ledger has no room for.

Invariants, checked once the faults stop and every producer finished:

``acked-kept``      every acknowledged write is in its log at the position
                    its answer gave;
``stored-once``     no (producer, seq) is in a log twice;
``producer-order``  each producer's records are in its log in its order;
``liveness``        every producer finished its writes.

``break_dedup=True`` makes the filter count every record as new: retries
are stored again, and ``stored-once`` must catch it.  ``break_oldest=True``
lets a producer the owner does not know start at the first number it sends
rather than at its oldest unacknowledged write: a request that overtook an
earlier one then hides the earlier writes as "duplicates" (``acked-kept``).

    python -m tests.sim.logservicesim --seeds 300
    python -m tests.sim.logservicesim --seeds 300 --break-dedup
    python -m tests.sim.logservicesim --seeds 300 --break-oldest
    python -m tests.sim.logservicesim --seeds 300 --mux on    # every seed multi-log
    python -m tests.sim.logservicesim --seed 17          # one seed, with its trace
"""

from __future__ import annotations

import argparse
import heapq
import random
import sys
from collections import Counter
from dataclasses import dataclass, field

from appliance.protocol.log_service import DUPLICATE, GAP, NEW, DedupTable, Verdict, owner_of

ADMITTED = Verdict(NEW)  # a record of a run DedupTable.admit_run admitted
END_MS = 120_000  # simulated time limit: faults stop at half of it


@dataclass(frozen=True)
class SimConfig:
    seed: int
    servers: int
    producers: int
    records: int
    window: int
    loss: float
    duplicate: float
    delay_ms: tuple[int, int]
    crash_every_ms: int
    pause_every_ms: int
    session_ms: int
    commit_ms: int
    timeout_ms: int
    check_ms: int
    break_dedup: bool = False
    break_oldest: bool = False
    logs: int = 1
    mux: bool = False
    # commits of one log on their way at most (its ledger's window, [client]
    # inflight_adds_max): a request meeting that many is answered "retry"
    # before any of it is judged (appliance.logservice.owned).  0: no bound.
    ledger_window: int = 0


def random_config(seed: int, break_dedup: bool = False, break_oldest: bool = False,
                  mux: bool | None = None) -> SimConfig:
    """``mux``: multi-log messages (None: as the seed draws, most seeds)."""
    rng = random.Random(seed)
    shape = random.Random(seed * 104_729 + 3)  # its own draws: the others stay as they were
    logs = shape.randint(1, 3)
    mux = shape.random() < 0.75 if mux is None else mux
    window = random.Random(seed * 7_919 + 11).choice((0, 0, 1, 2))  # its own draws too
    return SimConfig(seed=seed, logs=logs, mux=mux, ledger_window=window,
                     servers=rng.randint(1, 3), producers=rng.randint(1, 4),
                     records=rng.randint(10, 60), window=rng.choice((1, 2, 4, 8)),
                     loss=rng.choice((0.0, 0.02, 0.1, 0.2)),
                     duplicate=rng.choice((0.0, 0.05, 0.2)),
                     delay_ms=(1, rng.choice((2, 10, 50))),
                     crash_every_ms=rng.choice((2_000, 5_000, 20_000)),
                     pause_every_ms=rng.choice((0, 5_000, 15_000)),
                     session_ms=rng.choice((500, 2_000)), commit_ms=rng.choice((1, 5, 50)),
                     timeout_ms=rng.choice((200, 1_000)), check_ms=rng.choice((50, 500)),
                     break_dedup=break_dedup, break_oldest=break_oldest)


@dataclass
class Batch:
    """A group commit on its way to its log."""
    owner: str
    log: str
    epoch: int
    session: int  # the owner process's incarnation
    records: list = field(default_factory=list)  # (pid, seq)
    waiters: list = field(default_factory=list)  # requests to answer once stored
    done: bool = False


@dataclass
class Owned:
    epoch: int
    table: DedupTable
    batch: Batch | None = None
    inflight: list = field(default_factory=list)


@dataclass
class LogState:
    """One log: its records, the commits of crashed owners not yet fenced,
    its epoch and its lease ((server id, session) or None)."""
    name: str
    records: list = field(default_factory=list)  # (pid, seq)
    orphans: list = field(default_factory=list)
    epoch: int = 0
    lease: tuple[str, int] | None = None


@dataclass
class Server:
    id: str
    session: int
    alive: bool = True
    paused_until: int = 0
    owned: dict = field(default_factory=dict)  # log name -> Owned


@dataclass(eq=False)
class Producer:
    pid: bytes
    name: str
    log: str = ""
    proc: int = 0  # its process (whose producers share multi-log messages)
    next_seq: int = 1
    unacked: dict = field(default_factory=dict)  # seq -> True
    acked: dict = field(default_factory=dict)  # seq -> position (or None)
    target: str | None = None
    gen: int = 0
    last_progress: int = 0


class World:
    def __init__(self, cfg: SimConfig, trace_max: int = 0):
        self.cfg = cfg
        self.rng = random.Random(cfg.seed * 7919 + 1)
        self.now = 0
        self.queue: list = []
        self.counter = 0
        self.logs = {name: LogState(name) for name in
                     ("orders", "payments", "events")[:cfg.logs]}
        self.sessions: dict[int, int | None] = {}  # session -> expiry (None: live)
        self.servers = {f"s{i}": Server(f"s{i}", self._new_session()) for i in range(cfg.servers)}
        # a producer per log in every process (``producers`` processes)
        self.producers = [Producer(bytes([len(self.logs) * k + j + 1]) * 16, f"p{k}.{log}",
                                   log, k)
                          for k in range(cfg.producers) for j, log in enumerate(self.logs)]
        self.outbox: dict[int, list] = {}  # process -> sections to send at this moment
        self.answers: dict[tuple, list] = {}  # (server id, session, process) -> answers
        self.trace: list[str] = []
        self.trace_max = trace_max
        self.stats = Counter()

    # -- machinery ----------------------------------------------------------------------
    def at(self, delay: int, fn, *args) -> None:
        self.counter += 1
        heapq.heappush(self.queue, (self.now + max(delay, 0), self.counter, fn, args))

    def note(self, text: str) -> None:
        if len(self.trace) < self.trace_max:
            self.trace.append(f"{self.now:>7} {text}")

    def _new_session(self) -> int:
        session = len(self.sessions) + 1
        self.sessions[session] = None
        return session

    def session_live(self, session: int) -> bool:
        expiry = self.sessions[session]
        return expiry is None or self.now < expiry

    def live_servers(self) -> list[str]:
        return [s.id for s in self.servers.values() if self.session_live(s.session)]

    def faults_on(self) -> bool:
        return self.now < END_MS // 2

    def send(self, fn, *args) -> None:
        """A network message: maybe lost, maybe twice, after a random delay."""
        if self.faults_on() and self.rng.random() < self.cfg.loss:
            self.stats["lost"] += 1
            return
        copies = 2 if self.faults_on() and self.rng.random() < self.cfg.duplicate else 1
        for _ in range(copies):
            self.at(self.rng.randint(*self.cfg.delay_ms), fn, *args)

    # -- servers --------------------------------------------------------------------------
    def server_receive(self, sid: str, sections: list) -> None:
        """A request (one section) or a multi-log one (several): each
        section ``(producer, gen, seq0, n, oldest)`` is judged alone."""
        server = self.servers[sid]
        if not server.alive:
            return
        if self.now < server.paused_until:
            self.at(server.paused_until - self.now, self.server_receive, sid, sections)
            return
        redirected = written = 0
        for producer, gen, seq0, n, oldest in sections:
            state = self.logs[producer.log]
            if producer.log not in server.owned and not self.take_log(server, state):
                # the lease is an ephemeral node: gone once its session expired
                owner = state.lease[0] if state.lease and self.session_live(state.lease[1]) \
                    else owner_of(state.name, self.live_servers())
                self.answer(server, producer, gen, "not_owner", owner, None)
                redirected += 1
                continue
            self.owner_write(server, producer, gen, seq0, n, oldest)
            written += 1
        if len(sections) > 1:
            self.stats["mux_sections"] += len(sections)
            # one message, some sections redirected and others written: the seeds
            # cover a lease that moved between the logs of one message
            self.stats["mux_mixed"] += bool(redirected and written)

    def answer(self, server: Server, producer: Producer, gen: int, kind: str, a, b) -> None:
        """A section's answer: alone, or (mux) with the other answers this
        server has for the producer's process at this moment, in one message."""
        if not self.cfg.mux:
            self.send(self.producer_receive, producer, gen, kind, a, b)
            return
        key = (server.id, server.session, producer.proc)
        waiting = self.answers.setdefault(key, [])
        if not waiting:
            self.at(0, self._send_answers, key)
        waiting.append((producer, gen, kind, a, b))

    def _send_answers(self, key: tuple) -> None:
        waiting = self.answers.pop(key, [])
        server = self.servers[key[0]]
        if not waiting or not server.alive or server.session != key[1]:
            return  # its process died with them queued
        if len(waiting) > 1:
            self.stats["mux_answers"] += len(waiting)
        self.send(self.deliver_answers, waiting)

    def deliver_answers(self, answers: list) -> None:
        for answer in answers:
            self.producer_receive(*answer)

    def take_log(self, server: Server, state: LogState) -> bool:
        if state.lease is not None and self.session_live(state.lease[1]):
            if state.lease[1] != server.session:
                return False
        elif owner_of(state.name, self.live_servers()) != server.id:
            return False
        state.lease = (server.id, server.session)
        self.fence(state)
        table = DedupTable(producers_max=64, recent_max=4096, idle_ms=10**9)
        table.break_dedup = self.cfg.break_dedup
        for pos, (pid, seq) in enumerate(state.records):
            table.learn(pid, seq, pos, self.now)
        server.owned[state.name] = Owned(state.epoch, table)
        self.stats["takeovers"] += 1
        self.note(f"{server.id} takes {state.name}: epoch {state.epoch}, "
                  f"{len(state.records)} records")
        return True

    def fence(self, state: LogState) -> None:
        """The new owner fences the old one's segment: of the commits not yet
        in the log, the recovery keeps a prefix (entries on a quorum; never
        acknowledged) and the rest are lost."""
        groups = [state.orphans] + [
            o.inflight + ([o.batch] if o.batch else []) for s in self.servers.values()
            if (o := s.owned.get(state.name)) is not None]
        state.orphans = []
        for group in groups:
            pending = [b for b in group if not b.done]
            kept = self.rng.randint(0, len(pending))
            for i, batch in enumerate(pending):
                batch.done = True
                if i < kept:
                    state.records.extend(batch.records)
                    self.stats["kept_unacked"] += len(batch.records)
        state.epoch += 1

    def owner_write(self, server: Server, producer: Producer, gen: int, seq0: int,
                    n: int, oldest: int) -> None:
        owned = server.owned[producer.log]
        on_way = sum(1 for b in (*owned.inflight, owned.batch) if b is not None and not b.done)
        if self.cfg.ledger_window and on_way >= self.cfg.ledger_window:
            self.stats["busy"] += 1  # the ledger's window is full: nothing judged
            self.answer(server, producer, gen, "retry", None, None)
            return
        request = {"producer": producer, "gen": gen, "seq": seq0, "answers": [None] * n,
                   "open": 0}
        run = owned.table.admit_run(producer.pid, seq0, n, self.now)  # as the owner does
        for i in range(n):
            verdict = ADMITTED if i < run else owned.table.admit(
                producer.pid, seq0 + i, self.now, None if self.cfg.break_oldest else oldest)
            if verdict.kind == GAP and i == 0:
                self.answer(server, producer, gen, "gap", None, verdict.expected)
                return
            if verdict.kind == NEW:
                batch = self._open_batch(server, producer.log)
                batch.records.append((producer.pid, seq0 + i))
                owned.table.store(producer.pid, seq0 + i, (batch, len(batch.records) - 1))
                request["answers"][i] = (batch, len(batch.records) - 1)
                request["open"] += 1
                if request not in batch.waiters:
                    batch.waiters.append(request)
            elif verdict.kind == DUPLICATE:
                self.stats["duplicates"] += 1
                request["answers"][i] = verdict.position
                if isinstance(verdict.position, tuple):  # the first copy is on its way
                    batch = verdict.position[0]
                    if batch.done:  # fenced under this (stale) owner: its fate is unknown
                        self.answer(server, producer, gen, "retry", None, None)
                        return
                    request["open"] += 1
                    if request not in batch.waiters:
                        batch.waiters.append(request)
            else:  # OLD: stored, position forgotten
                request["answers"][i] = "old"
        self._answer_if_done(server, request)

    def _open_batch(self, server: Server, log: str) -> Batch:
        owned = server.owned[log]
        if owned.batch is None or owned.batch.done:
            owned.batch = Batch(server.id, log, owned.epoch, server.session)
            self.at(self.cfg.commit_ms, self.commit, server.id, owned.batch)
        return owned.batch

    def commit(self, sid: str, batch: Batch) -> None:
        server = self.servers[sid]
        state = self.logs[batch.log]
        owned = server.owned.get(batch.log)
        if owned is not None and owned.batch is batch:
            owned.batch = None
            owned.inflight.append(batch)
        if not server.alive or (server.session != batch.session and owned is None):
            return  # its process died: the fence decides
        if self.now < server.paused_until:
            self.at(server.paused_until - self.now, self.commit, sid, batch)
            return
        if batch.done or batch.epoch != state.epoch:  # fenced: the owner drops the log
            batch.done = True
            self.stats["fenced_commits"] += 1
            self.note(f"{sid}: commit of {len(batch.records)} to {batch.log} fenced; dropped")
            self._drop(server, batch.log)
            for request in batch.waiters:
                self.answer(server, request["producer"], request["gen"], "retry", None, None)
            return
        batch.done = True
        first = len(state.records)
        state.records.extend(batch.records)
        positions = {i: first + i for i in range(len(batch.records))}
        for i, (pid, seq) in enumerate(batch.records):
            if owned is not None:  # (a log being let go still stores what it took)
                owned.table.store(pid, seq, first + i)
        for request in batch.waiters:
            for k, answer in enumerate(request["answers"]):
                if isinstance(answer, tuple) and answer[0] is batch:
                    request["answers"][k] = positions[answer[1]]
                    request["open"] -= 1
            self._answer_if_done(server, request)

    def _answer_if_done(self, server: Server, request: dict) -> None:
        if request["open"] > 0 or any(isinstance(a, tuple) for a in request["answers"]):
            return
        request["open"] = -1  # answered
        self.answer(server, request["producer"], request["gen"], "written", request["seq"],
                    list(request["answers"]))

    def _drop(self, server: Server, log: str) -> None:
        owned = server.owned.pop(log, None)
        if owned is not None:
            for batch in owned.inflight:
                batch.done = True
        state = self.logs[log]
        if state.lease is not None and state.lease[1] == server.session:
            state.lease = None

    def crash(self, sid: str) -> None:
        server = self.servers[sid]
        if not server.alive:
            return
        for log, owned in server.owned.items():  # its last commits: as the fence decides
            self.logs[log].orphans += owned.inflight + ([owned.batch] if owned.batch else [])
        server.alive, server.owned = False, {}
        self.sessions[server.session] = self.now + self.cfg.session_ms
        self.note(f"{sid} crashes")
        self.stats["crashes"] += 1
        self.at(self.rng.randint(10, 3 * self.cfg.session_ms), self.restart, sid)

    def restart(self, sid: str) -> None:
        server = self.servers[sid]
        server.alive, server.session = True, self._new_session()
        self.note(f"{sid} restarts (session {server.session})")

    def pause(self, sid: str) -> None:
        server = self.servers[sid]
        if not server.alive or self.now < server.paused_until:
            return
        length = self.rng.randint(1, 3 * self.cfg.session_ms)
        server.paused_until = self.now + length
        if length > self.cfg.session_ms:  # its session expires; it resumes with a new one
            self.sessions[server.session] = self.now + self.cfg.session_ms
            self.at(length, self._resume_new_session, sid)
        self.note(f"{sid} pauses {length} ms")
        self.stats["pauses"] += 1

    def _resume_new_session(self, sid: str) -> None:
        """Back from a pause longer than its session: a new session.  Until its
        periodic check (``check_ms`` later) it still acts as the owner: a
        stale owner, whose commits the fence refuses."""
        server = self.servers[sid]
        if server.alive:
            server.session = self._new_session()
            self.at(self.cfg.check_ms, self.check_owned, sid)

    def check_owned(self, sid: str) -> None:
        server = self.servers[sid]
        for log in list(server.owned) if server.alive else []:
            if self.logs[log].lease != (server.id, server.session):
                self.note(f"{sid}: lease of {log} lost; dropped")
                del server.owned[log]

    def faults(self) -> None:
        if not self.faults_on():
            return
        sid = self.rng.choice(list(self.servers))
        if self.rng.random() < 0.5 or not self.cfg.pause_every_ms:
            self.crash(sid)
        else:
            self.pause(sid)
        every = self.cfg.crash_every_ms
        self.at(self.rng.randint(every // 2, every * 3 // 2), self.faults)

    # -- producers -----------------------------------------------------------------------------
    def find_owner(self, log: str) -> str | None:
        lease = self.logs[log].lease
        if lease is not None and self.session_live(lease[1]):
            return lease[0]
        return owner_of(log, self.live_servers())

    def producer_fill(self, p: Producer) -> None:
        """New writes while the window has room, then send what is unacknowledged."""
        while len(p.unacked) < self.cfg.window and p.next_seq <= self.cfg.records:
            p.unacked[p.next_seq] = True
            p.next_seq += 1
            self.producer_send(p, [p.next_seq - 1])

    def producer_send(self, p: Producer, seqs: list[int]) -> None:
        if not seqs:
            return
        p.target = p.target or self.find_owner(p.log)
        if p.target is None:
            self.at(50, self.producer_resend, p, p.gen)
            return
        section = (p, p.gen, seqs[0], len(seqs), min(p.unacked))
        if not self.cfg.mux:
            self.send(self.server_receive, p.target, [section])
            return
        waiting = self.outbox.setdefault(p.proc, [])
        if not waiting:  # the process's I/O thread sends them at the end of its turn
            self.at(0, self._send_sections, p.proc)
        waiting.append((p.target, section))

    def _send_sections(self, proc: int) -> None:
        """A process's requests of this moment: one message per server."""
        by_server: dict[str, list] = {}
        for target, section in self.outbox.pop(proc, []):
            by_server.setdefault(target, []).append(section)
        for target, sections in by_server.items():
            self.send(self.server_receive, target, sections)

    def producer_resend(self, p: Producer, gen: int) -> None:
        """Every unacknowledged write again, from the oldest, in one request."""
        if gen != p.gen or not p.unacked:
            return
        p.gen += 1
        p.last_progress = self.now
        self.producer_send(p, sorted(p.unacked))

    def producer_timer(self, p: Producer) -> None:
        if p.next_seq > self.cfg.records and not p.unacked:
            return  # finished
        if p.unacked and self.now - p.last_progress >= self.cfg.timeout_ms:
            self.stats["timeouts"] += 1
            p.target = None
            self.producer_resend(p, p.gen)
        self.at(self.cfg.timeout_ms // 2, self.producer_timer, p)

    def producer_receive(self, p: Producer, gen: int, kind: str, a, b) -> None:
        if kind == "written":
            p.last_progress = self.now
            for i, position in enumerate(b):
                seq = a + i
                if seq in p.unacked:
                    del p.unacked[seq]
                    p.acked[seq] = None if position == "old" else position
            self.producer_fill(p)
            return
        if gen != p.gen:
            return  # an error answer to an older round
        if kind == "not_owner":
            p.target = a
        elif kind == "retry":
            p.target = None
        self.stats[kind] += 1
        self.at(self.rng.randint(5, 50), self.producer_resend, p, gen)

    # -- run and check ------------------------------------------------------------------
    def run(self) -> str | None:
        for p in self.producers:
            self.at(0, self.producer_fill, p)
            self.at(self.cfg.timeout_ms // 2, self.producer_timer, p)
        self.at(self.rng.randint(1, self.cfg.crash_every_ms), self.faults)
        while self.queue:
            t, _, fn, args = heapq.heappop(self.queue)
            if t > END_MS:
                break
            self.now = t
            fn(*args)
            if all(p.next_seq > self.cfg.records and not p.unacked for p in self.producers):
                break
        return self.check()

    def check(self) -> str | None:
        for state in self.logs.values():
            seen = Counter(state.records)
            twice = [rec for rec, n in seen.items() if n > 1]
            if twice:
                pid, seq = twice[0]
                return f"stored-once: {len(twice)} records stored twice in {state.name}, " \
                    f"e.g. seq {seq} of {pid[:1]}"
        for p in self.producers:
            records = self.logs[p.log].records
            mine = [seq for pid, seq in records if pid == p.pid]
            if mine != sorted(mine):
                return f"producer-order: {p.name}'s records in the log: {mine[:20]}"
            if any(pid == p.pid for q in self.logs.values() if q.name != p.log
                   for pid, _ in q.records):
                return f"acked-kept: {p.name}'s records in another log"
            for seq, position in p.acked.items():
                if position is None:
                    if (p.pid, seq) not in records:
                        return f"acked-kept: {p.name} seq {seq} acknowledged, not in the log"
                elif position >= len(records) or records[position] != (p.pid, seq):
                    return f"acked-kept: {p.name} seq {seq} acknowledged at {position}, not there"
        unfinished = [p.name for p in self.producers
                      if p.next_seq <= self.cfg.records or p.unacked]
        if unfinished:
            return f"liveness: {unfinished} did not finish by {END_MS} ms"
        return None


@dataclass
class SimResult:
    seed: int
    violation: str | None
    stats: Counter
    trace: list


def run_service_seed(seed: int, break_dedup: bool = False, trace_max: int = 0,
                     break_oldest: bool = False, mux: bool | None = None) -> SimResult:
    world = World(random_config(seed, break_dedup, break_oldest, mux), trace_max)
    violation = world.run()
    world.stats["records"] = sum(len(state.records) for state in world.logs.values())
    world.stats["mux_seeds" if world.cfg.mux else "single_seeds"] += 1
    return SimResult(seed, violation, world.stats, world.trace)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.sim.logservicesim",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=300)
    parser.add_argument("--seed", type=int, help="run one seed and print its trace")
    parser.add_argument("--break-dedup", action="store_true",
                        help="every record counts as new (the checker must fail)")
    parser.add_argument("--break-oldest", action="store_true",
                        help="an unknown producer starts at the seq it sends, not at its "
                             "oldest unacknowledged write (the checker must fail)")
    parser.add_argument("--mux", choices=("on", "off", "seed"), default="seed",
                        help="multi-log messages: always, never, or as each seed draws")
    args = parser.parse_args(argv)
    mux = {"on": True, "off": False, "seed": None}[args.mux]
    if args.seed is not None:
        result = run_service_seed(args.seed, args.break_dedup, trace_max=2000,
                                  break_oldest=args.break_oldest, mux=mux)
        print("\n".join(result.trace))
        print(f"seed {args.seed}: {result.violation or 'ok'}; {dict(result.stats)}")
        return 1 if result.violation else 0
    failures, totals = [], Counter()
    for seed in range(args.seeds):
        result = run_service_seed(seed, args.break_dedup, break_oldest=args.break_oldest,
                                  mux=mux)
        totals.update(result.stats)
        if result.violation:
            failures.append(f"seed {seed}: {result.violation}")
    print(f"{args.seeds} seeds: {len(failures)} violation(s); {dict(totals)}")
    print("\n".join(failures[:10]))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
