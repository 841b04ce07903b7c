"""The log service (seed 003's write proxy) in a deterministic simulation.

One to three logs, each written by a producer of every producer process,
through log servers that crash, restart and pause; the network loses,
duplicates, delays and reorders whole messages.  Both sides are the real
cores, fed the real wire frames: each log's owner
(``appliance.protocol.log_owner.LogOwner``: duplicate filter and its
rebuild from the tail, group commit, the ledger's window, control entries,
answers, hand-over) and every producer
(``appliance.protocol.log_producer.ProducerCore``: numbering, window,
resends, redirects, back-off, deadline), driven as the product's producer
loop drives it (``tests/sim/logservice_producers.py``: a channel per
process and server, single or multi-log messages, the ``plain`` rule).
The simulator is the world around them, kept to what matters for
exactly-once:

* the ownership lease: one holder at a time, taken only when free or when
  its holder's session expired (``session_ms`` after its server crashed,
  or at once: its supervisor deletes it; or while it is paused);
* fencing: taking the log bumps its epoch; an old owner's entries not yet
  in the log are kept (found on a quorum: stored, never acknowledged) or
  dropped; its later entries fail (``EntryFailed``);
* the ledger: an entry is acknowledged ``commit_ms`` later at the log's
  next position, unless fenced; a server's periodic check (``check_ms``)
  hands over a log whose lease it lost or the hashing moved (``Close``);
* the metadata the producers look owners up in (the lease holder, else the
  hashing over live servers), and their server watch, telling a process a
  server crashed at once, once its session expired, or never (``gone``);
* the server's side of multi-log messages: every section judged alone
  (its own log, lease, owner, core), the answers for one connection at one
  moment in one MUX_REPLY; back-pressure (``ledger_window``) answered
  "retry" by the core.

Invariants (``logservice_check``; ``invariant()`` of both cores and
``one-writer-per-epoch`` / ``settled-once`` at every step):
``acked-kept`` (every write settled is in its log at the DLSN it was
given), ``stored-once``, ``producer-order``, ``one-writer-per-epoch``,
``settled-once``, ``liveness`` (every write settled, none failed).
Read-your-writes: a reader started when a write is settled reads the
entries below the last-add-confirmed the bookies know (``LogState.exposed``);
a write beyond it is counted (``ryw_unseen``), a violation with
``--read-your-writes`` (issue 46 item 4 is not built yet).

Fault switches, injected here (none in the product): ``--break-dedup``
gives every owner a filter that counts every record as new
(``ForgetfulTable``; caught as ``stored-once``).  ``--break-oldest`` runs
``WrongOldestCore``, whose requests name their first number as the
oldest unacknowledged write; the real core's requests already do (one in
flight, every generation from the oldest), so it changes none
(``oldest_rewritten`` stays 0) and nothing is caught.

    python -m tests.sim.logservicesim --seeds 2000
    python -m tests.sim.logservicesim --seeds 300 --break-dedup
    python -m tests.sim.logservicesim --seeds 300 --mux on    # processes share channels
    python -m tests.sim.logservicesim --seeds 300 --mux off   # a process per producer
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

from appliance.protocol import limits
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
from appliance.protocol.log_producer import ProducerCore
from appliance.protocol.log_service import (
    MUX_KIND,
    NOT_OWNER,
    DedupTable,
    decode_mux,
    decode_request,
    encode_header,
    join_mux_reply,
    mux_groups,
    owner_of,
    route_answer,
)
from tests.sim.logservice_check import check
from tests.sim.logservice_model import (
    END_MS,
    FAULTS_END_MS,
    RECORD_BYTES,
    Batch,
    ForgetfulTable,
    LogState,
    Owned,
    Server,
    SimConfig,
    random_config,
)
from tests.sim.logservice_producers import (
    ProducerProcess,
    SimProducer,
    WrongOldestCore,
)


def _echo(doc: dict) -> dict:
    """The fields of a request its reply repeats (``server._echo``)."""
    return {k: doc[k] for k in ("log", "pid", "seq", "gen") if k in doc}


class World:
    def __init__(self, cfg: SimConfig, trace_max: int = 0, read_your_writes: bool = False):
        self.cfg = cfg
        self.read_your_writes = read_your_writes  # an unseen acknowledged write: a violation
        self.rng = random.Random(cfg.seed * 7919 + 1)
        self.now = 0
        self.queue: list = []
        self.counter = 0
        self.logs = {name: LogState(name) for name in
                     ("orders", "payments", "events")[:cfg.logs]}
        self.sessions: dict[int, int | None] = {}  # session -> expiry (None: live)
        self.servers = {f"s{i}": Server(f"s{i}", self._new_session()) for i in range(cfg.servers)}
        # a producer per log in every process (``producers`` processes); --mux off:
        # each producer a process of its own (no channel shared, no multi-log message)
        make_core = WrongOldestCore if cfg.break_oldest else ProducerCore
        self.producers = [SimProducer(make_core(log, bytes([len(self.logs) * k + j + 1]) * 16),
                                      bytes([len(self.logs) * k + j + 1]) * 16, f"p{k}.{log}",
                                      log)
                          for k in range(cfg.producers) for j, log in enumerate(self.logs)]
        groups = [self.producers[k * len(self.logs):(k + 1) * len(self.logs)]
                  for k in range(cfg.producers)] if cfg.mux else [[p] for p in self.producers]
        self.procs = [ProducerProcess(self, k, group) for k, group in enumerate(groups)]
        self.answers: dict[tuple, list] = {}  # (server, incarnation, process, channel) -> answers
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
        return self.now < FAULTS_END_MS

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

    def server_receive(self, sid: str, proc: ProducerProcess, channel, frame: bytes) -> None:
        """A message from ``channel`` of ``proc``: one request, or a
        multi-log one whose sections are each judged alone (the server's
        ``_serve_mux``)."""
        server = self.servers[sid]
        if not self._runs(server, server.incarnation, self.server_receive, sid, proc, channel,
                          frame):
            return
        mux = frame[:1] == bytes([MUX_KIND])
        sections = decode_mux(frame, limits.LOG_SERVICE_MUX_SECTIONS_MAX,
                              limits.LOG_SERVICE_MUX_BYTES_MAX) if mux else [frame]
        served = Counter()
        for section in sections:
            doc, payloads = decode_request([section])
            served[self.serve(server, (proc, channel, mux, _echo(doc)), doc, payloads)] += 1
        if mux and len(sections) > 1:
            # one message, some sections redirected and others written: the seeds
            # cover a lease that moved between the logs of one message
            self.stats["mux_mixed"] += bool(served[True] and served[False])

    def serve(self, server: Server, token: tuple, doc: dict, payloads: list) -> bool:
        """One write request (or section): to its log's core if this server
        owns the log or takes it now, else answered ``not_owner`` (False)."""
        state = self.logs[doc["log"]]
        if state.name not in server.owned and not self.take_log(server, state):
            owner = self.find_owner(state.name)  # (the lease's endpoint, else the hashing)
            self.queue_answer(server, token, {"op": "error", "code": NOT_OWNER,
                                              "endpoint": owner, "message": "not owner"})
            self.stats["not_owner"] += 1
            return False
        self.step(server.owned[state.name], Write(token, bytes.fromhex(doc["pid"]), doc["seq"],
                                                  doc["oldest"], payloads, self.now))
        return True

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
                self._writer_closed(owned)
                self.at(self.rng.randint(1, 20), self.owner_event, owned, WriterClosed)
            elif kind is ReleaseLease:
                self._release(server, owned)
        due = owned.core.next_due_ms()
        if due != math.inf and due != owned.tick_at:
            owned.tick_at = due
            self.at(max(0, math.ceil(due - self.now)), self.owner_event, owned, Tick)

    def _writer_closed(self, owned: Owned) -> None:
        """Closing the writer seals its segment: a reader sees all of it."""
        state = self.logs[owned.log]
        if state.epoch == owned.epoch and not owned.sent:
            state.exposed = len(state.entries)

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
        """The core's answer as the server sends it (``OwnedLog._reply``)."""
        answer = reply.answer
        if answer is Answer.WRITTEN:
            doc = {"op": "written", "runs": reply.runs}
        elif answer is Answer.HELLO:
            doc = {"op": "hello", "next_seq": reply.next_seq}
        else:
            doc = {"op": "error", "code": answer.value, "message": reply.message}
            if answer in (Answer.GAP, Answer.FULL):
                doc["expected"] = reply.expected
            self.stats[answer.value] += 1
        self.queue_answer(server, reply.token, doc)

    def _release(self, server: Server, owned: Owned) -> None:
        state = self.logs[owned.log]
        if state.lease == (server.id, server.session):
            state.lease = None
        self.step(owned, LeaseReleased(self.now))
        if server.owned.get(owned.log) is owned:
            del server.owned[owned.log]
        self.note(f"{server.id}: {owned.log} let go")

    def queue_answer(self, server: Server, token: tuple, doc: dict) -> None:
        """An answer, sent at the end of this moment: a single request's
        alone, a multi-log section's with the others for its connection in
        one MUX_REPLY (``LogServer.queue_reply`` / ``_send_replies``)."""
        proc, channel, mux, echo = token
        frame = encode_header({**echo, **doc})
        if mux:
            frame = route_answer(echo["log"].encode(), bytes.fromhex(echo["pid"]), frame)
        key = (server.id, server.incarnation, proc, id(channel))
        waiting = self.answers.setdefault(key, [])
        if not waiting:
            self.at(0, self._send_answers, key, channel)
        waiting.append((mux, frame))

    def _send_answers(self, key: tuple, channel) -> None:
        waiting = self.answers.pop(key, [])
        server, proc = self.servers[key[0]], key[2]
        if not server.alive or server.incarnation != key[1]:
            return  # its process died with them queued
        routed = [frame for mux, frame in waiting if mux]
        for frame in (frame for mux, frame in waiting if not mux):
            self.send(proc.receive, channel, frame)
        for group in mux_groups(routed, limits.LOG_SERVICE_MUX_SECTIONS_MAX,
                                limits.LOG_SERVICE_MUX_BYTES_MAX - 64):
            self.stats["mux_answers"] += len(group)
            self.send(proc.receive, channel, join_mux_reply(group))

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
        state.exposed = len(state.entries)  # the recovery sealed the old segment
        state.epoch += 1

    def _append(self, state: LogState, batch: Batch) -> int:
        """``batch`` becomes the log's next entry; its index.  One writer per
        epoch: the owner whose writer took that epoch."""
        writer = state.writers.setdefault(batch.owned.epoch, batch.owned)
        if writer is not batch.owned and self.violation is None:
            self.violation = (f"one-writer-per-epoch: {state.name} epoch {batch.owned.epoch} "
                              f"written by {writer.sid} and {batch.owned.sid}")
        if state.entries and state.writers.get(batch.owned.epoch) is writer:
            state.exposed = max(state.exposed, len(state.entries))  # its LAC, piggybacked
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
        # its supervisor deletes its registration and leases at once (``prompt``),
        # else they go when its session expires
        gone_ms = self.rng.randint(0, 20) if self.cfg.gone == "prompt" else self.cfg.session_ms
        self.sessions[server.session] = self.now + gone_ms
        self.tell_gone(sid, gone_ms + self.rng.randint(0, 50))
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
            self.tell_gone(sid, self.cfg.session_ms + self.rng.randint(0, 50))
        self.note(f"{sid} pauses {length} ms")
        self.stats["pauses"] += 1

    def tell_gone(self, sid: str, delay_ms: int) -> None:
        """Each producer process's server watch on ``sid`` (one per channel
        open to it now) tells it ``delay_ms`` from now that the server's
        registration went: the supervisor deletes a dead server's at once
        (``prompt``), else it goes with its session (``late``); or the
        watch never tells (``never``: the request timeout finds out)."""
        if self.cfg.gone == "never":
            return
        for proc in self.procs:
            channel = proc.channels.get(sid)
            if channel is not None:
                self.at(delay_ms, proc.server_gone, sid, channel)

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

    # -- producers ---------------------------------------------------------------------------
    def find_owner(self, log: str) -> str | None:
        """The metadata's answer (``Producer._find_owner``): the lease holder
        (its ephemeral node is there while its session lives), else the live
        server the hashing names."""
        lease = self.logs[log].lease
        if lease is not None and self.session_live(lease[1]):
            return lease[0]
        return owner_of(log, self.live_servers())

    def acknowledged(self, p: SimProducer, seq: int, dlsn) -> None:
        """``p``'s write ``seq`` settled at ``dlsn``: would a reader started
        now see it?  (Counted, see ``exposed``.)"""
        self.stats["acknowledged"] += 1
        state = self.logs[p.log]
        where = dlsn[1] if dlsn is not None else \
            next((e for e, entry in enumerate(state.entries) if (p.pid, seq) in entry), None)
        if where is None or where >= state.exposed:
            self.stats["ryw_unseen"] += 1
            if self.read_your_writes:
                self.broken_rule("read-your-writes", f"{p.name} write {seq} acknowledged in "
                                 f"entry {where} of {p.log}; a reader started now reads "
                                 f"{state.exposed} entries")

    def broken(self, exc: InvariantViolation) -> None:
        self.broken_rule(exc.rule or "core-invariant", str(exc))

    def broken_rule(self, rule: str, text: str) -> None:
        if self.violation is None:
            self.violation = f"{rule}: {text}"

    # -- run ---------------------------------------------------------------------------------
    def run(self) -> str | None:
        for proc in self.procs:
            proc.start()
        self.at(self.rng.randint(1, self.cfg.crash_every_ms), self.faults)
        for sid in self.servers:
            self.at(self.cfg.check_ms, self.check_owned, sid)
        while self.queue and self.violation is None:
            t, _, fn, args = heapq.heappop(self.queue)
            if t > END_MS:
                break
            self.now = t
            fn(*args)
            if all(proc.finished() for proc in self.procs):
                break
        for core in self.cores:
            self.stats.update({k: core.stats[k] for k in ("duplicates", "busy",
                                                          "control_entries", "entries")})
        for p in self.producers:
            self.stats.update({k: v for k, v in p.core.stats.items() if v})
        return self.violation or check(self)


@dataclass
class SimResult:
    seed: int
    violation: str | None
    stats: Counter
    trace: list


def run_service_seed(seed: int, break_dedup: bool = False, trace_max: int = 0,
                     break_oldest: bool = False, mux: bool | None = None,
                     read_your_writes: bool = False) -> SimResult:
    world = World(random_config(seed, break_dedup, break_oldest, mux), trace_max,
                  read_your_writes)
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
                        help="every write request names its first seq as the producer's "
                             "oldest unacknowledged write (WrongOldestCore)")
    parser.add_argument("--read-your-writes", action="store_true",
                        help="an acknowledged write a reader started at once would not see "
                             "is a violation (issue 46 item 4; counted as ryw_unseen "
                             "otherwise)")
    parser.add_argument("--mux", choices=("on", "off", "seed"), default="seed",
                        help="multi-log messages: always, never, or as each seed draws")
    args = parser.parse_args(argv)
    mux = {"on": True, "off": False, "seed": None}[args.mux]
    switches = {"break_oldest": args.break_oldest, "mux": mux,
                "read_your_writes": args.read_your_writes}
    if args.seed is not None:
        result = run_service_seed(args.seed, args.break_dedup, trace_max=2000, **switches)
        print("\n".join(result.trace))
        print(f"seed {args.seed}: {result.violation or 'ok'}; {dict(result.stats)}")
        return 1 if result.violation else 0
    failures, totals = [], Counter()
    for seed in range(args.seeds):
        result = run_service_seed(seed, args.break_dedup, **switches)
        totals.update(result.stats)
        if result.violation:
            failures.append(f"seed {seed}: {result.violation}")
    print(f"{args.seeds} seeds: {len(failures)} violation(s); {dict(totals)}")
    print("\n".join(failures[:10]))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
