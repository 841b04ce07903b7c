"""Simulated applications: the writer, recovering openers and tailing readers.

Each runs the real protocol core (``LedgerWriter``, ``LedgerRecovery``,
``LedgerReader``) inside a ``CoreHost`` and reports what its user would see
(acknowledgements, closes, payloads read, LACs) to the checker.
"""

from __future__ import annotations

from appliance.errors import OK, is_explicit_negative
from appliance.protocol import events as ev
from appliance.protocol.quarantine import BookieHealth
from appliance.protocol.reader import LedgerReader, ReaderConfig
from appliance.protocol.recovery import LedgerRecovery, RecoveryConfig
from appliance.protocol.writer import OPEN_STATE, LedgerWriter, WriterConfig
from tests.sim.nodes import CoreHost


class WriterApp:
    """Adds ``cfg.entries`` entries in random batches; may close, pause or die."""

    def __init__(self, cluster):
        self.c = cluster
        cfg, world = cluster.cfg, cluster.world
        self.host = CoreHost(world, "writer", cluster.meta, self.on_result,
                             on_record=cluster.checker.on_record)
        md, version = cluster.meta.get(cluster.ledger_id)
        config = WriterConfig(add_timeout_ms=cfg.add_timeout_ms,
                              explicit_lac_interval_ms=cfg.explicit_lac_ms,
                              placement=cluster.placement)
        self.core = LedgerWriter(md, version, cluster.master_key, cluster.digest, config=config,
                                 available_bookies=cluster.available(), ids=self.host.ids,
                                 locations=cluster.locations, protections=cluster.protections)
        self.core.on_placement = cluster.checker.on_placement
        cluster.checker.owed = self.owed
        self.core.on_rejoin = cluster.checker.on_rejoin
        self.host.on_reply = cluster.checker.on_writer_reply
        self.stopped = False
        self.closed_at: int | None = None
        self.close_called_ms: int | None = None  # when close() was first called
        self.failures: list[tuple[int, int]] = []  # (when, code) of every FailAdds
        world.schedule(0, self._add_tick)

    def _add_tick(self) -> None:
        world, core, cfg = self.c.world, self.core, self.c.cfg
        if self.host.dead or self.stopped:
            return
        if world.now_ms < self.host.paused_until:
            world.at(self.host.paused_until, self._add_tick)
            return
        first = core.last_add_pushed + 1
        if core.state != OPEN_STATE or first >= cfg.entries:
            return
        if cfg.stall_when_idle and first >= (cfg.stall_at_entry or 0) \
                and self.c.stalls < cfg.stalls_max:
            # drain what is in flight, then stall with nothing outstanding
            published = cfg.explicit_lac_ms == 0 or core.lac_written >= core.last_add_confirmed
            if core.pending_count == 0 and published and self.c.maybe_stall_writer():
                world.at(self.host.paused_until, self._add_tick)
            else:
                world.schedule(world.rng.randint(*cfg.add_interval_ms), self._add_tick)
            return
        if cfg.stall_after_lone_send and first >= (cfg.stall_at_entry or 0) \
                and self.c.stalls < cfg.stalls_max and core.pending_count:
            world.schedule(world.rng.randint(*cfg.add_interval_ms), self._add_tick)
            return  # drain, so the entry sent next is the only one in flight
        count = min(world.rng.randint(1, cfg.batch_max), cfg.entries - first)
        payloads = [b"e%d:" % e + world.rng.randbytes(world.rng.randint(0, 24))
                    for e in range(first, first + count)]
        lone = core.pending_count == 0 and first >= (cfg.stall_at_entry or 0)
        self.host.call(core, core.add_many, payloads, world.now_ms)
        if not cfg.stall_when_idle and (lone or not cfg.stall_after_lone_send):
            self.c.maybe_stall_writer()
        world.schedule(world.rng.randint(*cfg.add_interval_ms), self._add_tick)

    def close(self) -> None:
        world = self.c.world
        if self.host.dead:
            return
        if world.now_ms < self.host.paused_until:
            world.at(self.host.paused_until, self.close)
            return
        self.stopped = True
        if self.close_called_ms is None:
            self.close_called_ms = world.now_ms
        self.host.call(self.core, self.core.close, world.now_ms)

    def owed(self, bookie: str, entry_id: int) -> bool:
        """Whether the writer holds ``entry_id`` to re-send to ``bookie``: short
        on it (the bookie failed; its copy is owed)."""
        return entry_id in self.core._short.get(bookie, ())

    def bookies_changed(self, available: tuple[str, ...]) -> None:
        if not self.host.dead:
            self.host.deliver(self.core, ev.AvailableBookies(available, self.c.world.now_ms,
                                                             self.c.locations))

    def on_result(self, core, action) -> None:
        if isinstance(action, ev.CompleteAdds):
            self.c.checker.on_writer_ack(action.first_entry_id, action.last_entry_id)
        elif isinstance(action, ev.FailAdds):
            self.failures.append((self.c.world.now_ms, action.code))
        elif isinstance(action, ev.CloseDone) and action.code == OK:
            first_report = self.closed_at is None
            self.closed_at = action.last_entry_id
            self.c.checker.on_close_reported("writer", action.last_entry_id)
            if first_report and self.core.stopped_with == OK:  # a stopped writer forgot
                self.c.checker.on_writer_closed(  # what was short
                    self.core.metadata, self.close_called_ms or 0)


class RecoveryApp:
    """Opens the ledger with recovery at ``start_ms``; retries a failed attempt."""

    def __init__(self, cluster, name: str, start_ms: int, attempts_max: int = 3,
                 on_done=None, master_key: bytes | None = None):
        self.c, self.name = cluster, name
        self.master_key = master_key or cluster.master_key
        self.host = CoreHost(cluster.world, name, cluster.meta, self.on_result,
                             on_record=cluster.checker.on_record)
        self.core: LedgerRecovery | None = None
        self.result: ev.OpenDone | None = None
        self.attempts, self.attempts_max = 0, attempts_max
        self.on_done = on_done
        self.window_entries = RecoveryConfig.window_entries  # a trace may read fewer ahead
        cluster.world.at(start_ms, self.begin)

    def begin(self) -> None:
        world, c = self.c.world, self.c
        if self.host.dead or self.result is not None:
            return
        if world.now_ms < self.host.paused_until:
            world.at(self.host.paused_until, self.begin)
            return
        self.attempts += 1
        md, version = c.meta.get(c.ledger_id)
        timeout_ms = c.cfg.recovery_timeout_ms or c.cfg.add_timeout_ms
        config = RecoveryConfig(request_timeout_ms=timeout_ms,
                                retry_backoff_ms=max(10, timeout_ms // 2),
                                positive_min=c.cfg.positive_min,
                                window_entries=self.window_entries, placement=c.placement)
        self.core = LedgerRecovery(md, version, self.master_key, c.digest, config=config,
                                   protections=c.protections, available_bookies=c.available(),
                                   ids=self.host.ids, locations=c.locations)
        self.core.on_placement = c.checker.on_placement
        self.host.call(self.core, self.core.start, world.now_ms)

    def owed(self, bookie: str, entry_id: int) -> bool:
        """Whether the writer holds ``entry_id`` to re-send to ``bookie``: short
        on it (the bookie failed; its copy is owed)."""
        return entry_id in self.core._short.get(bookie, ())

    def bookies_changed(self, available: tuple[str, ...]) -> None:
        if self.core is not None and self.core.result is None and not self.host.dead:
            self.host.deliver(self.core, ev.AvailableBookies(available, self.c.world.now_ms,
                                                             self.c.locations))

    def on_result(self, core, action) -> None:
        if not isinstance(action, ev.OpenDone) or core is not self.core:
            return
        if action.code == OK:
            self.result = action
            self.c.checker.on_close_reported(self.name, action.last_add_confirmed)
        elif self.attempts < self.attempts_max:
            self.c.world.schedule(self.c.cfg.add_timeout_ms, self.begin)
            return
        else:
            self.result = action
        if self.on_done is not None:
            self.on_done(self)


class ReaderApp:
    """Opens without recovery and reads entries as the LAC moves, until
    ``until_ms`` (a tailing reader); or, with ``whole=True``, reads a closed
    ledger from 0 to its last entry once and reports.  ``master_key``: the
    key its reads carry (default: the ledger's)."""

    def __init__(self, cluster, name: str, start_ms: int, until_ms: int, whole: bool = False,
                 on_done=None, master_key: bytes | None = None):
        self.c, self.name = cluster, name
        self.master_key = cluster.master_key if master_key is None else master_key
        self.until_ms, self.whole, self.on_done = until_ms, whole, on_done
        self.host = CoreHost(cluster.world, name, cluster.meta, self.on_result)
        self.host.after_event = self._after_event
        self.host.on_reply = lambda bookie, msg: cluster.checker.on_reader_reply(name, bookie,
                                                                                 msg)
        self.core: LedgerReader | None = None
        self.reading: tuple[int, int] | None = None  # the read in flight: first, last
        self.told_lacs = 0  # answers asked of the writer (told_lac_p)
        self.next_entry = 0
        self.failed_code = OK
        self.done = False
        cluster.world.at(start_ms, self.begin)

    def begin(self) -> None:
        md, _ = self.c.meta.get(self.c.ledger_id)
        timeout_ms = self.c.cfg.add_timeout_ms
        # speculative reads well inside the read timeout, and a quarantine
        # short enough to end within a run
        config = ReaderConfig(read_timeout_ms=timeout_ms, lac_poll_interval_ms=20,
                              read_rounds_max=5 if self.whole else 2,
                              read_batch_entries=self.c.cfg.read_batch_entries,
                              speculative_read_timeout_ms=max(2, timeout_ms // 4))
        self.health = BookieHealth(quarantine_ms=2 * timeout_ms, strikes_max=3,
                                   window_ms=timeout_ms)
        self.core = LedgerReader(md, self.c.digest, master_key=self.master_key, config=config,
                                 ids=self.host.ids, health=self.health,
                                 protections=self.c.protections)
        self.host.call(self.core, self.core.open, self.c.world.now_ms)

    def _after_event(self) -> None:
        if self.core is not None:
            self.c.checker.on_reader_lac(self.name, self.core.last_add_confirmed)

    def on_result(self, core, action) -> None:
        if isinstance(action, ev.ReadDone):
            if is_explicit_negative(action.code) and self.reading is not None:
                self.c.checker.on_read_negative(self.name, *self.reading, core.metadata)
            self.reading = None
            if action.code == OK:
                self.c.checker.on_read(self.name, action.first_entry_id, action.payloads)
                self.next_entry = action.first_entry_id + len(action.payloads)
            elif self.whole:
                self._finish(action.code)
                return
        elif isinstance(action, ev.OpenDone) and action.code != OK and self.whole:
            self._finish(action.code)
            return
        self.c.world.schedule(1, self._step)

    def _step(self) -> None:
        core, world = self.core, self.c.world
        if self.done:
            return
        last = core.last_add_confirmed
        if core.is_closed and self.next_entry > last:
            self._finish(OK)
        elif not self.whole and world.now_ms >= self.until_ms:
            self.done = True
        elif self.next_entry <= last:
            upto = min(last, self.next_entry + 15)
            self.reading = (self.next_entry, upto)
            self.host.call(core, core.read, self.next_entry, upto, world.now_ms)
        else:
            md, _ = self.c.meta.get(self.c.ledger_id)
            if md is not core.metadata:
                self.host.call(core, core.update_metadata, md)
            if self.c.cfg.told_lac_p and world.rng.random() < self.c.cfg.told_lac_p:
                self._ask_writer()
            self.host.call(core, core.wait_for_lac, self.next_entry - 1, 100, world.now_ms)

    def _ask_writer(self) -> None:
        """Read your writes: the log's owner (here the writer) tells how far
        its entries are acknowledged; the answer, taken now, arrives a
        network delay later.  Broken: one entry more than acknowledged."""
        writer = getattr(self.c, "writer", None)
        if writer is None or writer.core is None:
            return
        told = writer.core.last_add_confirmed + (1 if self.c.cfg.told_lac_broken else 0)
        if told < 0:
            return
        self.told_lacs += 1
        lo, hi = self.c.cfg.delay_ms
        self.c.world.at(self.c.world.now_ms + self.c.world.rng.randint(lo, hi), self._told, told)

    def _told(self, told: int) -> None:
        if self.done or self.core is None:
            return
        self.core.learn_lac(told)
        self._after_event()  # the checker sees the LAC now; the read follows the LAC wait

    def _finish(self, code: int) -> None:
        self.done = True
        self.failed_code = code
        if self.on_done is not None:
            self.on_done(self)
