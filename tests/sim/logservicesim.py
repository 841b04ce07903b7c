"""The log service (seed 003's write proxy) in a deterministic simulation.

One to three logs, each written by an idempotent producer of every producer
process, through log servers that crash, restart and pause; the network
loses, duplicates, delays and reorders messages.  What runs as the owner of
a log is the real core (``appliance.protocol.log_owner.LogOwner``: its
duplicate filter and rebuild from the log's tail, group commit with the
gather rule and the linger, the ledger's window, control entries, the
answers, hand-over), and the real spread (``owner_of``).  The simulator is
the world around it, kept to what matters for exactly-once:

* the ownership lease: one holder at a time, taken only when free or when
  its holder's session expired (a session expires ``session_ms`` after its
  server crashed or while it is paused);
* fencing: taking the log bumps the log's epoch; an old owner's entries
  that had not reached the log are, at the fence, either kept (the
  recovery found them on a quorum: stored, never acknowledged) or dropped;
  its later entries fail (``EntryFailed``: the core drops the log);
* the ledger: an entry the core sends is acknowledged ``commit_ms`` later
  at the next position of the log, unless fenced;
* a server's periodic check (``check_ms``): a log whose lease its session
  lost, or that the hashing gives to another live server, is handed over
  (``Close``: the core sends what it holds, then closes and lets go);
* producers: a window of unacknowledged writes, numbered 1, 2, 3, ...; a
  request unanswered for ``timeout_ms`` (or answered retry / gap / not
  owner) makes the producer send every unacknowledged write again, to the
  owner it finds (the lease holder, else the hashing over live servers);
* multi-log requests (``mux``, most seeds): the requests a process's
  producers send to one server at one moment leave as one message, a
  section each (``appliance.logs.producer_loop``); the server judges every
  section alone (its own log, lease, owner, core: one section may be
  written while another is answered not_owner or retry), and the answers
  it has for one process at one moment leave as one message.  Both
  messages are lost, duplicated, delayed and reordered as a whole, and
  they cross crashes and leases moving between their sections' logs.
* back-pressure (``ledger_window``, a quarter of the seeds each 1 or 2,
  with entries cut small): a request whose entries the ledger's window has
  no room for is answered "retry" before any of it is judged.

Invariants, checked once the faults stop and every producer finished (and
the core's own, ``invariant()``, at every step):

``acked-kept``            every acknowledged write is in its log at the
                          position its answer gave;
``stored-once``           no (producer, seq) is in a log twice;
``producer-order``        each producer's records are in its log in its order;
``one-writer-per-epoch``  every entry of an epoch comes from the one owner
                          whose writer took that epoch;
``liveness``              every producer finished its writes.

Fault switches, injected here (none in the product): ``break_dedup=True``
gives every owner a filter that counts every record as new
(``ForgetfulTable``): retries are stored again, and ``stored-once`` must
catch it.  ``break_oldest=True`` lets a producer the owner does not know
start at the first number it sends rather than at its oldest
unacknowledged write: a request that overtook an earlier one then hides
the earlier writes as "duplicates" (``acked-kept``).

    python -m tests.sim.logservicesim --seeds 300
    python -m tests.sim.logservicesim --seeds 300 --break-dedup
    python -m tests.sim.logservicesim --seeds 300 --break-oldest
    python -m tests.sim.logservicesim --seeds 300 --mux on    # every seed multi-log
    python -m tests.sim.logservicesim --seed 17          # one seed, with its trace
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import sys
from collections import Counter
from dataclasses import dataclass

from appliance.protocol.invariant import InvariantViolation
from appliance.protocol.log_owner import Answer, LogOwner, OwnerConfig, OwnerState
from appliance.protocol.log_owner_events import (
    Close,
    CloseWriter,
    EntryAcked,
    EntryFailed,
    LeaseReleased,
    Opened,
    ReleaseLease,
    Reply,
    SendControl,
    SendEntry,
    Tick,
    Write,
    WriterClosed,
)
from appliance.protocol.log_service import DedupTable, owner_of, runs_dlsns
from tests.sim.logservice_model import (
    END_MS,
    RECORD_BYTES,
    Batch,
    ForgetfulTable,
    LogState,
    Owned,
    Producer,
    Server,
    SimConfig,
    random_config,
)


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
        self.answers: dict[tuple, list] = {}  # (server id, incarnation, process) -> answers
        self.trace: list[str] = []
        self.trace_max = trace_max
        self.stats = Counter()
        self.violation: str | None = None  # a core's invariant, or the world's, broken
        self.cores: list[LogOwner] = []  # every owner core made (their counters)
        self.owner_config = OwnerConfig(
            linger_ms=cfg.linger_ms, gather_ms=cfg.gather_ms, entries_inflight_max=2,
            window_entries=cfg.ledger_window or 1_000, window_bytes=1 << 30,
            flush_bytes=cfg.entry_records * RECORD_BYTES, entry_room_bytes=1 << 20,
            record_overhead=RECORD_BYTES - 2, control_interval_ms=cfg.control_ms,
            producers_max=64, recent_max=4096, producer_idle_ms=10**9)
        self.make_table = (lambda: ForgetfulTable(64, 4096, 10**9)) if cfg.break_dedup else \
            (lambda: DedupTable(64, 4096, 10**9))

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
    def _runs(self, server: Server, incarnation: int, fn, *args) -> bool:
        """Does ``server``'s process ``incarnation`` run ``fn`` now?  False
        if it died meanwhile (its work dies with it); a paused one runs it
        once it resumes (rescheduled here)."""
        if not server.alive or server.incarnation != incarnation:
            return False
        if self.now < server.paused_until:
            self.at(server.paused_until - self.now, fn, *args)
            return False
        return True

    def server_receive(self, sid: str, sections: list) -> None:
        """A request (one section) or a multi-log one (several): each
        section ``(producer, gen, seq0, n, oldest)`` is judged alone."""
        server = self.servers[sid]
        if not self._runs(server, server.incarnation, self.server_receive, sid, sections):
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
            owned = server.owned[producer.log]
            if self.cfg.break_oldest:
                oldest = seq0
            payloads = [b"%d" % (seq0 + i) for i in range(n)]
            self.step(owned, Write((producer, gen, seq0), producer.pid, seq0, oldest,
                                   payloads, self.now))
            written += 1
        if len(sections) > 1:
            self.stats["mux_sections"] += len(sections)
            # one message, some sections redirected and others written: the seeds
            # cover a lease that moved between the logs of one message
            self.stats["mux_mixed"] += bool(redirected and written)

    def step(self, owned: Owned, event) -> None:
        """Feed ``owned``'s core one event and carry out its actions."""
        try:
            actions = owned.core.handle(event)
        except InvariantViolation as exc:
            if self.violation is None:
                self.violation = f"{exc.rule or 'core-invariant'}: {exc}"
            return
        server = self.servers[owned.sid]
        for action in actions:
            kind = type(action)
            if kind is Reply:
                self._reply(server, action)
            elif kind is SendEntry or kind is SendControl:
                records = [] if kind is SendControl else list(action.tags)
                batch = Batch(owned, action.entry_no, records, control=kind is SendControl)
                owned.sent.append(batch)
                self.at(self.cfg.commit_ms, self.commit, batch)
            elif kind is CloseWriter:
                self.at(self.rng.randint(1, 20), self.owner_event, owned, WriterClosed)
            elif kind is ReleaseLease:
                self._release(server, owned)
        due = owned.core.next_due_ms()
        if due != math.inf and due != owned.tick_at:
            owned.tick_at = due
            self.at(max(0, math.ceil(due - self.now)), self.owner_event, owned, Tick)

    def owner_event(self, owned: Owned, kind) -> None:
        """A timer or a driver's completion for ``owned``'s core (``Tick``,
        ``WriterClosed``, ``LeaseReleased``), in its process."""
        server = self.servers[owned.sid]
        if not self._runs(server, owned.incarnation, self.owner_event, owned, kind):
            return
        if kind is Tick:
            owned.tick_at = -1.0
        self.step(owned, kind(self.now))

    def _reply(self, server: Server, reply: Reply) -> None:
        producer, gen, seq0 = reply.token
        if reply.answer is Answer.WRITTEN:
            self.answer(server, producer, gen, "written", seq0, runs_dlsns(reply.runs))
        else:
            self.answer(server, producer, gen, reply.answer.value, None, reply.expected)

    def _release(self, server: Server, owned: Owned) -> None:
        state = self.logs[owned.log]
        if state.lease == (server.id, server.session):
            state.lease = None
        self.step(owned, LeaseReleased(self.now))
        if server.owned.get(owned.log) is owned:
            del server.owned[owned.log]
        self.note(f"{server.id}: {owned.log} let go")

    def answer(self, server: Server, producer: Producer, gen: int, kind: str, a, b) -> None:
        """A section's answer: alone, or (mux) with the other answers this
        server has for the producer's process at this moment, in one message."""
        if not self.cfg.mux:
            self.send(self.producer_receive, producer, gen, kind, a, b)
            return
        key = (server.id, server.incarnation, producer.proc)
        waiting = self.answers.setdefault(key, [])
        if not waiting:
            self.at(0, self._send_answers, key)
        waiting.append((producer, gen, kind, a, b))

    def _send_answers(self, key: tuple) -> None:
        waiting = self.answers.pop(key, [])
        server = self.servers[key[0]]
        if not waiting or not server.alive or server.incarnation != key[1]:
            return  # its process died with them queued
        if len(waiting) > 1:
            self.stats["mux_answers"] += len(waiting)
        self.send(self.deliver_answers, waiting)

    def deliver_answers(self, answers: list) -> None:
        for answer in answers:
            self.producer_receive(*answer)

    def take_log(self, server: Server, state: LogState) -> bool:
        """Take the lease (free, or its session expired, and the hashing names
        this server), fence the previous owner; the core opens once the
        writer recovered the log (``open_ms`` later: requests meanwhile are
        answered "retry")."""
        if state.lease is not None and self.session_live(state.lease[1]):
            if state.lease[1] != server.session:
                return False
        elif owner_of(state.name, self.live_servers()) != server.id:
            return False
        state.lease = (server.id, server.session)
        self.fence(state)
        core = LogOwner(state.name, self.owner_config, self.make_table())
        owned = Owned(server.id, server.incarnation, state.name, state.epoch, core)
        server.owned[state.name] = owned
        self.cores.append(core)
        self.stats["takeovers"] += 1
        self.note(f"{server.id} takes {state.name}: epoch {state.epoch}, "
                  f"{len(state.entries)} entries")
        self.at(self.rng.randint(0, 20), self.open_done, owned)
        return True

    def open_done(self, owned: Owned) -> None:
        """The writer took the log over: the filter learns its tail (in log
        order), as ``appliance.logservice.owned.learn_tail`` reads it."""
        server = self.servers[owned.sid]
        if not self._runs(server, owned.incarnation, self.open_done, owned):
            return
        state = self.logs[owned.log]
        learnt = tuple((pid, seq, (1, e, slot)) for e, entry in enumerate(state.entries)
                       for slot, (pid, seq) in enumerate(entry))
        self.step(owned, Opened(self.now, learnt, owned.epoch))

    def fence(self, state: LogState) -> None:
        """The new owner fences the old one's segment: of the entries not yet
        in the log, the recovery keeps a prefix (entries on a quorum; never
        acknowledged) and the rest are lost."""
        groups = [state.orphans] + [
            o.sent for s in self.servers.values()
            if (o := s.owned.get(state.name)) is not None]
        state.orphans = []
        for group in groups:
            pending = [b for b in group if not b.done]
            kept = self.rng.randint(0, len(pending))
            for i, batch in enumerate(pending):
                batch.done = True
                if i < kept:
                    self._append(state, batch)
                    self.stats["kept_unacked"] += len(batch.records)
        state.epoch += 1

    def _append(self, state: LogState, batch: Batch) -> int:
        """``batch`` becomes the log's next entry; its index.  One writer per
        epoch: the owner whose writer took that epoch."""
        writer = state.writers.setdefault(batch.owned.epoch, batch.owned)
        if writer is not batch.owned and self.violation is None:
            self.violation = (f"one-writer-per-epoch: {state.name} epoch {batch.owned.epoch} "
                              f"written by {writer.sid} and {batch.owned.sid}")
        state.entries.append(batch.records)
        return len(state.entries) - 1

    def commit(self, batch: Batch) -> None:
        """The ledger's answer to an entry: stored, or fenced (a newer owner
        took the log: the entry fails, and the core drops the log)."""
        owned = batch.owned
        server = self.servers[owned.sid]
        if not self._runs(server, owned.incarnation, self.commit, batch):
            return  # its process died: the fence decides
        if owned.sent[0] is not batch:  # the ledger answers in order (a pause reordered)
            self.at(1, self.commit, batch)
            return
        owned.sent.remove(batch)
        state = self.logs[owned.log]
        if batch.done or owned.epoch != state.epoch:
            batch.done = True
            self.stats["fenced_commits"] += 1
            self.note(f"{owned.sid}: entry {batch.entry_no} of {owned.log} fenced")
            self.step(owned, EntryFailed(batch.entry_no, "fenced", self.now))
            return
        batch.done = True
        entry = self._append(state, batch)
        runs = [[1, entry, 0, len(batch.records)]] if batch.records else []
        self.step(owned, EntryAcked(batch.entry_no, runs, self.now))

    def crash(self, sid: str) -> None:
        server = self.servers[sid]
        if not server.alive:
            return
        for log, owned in server.owned.items():  # its last entries: as the fence decides
            self.logs[log].orphans += owned.sent
        server.alive, server.owned = False, {}
        server.incarnation += 1
        self.sessions[server.session] = self.now + self.cfg.session_ms
        self.note(f"{sid} crashes")
        self.stats["crashes"] += 1
        self.at(self.rng.randint(10, 3 * self.cfg.session_ms), self.restart, sid)

    def restart(self, sid: str) -> None:
        server = self.servers[sid]
        server.alive, server.session = True, self._new_session()
        server.incarnation += 1
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
        periodic check it still acts as the owner: a stale owner, whose
        entries the fence refuses."""
        server = self.servers[sid]
        if server.alive:
            server.session = self._new_session()

    def check_owned(self, sid: str) -> None:
        """A server's periodic check (``LogServer._check_owned``): a log whose
        lease this session lost, or the hashing now gives to another live
        server, is handed over (``Close``)."""
        server = self.servers[sid]
        self.at(self.cfg.check_ms, self.check_owned, sid)
        if not server.alive or self.now < server.paused_until:
            return
        live = self.live_servers()
        for log, owned in list(server.owned.items()):
            lost = self.logs[log].lease != (server.id, server.session)
            target = owner_of(log, live)
            if lost or (target is not None and target != server.id):
                if owned.core.state is OwnerState.OPEN:
                    self.stats["handovers" if not lost else "leases_lost"] += 1
                    self.note(f"{sid}: {log} {'lease lost' if lost else 'to ' + target}")
                self.step(owned, Close(self.now))

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
        for sid in self.servers:
            self.at(self.cfg.check_ms, self.check_owned, sid)
        while self.queue and self.violation is None:
            t, _, fn, args = heapq.heappop(self.queue)
            if t > END_MS:
                break
            self.now = t
            fn(*args)
            if all(p.next_seq > self.cfg.records and not p.unacked for p in self.producers):
                break
        for core in self.cores:
            self.stats.update({k: core.stats[k] for k in ("duplicates", "busy",
                                                          "control_entries", "entries")})
        return self.violation or self.check()

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
            entries = self.logs[p.log].entries
            for seq, position in p.acked.items():
                if position is None:
                    if (p.pid, seq) not in records:
                        return f"acked-kept: {p.name} seq {seq} acknowledged, not in the log"
                    continue
                _, entry, slot = position
                if entry >= len(entries) or slot >= len(entries[entry]) or \
                        entries[entry][slot] != (p.pid, seq):
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
