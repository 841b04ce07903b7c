"""Simulated processes: bookies (the real ``BookieCore`` over ``MemStorage``),
the CAS metadata store, and ``CoreHost``, which runs real client cores by
carrying out their actions and feeding back events.

Bookie durability modes:

* journal (``journal=True``): a reply waits until its ticket is synced
  (group commit every ``sync_interval_ms``) by the product's own rule,
  ``appliance.protocol.durable_replies``; a crash loses only what was
  never acknowledged.
* journal-less (BP-46): replies go out at once and storage is flushed every
  ``flush_interval_ms``; a crash loses acknowledged entries *and* fence
  flags.  The BP-46 boot rule (fence + limbo) runs after such a crash,
  then phase two: the bookie waits for the ledger to be closed, reads the
  missing entries of its share from the other replicas over the simulated
  network (only a positive whose header names the entry is data), and
  clears limbo when ``appliance.protocol.repair.may_clear_limbo`` says the
  share is durably whole.
* the scrub (``appliance.protocol.scrub``; random runs only): every
  ``SCRUB_INTERVAL_MS`` a running bookie looks at the ledger; once it is
  CLOSED and this bookie lacks part of its share (it lagged or was cut off
  and no one healed it: the writer died, or recovery closed it), the ledger
  goes into limbo and the repair above copies the missing entries.
"""

from __future__ import annotations

import dataclasses
import itertools

from appliance.errors import OK, MetadataVersionError, NoNodeError
from appliance.protocol import events as ev
from appliance.protocol import repair, scrub
from appliance.protocol.bookie import BookieCore
from appliance.protocol.durable_replies import DurableReplies
from appliance.protocol.entry import HEADER
from appliance.protocol.metadata import CLOSED
from appliance.protocol.read_batch import batch_rows, batch_window
from tests.sim.storage import MemStorage
from tests.sim.world import World, describe

PARKED_REPLIES_MAX = 1_000_000  # far above what a seed parks: the bound never decides
REPAIR_TICK_MS = 20  # a repairing bookie re-checks its limbo ledgers this often
SCRUB_INTERVAL_MS = 200  # a bookie's scrub looks at the ledger this often (about 2 add timeouts)


class SimBookie:
    def __init__(self, world: World, name: str, *, journal: bool, protections, on_store,
                 sync_interval_ms: int, flush_interval_ms: int,
                 batch_limits: tuple[int, int] = (64, 1 << 20)):
        self.world, self.name, self.journal = world, name, journal
        self.storage = MemStorage(on_add=lambda lid, eid, data: on_store(name, lid, eid, data))
        self.core = BookieCore(self.storage, protections=protections)
        self.sync_interval_ms = sync_interval_ms
        self.flush_interval_ms = flush_interval_ms
        self.batch_entries_max, self.batch_bytes_max = batch_limits
        self.up = True
        self.unclean = False
        self.crashes = 0
        # (dst, replies) parked until their ticket is durable: the product's rule
        self._waiting = DurableReplies(PARKED_REPLIES_MAX, protections=protections)
        self._sync_armed = False
        self._incarnation = 0
        self.after_request = None  # the nemesis hook: called after each request served
        self.on_served = None  # checker hook: (bookie, read request, replies, reads_need_key)
        # BP-46 phase two (appliance.protocol.repair decides every step)
        self.meta = None  # the cluster's MetaStore, set by the cluster
        self.on_limbo_cleared = None  # checker hook: (bookie, ledger id, metadata)
        self._repair_armed = False
        self._repair_rid = 0
        self.repair_stats = {"started": 0, "copied": 0, "cleared": 0, "scrubbed": 0}
        self.repaired: dict[int, bool] = {}  # ledger -> limbo cleared by repair
        # a ledger's key for repair reads when this bookie lost its own (metadata ->
        # key): the cluster's key custody (appliance.bookie.repair.ledger_key)
        self.key_for = None
        self.batch_replies = False  # one AddResponses per SendAdd instead of one per entry
        self.stopped_until = 0  # stalled (SIGSTOP) until then: requests queue up
        self.refuse_adds = 0  # an error code: answer every add with it, store nothing (a
        world.nodes[name] = self  # read-only or failing disk, appliance.bookie.disk_monitor)

    # -- requests -------------------------------------------------------------------------
    def receive(self, src: str, msg) -> None:
        if not self.up:
            return
        if self.world.now_ms < self.stopped_until:  # SIGSTOP: queued until it runs again
            self.world.at(self.stopped_until, self.receive, src, msg)
            return
        kind = type(msg)
        core = self.core
        if kind is ev.ReadResponse:
            self._repair_copy(msg)
            return
        if kind is ev.SendAdd:
            if self.refuse_adds and not msg.recovery:
                codes, ticket = [self.refuse_adds] * len(msg.entry_ids), 0
            else:
                codes, ticket = core.add_batch(msg.ledger_id, msg.entry_ids, msg.datas,
                                               msg.master_key, msg.recovery)
            if self.batch_replies:
                replies = [ev.AddResponses(msg.request_id, self.name, msg.ledger_id,
                                           msg.entry_ids, tuple(codes))]
            else:
                replies = [ev.AddResponse(msg.request_id, self.name, msg.ledger_id, e, code)
                           for e, code in zip(msg.entry_ids, codes, strict=True)]
        elif kind is ev.SendRead:
            reply = core.read(msg.ledger_id, msg.entry_id, msg.fence, msg.master_key)
            ticket = reply.ticket
            replies = [ev.ReadResponse(msg.request_id, self.name, msg.ledger_id, msg.entry_id,
                                       reply.code, reply.data)]
        elif kind is ev.SendReadBatch:
            replies, ticket = self._read_batch(msg)
        elif kind is ev.SendReadLac:
            reply = core.read_lac(msg.ledger_id, msg.fence, msg.master_key)
            ticket = reply.ticket
            replies = [ev.ReadLacResponse(msg.request_id, self.name, msg.ledger_id, reply.code,
                                          reply.lac)]
        elif kind is ev.SendWriteLac:
            core.write_lac(msg.ledger_id, msg.lac, msg.master_key)
            return
        elif kind is ev.SendWriteClose:  # advisory: no reply
            core.write_close(msg.ledger_id, msg.master_key)
            return
        else:
            raise TypeError(f"bookie got {kind.__name__}")
        if self.on_served is not None and kind is not ev.SendAdd:
            self.on_served(self.name, msg, replies, core.reads_need_key)
        self._reply(src, replies, ticket)
        if self.after_request is not None:
            self.after_request(self.name, getattr(msg, "fence", False))

    def _read_batch(self, msg: ev.SendReadBatch) -> tuple[list, int]:
        """Rows by the product's batch rule; the reply waits for the first
        read's ticket, as the real bookie's does."""
        window = batch_window(msg.first_entry_id, msg.last_entry_id,
                              msg.last_entry_id - msg.first_entry_id + 1, 1 << 30,
                              self.batch_entries_max, self.batch_bytes_max)
        tickets = []

        def read_one(entry_id: int):
            reply = self.core.read(msg.ledger_id, entry_id, False, msg.master_key)
            tickets.append(reply.ticket)
            return reply.code, reply.data

        ids, codes, datas = zip(*batch_rows(window, read_one), strict=True)
        return [ev.ReadBatchResponse(msg.request_id, self.name, msg.ledger_id, OK, ids, codes,
                                     datas)], tickets[0]

    def _reply(self, dst: str, replies: list, ticket: int) -> None:
        # journal-less (BP-46): acknowledged before the flush, so nothing waits
        wait_for = ticket if self.journal else 0
        if self._waiting.hold(wait_for, self.storage.durable_ticket, (dst, replies)):
            for reply in replies:
                self.world.net.send(self.name, dst, reply)
        if self.storage.unsynced_ops:
            self._arm_sync()

    def _arm_sync(self) -> None:
        if not self._sync_armed:
            self._sync_armed = True
            delay = self.sync_interval_ms if self.journal else self.flush_interval_ms
            self.world.schedule(delay, self._sync, self._incarnation)

    def _sync(self, incarnation: int) -> None:
        if incarnation != self._incarnation or not self.up:
            return
        self._sync_armed = False
        self.storage.sync()
        for dst, replies in self._waiting.release(self.storage.durable_ticket):
            for reply in replies:
                self.world.net.send(self.name, dst, reply)

    # -- crash and restart ---------------------------------------------------------------
    def crash(self, keep_ops: int = 0) -> dict[int, set[int]]:
        """Die at once: unsynced changes after the first ``keep_ops`` are lost."""
        self.up = False
        self.unclean = True
        self.crashes += 1
        self._incarnation += 1
        self._waiting.clear()
        self._sync_armed = False
        lost = self.storage.crash(keep_ops)
        self.world.log(f"CRASH {self.name} (lost entries {_fmt_lost(lost)})")
        return lost

    def stop_cleanly(self) -> None:
        self._sync(self._incarnation)
        self.up = False
        self._incarnation += 1
        self._sync_armed = False
        self.world.log(f"stop {self.name} (clean)")

    def restart(self, boot_ledgers) -> None:
        """Boot: after an unclean stop without a journal, apply BP-46 first
        (phase one), then repair in the background (phase two)."""
        possible_loss = self.unclean and not self.journal
        self.core.boot(boot_ledgers, possible_loss)
        self.storage.sync()  # boot marks are durable before serving
        self.unclean = False
        self.up = True
        self.world.log(f"restart {self.name}" + (" (BP-46 boot rule)" if possible_loss else ""))
        if any(self.storage.is_limbo(lid) for lid in self.storage.ledgers()):
            self.repair_stats["started"] += 1
            self._arm_repair()

    # -- BP-46 phase two: repair from peers --------------------------------------------
    def _arm_repair(self) -> None:
        if not self._repair_armed:
            self._repair_armed = True
            self.world.schedule(REPAIR_TICK_MS, self._repair_tick, self._incarnation)

    def _repair_tick(self, incarnation: int) -> None:
        """One pass over the limbo ledgers: wait for a close (the sim's writer,
        recoveries and readers close the ledger), ask the other replicas for
        missing share entries, clear limbo once the share is durably whole.
        A crash stops the pass; the next boot resumes (limbo is durable)."""
        self._repair_armed = False
        if incarnation != self._incarnation or not self.up:
            return
        storage = self.storage
        pending = False
        for ledger_id in [lid for lid in storage.ledgers() if storage.is_limbo(lid)]:
            md, _ = self.meta.get(ledger_id)
            step = repair.next_step(md, self.name,
                                    lambda e, lid=ledger_id: storage.durable_has(lid, e))
            if step == repair.COPY:
                key = self._repair_key(ledger_id, md)
                if key and storage.get_master_key(ledger_id) is None:
                    storage.set_master_key(ledger_id, key)  # as the real repair: copies keyed
                for first, last in repair.missing_runs(
                        repair.share_runs(md, self.name),
                        lambda e, lid=ledger_id: storage.has(lid, e)):
                    for entry_id in range(first, last + 1):
                        for source in repair.sources(md, self.name, entry_id):
                            self._repair_rid += 1
                            self.world.net.send(self.name, source, ev.SendRead(
                                -self._repair_rid, source, ledger_id, entry_id, False, key))
                if storage.unsynced_ops:
                    self._arm_sync()
            if repair.may_clear_limbo(md, self.name,
                                      lambda e, lid=ledger_id: storage.durable_has(lid, e),
                                      protections=self.core.protections):
                self.core.clear_limbo(ledger_id)
                storage.sync()  # the clear is durable (the real bookie waits for it)
                self.repair_stats["cleared"] += 1
                self.repaired[ledger_id] = True
                self.world.log(f"{self.name} repaired ledger {ledger_id}: limbo cleared")
                if self.on_limbo_cleared is not None:
                    self.on_limbo_cleared(self.name, ledger_id, md)
            else:
                pending = True
        if pending:
            self._arm_repair()

    # -- the scrub of closed ledgers (appliance.protocol.scrub) -----------------------------
    def start_scrub(self) -> None:
        self.world.schedule(SCRUB_INTERVAL_MS, self._scrub_tick)

    def _scrub_tick(self) -> None:
        """One pass, as ``appliance.bookie.scrub``: a closed ledger short of
        this bookie's share goes into limbo (durably) for the repair."""
        self.world.schedule(SCRUB_INTERVAL_MS, self._scrub_tick)
        if not self.up or self.world.now_ms < self.stopped_until:
            return
        storage = self.storage
        for ledger_id in sorted(self.meta.records):
            md, _ = self.meta.get(ledger_id)
            found = scrub.verdict(
                md, self.name, storage.ledger_exists(ledger_id) and storage.is_limbo(ledger_id),
                lambda runs, lid=ledger_id: sum(storage.has(lid, e) for first, last in runs
                                                for e in range(first, last + 1)),
                protections=self.core.protections)
            if found == scrub.SHORT:
                storage.mark_limbo(ledger_id)
                storage.sync()  # the real scrub waits for the mark to be durable
                self.repair_stats["scrubbed"] += 1
                self.world.log(f"{self.name} scrub: ledger {ledger_id} is short here: limbo")
                self._arm_repair()

    def _repair_key(self, ledger_id: int, md) -> bytes:
        """The key repair reads carry: this bookie's own, else custody's."""
        key = self.storage.get_master_key(ledger_id)
        if key is None and self.key_for is not None:
            key = self.key_for(md)
        return key or b""

    def _repair_copy(self, msg: ev.ReadResponse) -> None:
        """A peer's answer to a repair read: only a verified positive is data."""
        storage = self.storage
        if msg.code != OK or msg.data is None or not storage.ledger_exists(msg.ledger_id) \
                or not storage.is_limbo(msg.ledger_id) \
                or storage.has(msg.ledger_id, msg.entry_id) \
                or HEADER.unpack_from(msg.data, 0)[:2] != (msg.ledger_id, msg.entry_id):
            return
        storage.add_entries([msg.ledger_id], [msg.entry_id], [msg.data])
        self.repair_stats["copied"] += 1
        self._arm_sync()


def _fmt_lost(lost: dict[int, set[int]]) -> str:
    return ", ".join(f"L{lid}:{sorted(ids)}" for lid, ids in lost.items()) or "none"


class MetaStore:
    """Linearizable CAS store of ledger metadata (reliable, small delays)."""

    name = "metadata"

    def __init__(self, world: World, on_write, delay_ms: tuple[int, int] = (1, 4)):
        self.world = world
        self.records: dict[int, tuple] = {}  # ledger id -> (metadata, version)
        self.on_write = on_write
        self.delay_ms = delay_ms
        self.writes = 0

    def create(self, md) -> int:
        self.records[md.ledger_id] = (md, 1)
        return 1

    def get(self, ledger_id: int):
        return self.records[ledger_id]

    def request(self, host, action) -> None:
        self.world.schedule(self.world.rng.randint(*self.delay_ms), self._apply, host, action)

    def _apply(self, host, action) -> None:
        if isinstance(action, ev.WriteMetadata):
            reply = self._cas(action)
        else:
            md, version = self.records.get(action.ledger_id, (None, None))
            code = OK if md is not None else NoNodeError.code
            reply = ev.MetadataRead(action.request_id, action.ledger_id, code, md, version)
        self.world.schedule(self.world.rng.randint(*self.delay_ms), host.receive, self.name,
                            reply)

    def _cas(self, action: ev.WriteMetadata):
        old, version = self.records[action.ledger_id]
        if version != action.expected_version:
            self.world.log(f"meta CAS conflict (have v{version}, got v{action.expected_version})")
            return ev.MetadataWritten(action.request_id, action.ledger_id,
                                      MetadataVersionError.code)
        self.records[action.ledger_id] = (action.metadata, version + 1)
        self.writes += 1
        new = action.metadata
        self.world.log(f"meta v{version + 1}: {new.state}"
                       + (f" last={new.last_entry_id}" if new.state == CLOSED else "")
                       + " fragments=" + " ".join(f"{f}:{','.join(b[7:] for b in bs)}"
                                                  for f, bs in new.ensembles))
        self.on_write(old, new)
        return ev.MetadataWritten(action.request_id, action.ledger_id, OK, version + 1)


class CoreHost:
    """A client process running protocol cores.  Replies and timers are routed
    to the core that asked; a paused host defers them; a dead one drops them."""

    def __init__(self, world: World, name: str, meta: MetaStore, on_result, on_record=None):
        self.world, self.name, self.meta = world, name, meta
        self.ids = itertools.count(1)
        self.on_result = on_result
        self.on_record = on_record  # every SendAdd is shown to the checker
        self.on_reply = None  # (bookie, reply) of each reply delivered to a core (the writer's)
        self.after_event = None
        self.routes: dict[int, object] = {}
        self.timers: dict[int, object] = {}
        self.paused_until = 0
        self.dead = False
        world.nodes[name] = self

    def call(self, core, method, *args) -> None:
        """A user call on ``core`` (e.g. ``core.add``): run the actions it returns."""
        self.run(core, method(*args))

    def run(self, core, actions: list) -> None:
        world = self.world
        for action in actions:
            kind = type(action)
            if kind is ev.SetTimer:
                self.timers[action.timer_id] = core
                world.schedule(action.delay_ms, self._fire, action.timer_id)
            elif kind in (ev.WriteMetadata, ev.ReadMetadata):
                self.routes[action.request_id] = core
                self.meta.request(self, action)
            elif kind in ev.REQUEST_ACTIONS:
                self.routes[action.request_id] = core
                if kind is ev.SendAdd and self.on_record is not None:
                    self.on_record(action)
                world.net.send(self.name, action.bookie_id, action)
            else:
                world.log(f"{self.name}: {describe(action)}")
                self.on_result(core, action)
        if self.after_event is not None:
            self.after_event()

    def receive(self, src: str, msg) -> None:
        if self.dead:
            return
        if self.world.now_ms < self.paused_until:
            self.world.at(self.paused_until, self.receive, src, msg)
            return
        core = self.routes.get(msg.request_id)
        if core is not None:
            if self.on_reply is not None:
                self.on_reply(src, msg)
            self.deliver(core, dataclasses.replace(msg, now_ms=self.world.now_ms))

    def deliver(self, core, event) -> None:
        self.run(core, core.handle(event))

    def _fire(self, timer_id: int) -> None:
        if self.dead:
            return
        if self.world.now_ms < self.paused_until:
            self.world.at(self.paused_until, self._fire, timer_id)
            return
        core = self.timers.pop(timer_id, None)
        if core is not None:
            self.deliver(core, ev.TimerFired(timer_id, self.world.now_ms))
