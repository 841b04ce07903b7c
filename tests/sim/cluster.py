"""A whole simulated appliance for one run: bookies, metadata store, writer,
recoveries, readers, the fault schedule, and the final check.

Final check (after ``heal_at_ms``: network healed, every bookie restarted,
no more adds): one more recovery must close the ledger and a reader must
read every entry 0..last with the writer's payloads; a few scrub intervals
later every bookie of the ledger holds its whole share (``short-scrubbed``).  That is a liveness
requirement only where the protocol promises it: with a journal, or with
the one-positive recovery rule (a Qa-rule recovery may wait for BP-46
repair, which is not part of this core).
"""

from __future__ import annotations

import random

from appliance.checks.digest import make_digest, master_key, password_hash
from appliance.errors import OK, ReadOnlyError, error_class, is_explicit_negative
from appliance.protocol.metadata import CLOSED, LedgerMetadata
from appliance.protocol.placement import choose_ensemble
from appliance.protocol.repair import share_runs
from tests.sim.apps import ReaderApp, RecoveryApp, WriterApp
from tests.sim.bulk import BulkReadApp
from tests.sim.checker import Checker
from tests.sim.config import SimConfig, sim_locations
from tests.sim.nodes import SCRUB_INTERVAL_MS, MetaStore, SimBookie
from tests.sim.rerep import SealedRereplicator
from tests.sim.world import Violation, World

LEDGER_ID = 1


class Cluster:
    def __init__(self, cfg: SimConfig, protections, world: World | None = None,
                 ensemble: tuple[str, ...] | None = None):
        self.cfg, self.protections = cfg, protections
        self.locations = sim_locations(cfg.bookies, cfg.hosts)
        self.placement = cfg.placement if protections.placement else "none"
        self.world = world or World(cfg.seed)
        self.ledger_id = LEDGER_ID
        self.master_key = master_key(b"secret-%d" % cfg.seed)
        self.digest = make_digest(cfg.digest, self.master_key)
        self.checker = Checker(self.world, LEDGER_ID, self.digest.size, cfg.journal)
        self.meta = MetaStore(self.world, self._on_metadata)
        self.checker.meta = self.meta
        self.checker.master_key = self.master_key
        self.bookies: dict[str, SimBookie] = {}
        batch_replies = cfg.seed % 2 == 1  # odd seeds: batched add replies
        for i in range(1, cfg.bookies + 1):
            name = f"bookie-{i}"
            self.bookies[name] = SimBookie(
                self.world, name, journal=cfg.journal, protections=protections,
                on_store=self.checker.on_store, sync_interval_ms=cfg.sync_interval_ms,
                flush_interval_ms=cfg.flush_interval_ms,
                batch_limits=(cfg.bookie_batch_entries_max, cfg.bookie_batch_bytes_max))
            self.bookies[name].after_request = self.maybe_crash
            self.bookies[name].batch_replies = batch_replies
            self.bookies[name].meta = self.meta
            self.bookies[name].on_limbo_cleared = self.checker.on_limbo_cleared
            self.bookies[name].on_served = self.checker.on_served
            self.bookies[name].key_for = lambda md: self.master_key  # key custody's unseal
        self.checker.bookies = self.bookies
        self.checker.reachable = lambda a, b: frozenset((a, b)) not in self.world.net.cuts
        self.triggered_crashes = 0
        self.zombie_recoveries = 0
        self.stalls = 0
        self.lossy_crashes = 0
        self.peers_lost_checks = 0  # repaired bookies checked alone at the end
        self.repointed_sealed = 0  # sealed fragments re-pointed under the writer
        self.healed = False
        self.finished = False
        self.outcome = "running"
        self.apps: list = []
        self.final_recovery: RecoveryApp | None = None
        self.final_reader: ReaderApp | None = None
        self._create_ledger(ensemble)

    def _create_ledger(self, ensemble: tuple[str, ...] | None) -> None:
        cfg = self.cfg
        if ensemble is None:
            ensemble = choose_ensemble(sorted(self.bookies), self.locations, cfg.ensemble,
                                       cfg.write_quorum, self.world.rng, self.placement)
        md = LedgerMetadata(LEDGER_ID, cfg.ensemble, cfg.write_quorum, cfg.ack_quorum,
                            ((0, ensemble),), digest_type=cfg.digest,
                            password_hash=password_hash(self.master_key))
        self.meta.create(md)
        self.world.log(f"ledger {LEDGER_ID} created on {list(ensemble)}")

    def available(self) -> tuple[str, ...]:
        up = [name for name, b in sorted(self.bookies.items()) if b.up]
        return tuple(self.world.rng.sample(up, len(up)))

    def bookies_changed(self) -> None:
        for app in self.apps:
            changed = getattr(app, "bookies_changed", None)
            if changed is not None:
                changed(self.available())

    # -- the random scenario ------------------------------------------------------------------
    def start_random(self) -> None:
        cfg, world = self.cfg, self.world
        self.checker.on_new_ensemble(self.meta.get(self.ledger_id)[0], sorted(self.bookies),
                                     self.locations)
        world.net.drop_p, world.net.dup_p = cfg.drop_p, cfg.dup_p
        world.net.delay_min_ms, world.net.delay_max_ms = cfg.delay_ms
        self.slow_net(cfg.slow_p, cfg.slow_ms)
        for bookie in self.bookies.values():
            bookie.start_scrub()
        self.writer = WriterApp(self)
        self.apps.append(self.writer)
        for i, start_ms in enumerate(cfg.recoveries, 1):
            self.apps.append(RecoveryApp(self, f"recovery-{i}", start_ms))
        for i, start_ms in enumerate(cfg.readers, 1):
            self.apps.append(ReaderApp(self, f"reader-{i}", start_ms, cfg.heal_at_ms))
        for i, at in enumerate(cfg.rereplications):
            self.apps.append(SealedRereplicator(self, at, random.Random(cfg.seed * 31 + i),
                                                broken=cfg.rereplicate_broken, index=i))
        for at, name, down_ms in cfg.crashes:
            world.at(at, self.crash, name, down_ms)
        for at, a, b, length in cfg.partitions:
            world.at(at, world.net.cut, a, b)
            world.at(at + length, world.net.heal, a, b)
        for at, length in cfg.writer_pauses:
            world.at(at, self.pause, "writer", length)
        for at, name, length in cfg.read_only:
            world.at(at, self.read_only, name, True)
            world.at(min(at + length, cfg.heal_at_ms), self.read_only, name, False)
        for at, name, length in cfg.bookie_stalls:
            world.at(at, self.stall_bookie, name, length)
        for at, a, b, length, loss in cfg.flaky_links:
            world.at(at, self.flaky, a, b, loss)
            world.at(at + length, self.flaky, a, b, 0.0)
        if cfg.writer_close_at_ms is not None:
            world.at(cfg.writer_close_at_ms, self.writer.close)
        if cfg.writer_dies_at_ms is not None:
            world.at(cfg.writer_dies_at_ms, self.kill, "writer")
        world.at(cfg.heal_at_ms, self.heal)

    def slow_net(self, slow_p: float, slow_ms: tuple[int, int]) -> None:
        """A share of messages takes ``slow_ms``: the reordering that lets an
        add overtake a fence or arrive after a recovery."""
        self.world.net.slow_p, self.world.net.slow_ms = slow_p, slow_ms

    # -- faults ----------------------------------------------------------------------------
    def crash(self, name: str, down_ms: int) -> None:
        bookie = self.bookies[name]
        if not bookie.up or self.healed:
            return
        self.checker.last_down_ms[name] = self.world.now_ms
        if self.cfg.journal or self.lossy_crashes < self.cfg.lossy_crashes_max:
            self.lossy_crashes += 0 if self.cfg.journal else 1
            keep = self.world.rng.randint(0, bookie.storage.unsynced_ops)
            self.checker.on_data_loss(name, bookie.crash(keep))
        else:
            bookie.stop_cleanly()
        self.bookies_changed()
        self.world.schedule(down_ms, self.restart, name)

    def restart(self, name: str) -> None:
        bookie = self.bookies[name]
        if bookie.up:
            return
        md, _ = self.meta.get(self.ledger_id)
        boot = [(self.ledger_id, md.state == CLOSED)] if name in md.bookies() else []
        bookie.restart(boot)
        self.checker.last_up_ms[name] = self.world.now_ms
        self.bookies_changed()

    def pause(self, host_name: str, length_ms: int) -> None:
        world = self.world
        if self.healed:
            return
        host = world.nodes[host_name]
        host.paused_until = max(host.paused_until, world.now_ms + length_ms)
        world.log(f"pause {host_name} for {length_ms}ms")
        if host_name == "writer" and self.zombie_recoveries < 2 \
                and world.rng.random() < self.cfg.zombie_recovery_p:
            self.zombie_recoveries += 1  # a failure detector noticed the silent writer
            name = f"zombie-recovery-{self.zombie_recoveries}"
            start_ms = world.now_ms + world.rng.randint(*self.cfg.zombie_start_ms)
            self.apps.append(RecoveryApp(self, name, start_ms))
            if self.cfg.recovery_cut_loss:
                md, _ = self.meta.get(self.ledger_id)
                bookie = world.rng.choice(md.last_fragment[1])
                self.flaky(name, bookie, self.cfg.recovery_cut_loss)

    def stall_bookie(self, name: str, length_ms: int) -> None:
        """``name`` is stopped (SIGSTOP) for ``length_ms``: what it is sent
        waits and is served, in order, once it runs again."""
        if self.healed:
            return
        bookie = self.bookies[name]
        bookie.stopped_until = max(bookie.stopped_until, self.world.now_ms + length_ms)
        self.world.log(f"{name} stopped for {length_ms}ms")

    def read_only(self, name: str, on: bool) -> None:
        """``name`` refuses adds with ReadOnlyError while ``on`` (its disk full)."""
        self.bookies[name].refuse_adds = ReadOnlyError.code if on else 0
        self.world.log(f"{name} {'read-only' if on else 'writable again'}")

    def flaky(self, a: str, b: str, loss: float) -> None:
        if self.healed:
            return
        pair = frozenset((a, b))
        if loss > 0:
            self.world.net.link_loss[pair] = loss
            self.world.log(f"flaky link {a} ~ {b} (loss {loss})")
        else:
            self.world.net.link_loss.pop(pair, None)

    # -- nemeses aimed at dangerous moments ------------------------------------------------
    def maybe_crash(self, name: str, fencing: bool) -> None:
        cfg, rng = self.cfg, self.world.rng
        chance = max(cfg.crash_trigger_p, cfg.crash_after_fence_p if fencing else 0.0)
        if chance and not self.healed and self.triggered_crashes < cfg.crash_budget \
                and rng.random() < chance:
            self.triggered_crashes += 1
            self.world.schedule(rng.randint(0, cfg.crash_delay_max_ms), self.crash, name,
                                rng.randint(*cfg.crash_down_ms))

    def _on_metadata(self, old, new) -> None:
        self.checker.on_metadata(old, new)
        cfg, rng = self.cfg, self.world.rng
        if new.state == CLOSED and cfg.crash_after_close_p and not self.healed \
                and self.triggered_crashes < cfg.crash_budget \
                and rng.random() < cfg.crash_after_close_p:
            self.triggered_crashes += 1
            self.world.schedule(rng.randint(0, cfg.crash_delay_max_ms), self.crash,
                                rng.choice(new.last_fragment[1]), rng.randint(*cfg.crash_down_ms))

    def maybe_stall_writer(self) -> bool:
        rng = self.world.rng
        if self.cfg.pause_trigger_p and not self.healed and self.stalls < self.cfg.stalls_max \
                and rng.random() < self.cfg.pause_trigger_p:
            self.stalls += 1
            self.pause("writer", rng.randint(*self.cfg.stall_ms))
            return True
        return False

    def kill(self, host_name: str) -> None:
        self.world.nodes[host_name].dead = True
        self.world.log(f"{host_name} dies")

    # -- the end: heal, recover, read everything ---------------------------------------------
    def heal(self) -> None:
        world = self.world
        self.healed = True
        world.log("HEAL: network repaired, all bookies up, no more adds")
        world.net.drop_p = world.net.dup_p = 0.0
        self.slow_net(0.0, (0, 0))
        world.net.heal()
        world.net.release()
        for name, bookie in sorted(self.bookies.items()):
            if not bookie.up:
                self.restart(name)
        for node in world.nodes.values():
            if hasattr(node, "paused_until"):
                node.paused_until = 0
        for bookie in self.bookies.values():
            bookie.stopped_until = 0  # what queued up arrives at its own time
        if getattr(self, "writer", None) is not None:
            self.writer.stopped = True
        settle_ms = 3 * self.cfg.add_timeout_ms + 50
        self.final_recovery = RecoveryApp(self, "final-recovery", world.now_ms + settle_ms,
                                          attempts_max=4, on_done=self._recovered)
        self.apps.append(self.final_recovery)

    @property
    def liveness_expected(self) -> bool:
        return self.cfg.journal or self.cfg.positive_min == 1

    def _recovered(self, app: RecoveryApp) -> None:
        if app.result.code != OK:
            self._stuck(f"final recovery failed: {error_class(app.result.code).__name__}")
            return
        self.final_reader = ReaderApp(self, "final-reader", self.world.now_ms + 1, 0,
                                      whole=True, on_done=self._read_all)

    def _read_all(self, reader: ReaderApp) -> None:
        if reader.failed_code != OK:
            self._stuck(f"final read failed: {error_class(reader.failed_code).__name__}")
            return
        last = self.checker.closed.last_entry_id
        if reader.next_entry != last + 1:
            raise Violation("acked-lost", f"final reader read {reader.next_entry} entries of "
                                          f"{last + 1}")
        self._bulk_read_under_faults()

    # -- bulk reads: the product's failover decisions (tests/sim/bulk.py) ------------------
    def _bulk_read_under_faults(self) -> None:
        """A bulk read of the closed ledger while messages are lost and one
        bookie may be cut off: it may fail, but only with an honest error."""
        md, _ = self.meta.get(self.ledger_id)
        rng, net = self.world.rng, self.world.net
        net.drop_p = rng.choice((0.0, 0.1, 0.3))
        self.bulk_cut = rng.choice(md.ensembles[-1][1]) if rng.random() < 0.5 else None
        if self.bulk_cut is not None:
            net.cut("bulk-reader", self.bulk_cut)
        self.world.log(f"bulk read under faults: drop_p={net.drop_p} cut={self.bulk_cut}")
        BulkReadApp(self, "bulk-reader", md, on_done=self._bulk_faulty_done).start()

    def _bulk_faulty_done(self, app: BulkReadApp) -> None:
        last = app.md.last_entry_id
        if app.error is None and app.next_entry != last + 1:
            raise Violation("acked-lost", f"bulk read ended at {app.next_entry} of {last + 1}")
        if app.error is not None and is_explicit_negative(app.error.code):
            raise Violation("bulk-negative", f"bulk read of a closed ledger: {app.error}")
        self.bulk_failovers = app.failovers
        self.world.net.drop_p = 0.0
        self.world.net.heal()
        self.world.log(f"bulk read under faults: {app.error or 'all read'}; healed")
        BulkReadApp(self, "bulk-reader-2", app.md, on_done=self._bulk_done).start()

    def _bulk_done(self, app: BulkReadApp) -> None:
        """Healed, every entry has a live replica that holds it (the final
        reader read them all): the bulk read must read them all too."""
        if app.error is not None:
            raise Violation("bulk-read", f"healed bulk read failed: {app.error}")
        if app.next_entry != app.md.last_entry_id + 1:
            raise Violation("acked-lost", f"bulk read ended at {app.next_entry}")
        self._repaired_bookies_serve_alone(app.md)
        self.world.schedule(3 * SCRUB_INTERVAL_MS + 200, self._scrubbed, app.md)

    def _scrubbed(self, md) -> None:
        """``short-scrubbed``: healed and closed, a few scrub intervals later
        every bookie of the ledger holds its whole share."""
        self.checker.check_scrubbed(md)
        self.finished, self.outcome = True, "closed"

    def _repaired_bookies_serve_alone(self, md) -> None:
        """BP-46 end to end: each bookie that lost data and repaired this
        ledger (limbo cleared) must, with its peers lost, serve every entry of
        its share by itself: the writer's record, never a negative."""
        for name, bookie in sorted(self.bookies.items()):
            if not bookie.repaired.get(self.ledger_id) or self.storage_limbo(bookie):
                continue
            self.peers_lost_checks += 1
            for first, last in share_runs(md, name):
                for entry_id in range(first, last + 1):
                    reply = bookie.core.read(self.ledger_id, entry_id, False, self.master_key)
                    if reply.code != OK or reply.data != self.checker.records.get(entry_id):
                        raise Violation("acked-lost", (
                            f"{name} repaired ledger {self.ledger_id}, but with its peers lost "
                            f"it answers {error_class(reply.code).__name__} for entry "
                            f"{entry_id} of its share"))

    def storage_limbo(self, bookie) -> bool:
        return bookie.storage.ledger_exists(self.ledger_id) \
            and bookie.storage.is_limbo(self.ledger_id)

    def _stuck(self, why: str) -> None:
        if self.liveness_expected:
            raise Violation("liveness", why)
        self.finished, self.outcome = True, f"stuck ({why})"
