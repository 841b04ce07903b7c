"""The log layer (seed 003) in the deterministic simulation.

A log of segments (ledgers) on simulated bookies: writers that take the log
over one after another (the superseded one often still alive: paused, a
zombie, or simply slower), segment rollovers, bookie crashes and restarts,
message loss, delay and reordering, and tailing readers.  Every step runs
the real protocol cores (``LedgerWriter``, ``LedgerRecovery``,
``LedgerReader``), the real log rules (``appliance.protocol.logs``:
ownership epochs, start/complete segment, positions) and the real entry
format (``appliance.protocol.log_entry``); the writer and reader follow the
same sequence as ``appliance.logs.writer`` / ``reader``: take the epoch,
fence-and-recover the previous in-progress segment, complete it from its
last entry's header, start a segment on a new ledger.

Log-level invariants, checked at the end (network healed, every bookie up,
one more writer took over and closed, a reader read the whole log, then read
it again resumed from the middle):

``log-acked-lost``   every record whose write was acknowledged (a DLSN
                     returned) is read back at that DLSN with its payload;
``log-duplicate``    no record is delivered twice;
``log-order``        DLSNs and txids strictly increase in delivery order;
``log-phantom``      nothing is delivered that no writer wrote;
``log-resume``       a reader resumed at ``last.dlsn.next()`` delivers exactly
                     the rest (exactly once, no gap);
``log-tail``         what a tailing reader delivered during the faults is
                     exactly the final log's records from its start.

``break_fence=True`` removes the fencing step (the new writer completes the
previous segment from an unfenced open at its LAC instead of a recovery):
the old writer keeps adding, and the checker must catch it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from appliance.checks.digest import make_digest, master_key, password_hash
from appliance.errors import OK, LogFencedError
from appliance.protocol import events as ev
from appliance.protocol.log_entry import EntryHeader, pack_entry, read_header, unpack_entry
from appliance.protocol.logs import (
    COMPLETED,
    DLSN,
    IN_PROGRESS,
    NO_TXID,
    SegmentEnd,
    complete_segment,
    new_log,
    start_segment,
    take_ownership,
)
from appliance.protocol.metadata import LedgerMetadata
from appliance.protocol.quorum import Protections
from appliance.protocol.reader import LedgerReader, ReaderConfig
from appliance.protocol.recovery import LedgerRecovery, RecoveryConfig
from appliance.protocol.writer import OPEN_STATE, LedgerWriter, WriterConfig
from tests.sim.nodes import CoreHost, MetaStore, SimBookie
from tests.sim.world import Violation, World

RUN_MS_MAX = 120_000
STEPS_MAX = 600_000


@dataclass
class LogSimConfig:
    seed: int
    ensemble: int
    write_quorum: int
    ack_quorum: int
    bookies: int
    entries_per_segment: int  # rollover after this many entries
    records_max: int  # records per entry, 1..records_max
    writers: list[int]  # start times of the writers (the first at 0)
    pauses: list[tuple[int, int]]  # (at, length): the writer of that moment stalls
    deaths: list[int]  # the writer of that moment dies
    crashes: list[tuple[int, int, int]]  # (at, bookie index, down ms)
    drop_p: float
    slow_p: float
    readers: list[int]  # start times of tailing readers
    heal_at_ms: int
    add_timeout_ms: int = 100
    writes_per_writer: int = 40  # entries a writer attempts
    break_fence: bool = False

    def summary(self) -> str:
        return (f"E{self.ensemble}/W{self.write_quorum}/A{self.ack_quorum} "
                f"bookies={self.bookies} writers={len(self.writers)} pauses={len(self.pauses)} "
                f"deaths={len(self.deaths)} crashes={len(self.crashes)} drop={self.drop_p} "
                f"slow={self.slow_p} seg={self.entries_per_segment} "
                f"readers={len(self.readers)}")


def random_log_config(seed: int, break_fence: bool = False) -> LogSimConfig:
    rng = random.Random(seed * 6007 + 3)
    write_quorum = rng.randint(1, 3)
    ensemble = rng.randint(write_quorum, min(write_quorum + 2, 4))
    ack_quorum = rng.randint(1, min(write_quorum, 2))
    bookies = ensemble + rng.choice((0, 1, 2))
    heal = rng.randint(400, 1500)
    writers = [0] + sorted(rng.randint(20, heal) for _ in range(rng.randint(1, 4)))
    return LogSimConfig(
        seed=seed, ensemble=ensemble, write_quorum=write_quorum, ack_quorum=ack_quorum,
        bookies=bookies, entries_per_segment=rng.choice((2, 3, 5, 10)),
        records_max=rng.choice((1, 3, 8)), writers=writers,
        pauses=[(rng.randint(5, heal), rng.randint(50, 500)) for _ in range(rng.randint(0, 3))],
        deaths=[rng.randint(20, heal) for _ in range(rng.randint(0, 1))],
        crashes=[(rng.randint(5, heal), rng.randint(1, bookies), rng.randint(5, 300))
                 for _ in range(rng.randint(0, 3))],
        drop_p=rng.choice((0.0, 0.0, 0.02, 0.08)), slow_p=rng.choice((0.0, 0.1, 0.3)),
        readers=sorted(rng.randint(0, heal // 2) for _ in range(rng.randint(0, 2))),
        heal_at_ms=heal, break_fence=break_fence)


class LogStore:
    """The log's metadata node: linearizable CAS of pure transitions, with
    delays on the way in and out (a transform that raises writes nothing)."""

    def __init__(self, world: World, md, on_write):
        self.world, self.md, self.version, self.on_write = world, md, 1, on_write

    def update(self, transform, callback) -> None:
        def apply():
            try:
                new = transform(self.md)
            except Exception as exc:  # noqa: BLE001 - delivered to the caller
                result = exc
            else:
                if new is not None and new != self.md:
                    old, self.md, self.version = self.md, new, self.version + 1
                    self.on_write(old, new)
                result = self.md
            self.world.schedule(self.world.rng.randint(1, 4), callback, result)
        self.world.schedule(self.world.rng.randint(1, 4), apply)

    def read(self, callback) -> None:
        md = self.md
        self.world.schedule(self.world.rng.randint(1, 6), callback, md)


class LogChecker:
    def __init__(self, world: World):
        self.world = world
        self.acked: dict[bytes, DLSN] = {}
        self.acked_at: dict[DLSN, bytes] = {}
        self.written: set[bytes] = set()

    def fail(self, name: str, detail: str) -> None:
        self.world.log(f"VIOLATION {name}: {detail}")
        raise Violation(name, detail)

    def on_written(self, payload: bytes) -> None:
        self.written.add(payload)

    def on_acked(self, dlsn: DLSN, payload: bytes) -> None:
        if self.acked_at.get(dlsn, payload) != payload:
            self.fail("log-duplicate", f"{dlsn} acknowledged for two records")
        self.acked[payload] = dlsn
        self.acked_at[dlsn] = payload

    def check_final(self, records: list[tuple[DLSN, int, bytes]]) -> None:
        seen: dict[bytes, DLSN] = {}
        for i, (dlsn, txid, payload) in enumerate(records):
            if payload in seen:
                self.fail("log-duplicate", f"{payload!r} delivered at {seen[payload]} and {dlsn}")
            seen[payload] = dlsn
            if payload not in self.written:
                self.fail("log-phantom", f"{payload!r} at {dlsn} was never written")
            if i and (dlsn <= records[i - 1][0] or txid <= records[i - 1][1]):
                self.fail("log-order", f"{records[i - 1][:2]} then {(dlsn, txid)}")
        for payload, dlsn in sorted(self.acked.items(), key=lambda kv: kv[1]):
            if seen.get(payload) != dlsn:
                where = f"at {seen[payload]}" if payload in seen else "never"
                self.fail("log-acked-lost", f"{payload!r} acknowledged at {dlsn}, read back "
                                            f"{where}")


class LogCluster:
    def __init__(self, cfg: LogSimConfig, world: World | None = None):
        self.cfg = cfg
        self.world = world or World(cfg.seed)
        self.key = master_key(b"log-%d" % cfg.seed)
        self.digest = make_digest("crc32c", self.key)
        self.checker = LogChecker(self.world)
        self.meta = MetaStore(self.world, lambda old, new: None)
        self.logs = LogStore(self.world, new_log("simlog", 0), self._on_log_write)
        self.bookies = {}
        for i in range(1, cfg.bookies + 1):
            name = f"bookie-{i}"
            self.bookies[name] = SimBookie(self.world, name, journal=True,
                                           protections=Protections(),
                                           on_store=lambda *a: None, sync_interval_ms=2,
                                           flush_interval_ms=20)
            self.bookies[name].meta = self.meta
        self.next_ledger = 1
        self.writers: list[SimLogWriter] = []
        self.tailers: list[SimLogReader] = []
        self.healed = False
        self.finished = False
        self.outcome = "running"
        self.stats = {"handovers": 0, "fenced_writers": 0, "segments": 0, "acked": 0}

    def _on_log_write(self, old, new) -> None:
        self.world.log(f"log v: epoch {new.epoch} segments "
                       + " ".join(f"{s.seq}:{s.ledger_id}:{s.state[0]}" for s in new.segments))

    def available(self) -> tuple[str, ...]:
        up = [n for n, b in sorted(self.bookies.items()) if b.up]
        return tuple(self.world.rng.sample(up, len(up)))

    def new_ledger(self) -> LedgerMetadata:
        cfg = self.cfg
        ledger_id, self.next_ledger = self.next_ledger, self.next_ledger + 1
        ensemble = tuple(self.world.rng.sample(sorted(self.bookies), cfg.ensemble))
        md = LedgerMetadata(ledger_id, cfg.ensemble, cfg.write_quorum, cfg.ack_quorum,
                            ((0, ensemble),), password_hash=password_hash(self.key))
        self.meta.create(md)
        return md

    def current_writer(self):
        live = [w for w in self.writers if not w.host.dead]
        return live[-1] if live else None

    # -- the scenario ------------------------------------------------------------------
    def start(self) -> None:
        cfg, world = self.cfg, self.world
        world.net.drop_p = cfg.drop_p
        world.net.slow_p, world.net.slow_ms = cfg.slow_p, (20, 150)
        world.net.delay_min_ms, world.net.delay_max_ms = 1, 5
        for i, at in enumerate(cfg.writers):
            world.at(at, self._new_writer, f"writer-{i + 1}")
        for at, length in cfg.pauses:
            world.at(at, self._pause_writer, length)
        for at in cfg.deaths:
            world.at(at, self._kill_writer)
        for at, index, down in cfg.crashes:
            world.at(at, self._crash, f"bookie-{index}", down)
        for i, at in enumerate(cfg.readers):
            world.at(at, self._tail, f"tailer-{i + 1}")
        world.at(cfg.heal_at_ms, self.heal)

    def _new_writer(self, name: str) -> None:
        if self.healed and not name.startswith("final"):
            return
        if self.writers:
            self.stats["handovers"] += 1
        self.writers.append(SimLogWriter(self, name))

    def _pause_writer(self, length: int) -> None:
        w = self.current_writer()
        if w is not None and not self.healed:
            w.host.paused_until = max(w.host.paused_until, self.world.now_ms + length)
            self.world.log(f"pause {w.name} for {length}ms")

    def _kill_writer(self) -> None:
        w = self.current_writer()
        if w is not None and not self.healed:
            w.host.dead = True
            self.world.log(f"{w.name} dies")

    def _crash(self, name: str, down: int) -> None:
        bookie = self.bookies[name]
        if not bookie.up or self.healed:
            return
        bookie.crash(self.world.rng.randint(0, bookie.storage.unsynced_ops))
        self._bookies_changed()
        self.world.schedule(down, self._restart, name)

    def _restart(self, name: str) -> None:
        bookie = self.bookies[name]
        if not bookie.up:
            bookie.restart([])
            self._bookies_changed()

    def _bookies_changed(self) -> None:
        for w in self.writers:
            w.bookies_changed(self.available())

    def _tail(self, name: str) -> None:
        if not self.healed:
            self.tailers.append(SimLogReader(self, name, DLSN.FIRST, until_heal=True))

    # -- the end -----------------------------------------------------------------------
    def heal(self) -> None:
        world = self.world
        self.healed = True
        world.log("HEAL: network repaired, all bookies up, writers stop")
        world.net.drop_p, world.net.slow_p = 0.0, 0.0
        world.net.heal()
        world.net.release()
        for name, bookie in sorted(self.bookies.items()):
            if not bookie.up:
                self._restart(name)
        for w in self.writers:
            w.stop_writing = True
            w.host.paused_until = 0
        world.schedule(3 * self.cfg.add_timeout_ms + 50, self._final_writer)

    def _final_writer(self) -> None:
        w = SimLogWriter(self, "final-writer", close_when_open=True, on_closed=self._final_read)
        self.writers.append(w)

    def _final_read(self, writer) -> None:
        if writer.error is not None:
            raise Violation("liveness", f"final writer failed: {writer.error}")
        self.final_reader = SimLogReader(self, "final-reader", DLSN.FIRST, until_heal=False,
                                         on_done=self._final_read_done)

    def _final_read_done(self, reader) -> None:
        records = reader.delivered
        self.checker.check_final(records)
        for tailer in self.tailers:
            expect = [r for r in records if r[0] >= tailer.start][:len(tailer.delivered)]
            if tailer.delivered != expect:
                raise Violation("log-tail", f"{tailer.name} delivered {len(tailer.delivered)} "
                                            f"records that differ from the final log")
        self.stats["acked"] = len(self.checker.acked)
        if len(records) < 2:
            self.finished, self.outcome = True, "done"
            return
        cut = self.world.rng.randint(0, len(records) - 2)
        self.resume_expect = records[cut + 1:]
        SimLogReader(self, "resumed-reader", records[cut][0].next(), until_heal=False,
                     on_done=self._resumed_done)

    def _resumed_done(self, reader) -> None:
        if reader.delivered != self.resume_expect:
            raise Violation("log-resume", f"resumed reader delivered {len(reader.delivered)} "
                                          f"records, expected {len(self.resume_expect)}")
        self.finished, self.outcome = True, "done"


class SimLogWriter:
    """One writer of the log: take over, recover the previous segment, write
    entries of records, roll segments; stops at its first failure."""

    def __init__(self, c: LogCluster, name: str, close_when_open: bool = False,
                 on_closed=None):
        self.c, self.name = c, name
        self.host = CoreHost(c.world, name, c.meta, self.on_result)
        self.close_when_open, self.on_closed = close_when_open, on_closed
        self.error = None
        self.stop_writing = False
        self.epoch = None
        self.core = None  # the LedgerWriter of our segment
        self.recovery = None
        self.reader = None
        self.seg = None
        self.last_txid = NO_TXID
        self.written = 0
        self.entries: dict[int, list[tuple[int, bytes]]] = {}  # entry id -> records
        self.seg_records = 0
        self.seg_first = NO_TXID
        self.seg_last_data = (-1, 0)
        self.closing = False
        c.world.log(f"{name} opens the log")
        c.logs.update(lambda m: take_ownership(m, name), self._owned)

    def _fail(self, error) -> None:
        if self.error is None:
            self.error = error
            self.c.world.log(f"{self.name} fails: {error}")
            if isinstance(error, LogFencedError) or "Fenced" in type(error).__name__:
                self.c.stats["fenced_writers"] += 1
            if self.on_closed is not None:
                self.on_closed(self)

    def _alive(self) -> bool:
        return not self.host.dead and self.error is None

    def _owned(self, md) -> None:
        if not self._alive():
            return
        if self.epoch is None:
            self.epoch = md.epoch
        elif md.epoch != self.epoch:
            self._fail(LogFencedError(f"epoch {self.epoch} superseded by {md.epoch}"))
            return
        seg = md.in_progress
        if seg is None:
            self.last_txid = md.last_txid
            self._start_segment()
            return
        ledger, version = self.c.meta.get(seg.ledger_id)
        self.prev = seg
        if self.c.cfg.break_fence:  # BROKEN: no fence, no close: just the LAC
            self.reader = LedgerReader(ledger, self.c.digest, master_key=self.c.key,
                                       ids=self.host.ids)
            self.host.call(self.reader, self.reader.open, self.c.world.now_ms)
            return
        self.recovery = LedgerRecovery(ledger, version, self.c.key, self.c.digest,
                                       config=RecoveryConfig(request_timeout_ms=100,
                                                             retry_backoff_ms=50),
                                       available_bookies=self.c.available(),
                                       ids=self.host.ids)
        self.host.call(self.recovery, self.recovery.start, self.c.world.now_ms)

    def _previous_end(self, last: int) -> None:
        """The previous segment ends at entry ``last``: read its header."""
        if last < 0:
            self._complete_previous(SegmentEnd())
            return
        md, _ = self.c.meta.get(self.prev.ledger_id)
        self.reader = LedgerReader(md, self.c.digest, master_key=self.c.key, ids=self.host.ids)
        self.reader.last_add_confirmed = max(self.reader.last_add_confirmed, last)
        self.host.call(self.reader, self.reader.read, last, last, self.c.world.now_ms)

    def _complete_previous(self, end: SegmentEnd) -> None:
        seq = self.prev.seq

        def done(m):
            current = m.segment(seq)
            if current is None or current.state != IN_PROGRESS:
                return None
            return complete_segment(m, self.epoch, seq, end)

        def after(result):
            if isinstance(result, Exception):
                self._fail(result)
                return
            self.last_txid = result.last_txid
            self._start_segment()
        self.c.logs.update(done, after)

    def _start_segment(self) -> None:
        if not self._alive():
            return
        md = self.c.new_ledger()

        def after(result):
            if isinstance(result, Exception):
                self._fail(result)
                return
            if not self._alive():
                return
            self.seg = result.in_progress
            self.c.stats["segments"] += 1
            ledger, version = self.c.meta.get(md.ledger_id)
            if ledger.state != "OPEN":  # a newer writer took over and recovered it first
                self._fail(LogFencedError(f"segment ledger {md.ledger_id} is {ledger.state}"))
                return
            self.core = LedgerWriter(ledger, version, self.c.key, self.c.digest,
                                     config=WriterConfig(add_timeout_ms=self.c.cfg.add_timeout_ms),
                                     available_bookies=self.c.available(), ids=self.host.ids)
            self.entries, self.seg_records = {}, 0
            self.seg_first, self.seg_last_data = NO_TXID, (-1, 0)
            if self.close_when_open:
                self._close_segment(final=True)
            else:
                self.c.world.schedule(1, self._write_tick)
        self.c.logs.update(lambda m: start_segment(m, self.epoch, md.ledger_id, 0), after)

    def _write_tick(self) -> None:
        world, core, cfg = self.c.world, self.core, self.c.cfg
        if not self._alive() or self.closing or core.state != OPEN_STATE:
            return
        if world.now_ms < self.host.paused_until:
            world.at(self.host.paused_until, self._write_tick)
            return
        if self.stop_writing or self.written >= cfg.writes_per_writer:
            return
        entry_id = core.last_add_pushed + 1
        if entry_id >= cfg.entries_per_segment:
            if core.pending_count == 0:
                self._close_segment()
            else:
                world.schedule(2, self._write_tick)
            return
        control = world.rng.random() < 0.1 and self.seg_records > 0
        records = [] if control else [
            (self.last_txid + 1 + i if self.last_txid != NO_TXID else 1 + i,
             f"{self.name}:{self.written}:{i}".encode())
            for i in range(world.rng.randint(1, cfg.records_max))]
        if records:
            self.last_txid = records[-1][0]
            self.seg_records += len(records)
            if self.seg_first == NO_TXID:
                self.seg_first = records[0][0]
            self.seg_last_data = (entry_id, len(records) - 1)
        header = EntryHeader(control, len(records), self.seg_records, self.seg_first,
                             self.last_txid if self.seg_records else NO_TXID,
                             *self.seg_last_data)
        data = pack_entry(header, [t for t, _ in records], [p for _, p in records])
        for _, payload in records:
            self.c.checker.on_written(payload)
        self.entries[entry_id] = records
        self.written += 1
        self.host.call(core, core.add_many, [data], world.now_ms)
        world.schedule(world.rng.randint(1, 15), self._write_tick)

    def _close_segment(self, final: bool = False) -> None:
        self.closing = True
        self.final_close = final
        self.host.call(self.core, self.core.close, self.c.world.now_ms)

    def bookies_changed(self, available) -> None:
        if self._alive():
            for core in (self.core, self.recovery):
                if core is not None:
                    self.host.deliver(core, ev.AvailableBookies(available, self.c.world.now_ms))

    def on_result(self, core, action) -> None:
        if not self._alive():
            return
        if core is self.recovery and isinstance(action, ev.OpenDone):
            if action.code != OK:
                self.c.world.schedule(100, self._owned_again)
                return
            self._previous_end(action.last_add_confirmed)
        elif core is self.reader and isinstance(action, ev.OpenDone):  # break_fence only
            self._previous_end(action.last_add_confirmed if action.code == OK else -1)
        elif core is self.reader and isinstance(action, ev.ReadDone):
            if action.code != OK:
                self.c.world.schedule(50, self._previous_end, action.first_entry_id)
                return
            h = read_header(bytes(action.payloads[0]))
            last = action.first_entry_id
            self.reader = None
            self._complete_previous(SegmentEnd(
                h.records, h.first_txid, h.last_txid,
                DLSN(self.prev.seq, h.last_entry, h.last_slot) if h.last_entry >= 0 else None,
                last))
        elif core is self.core and isinstance(action, ev.CompleteAdds):
            for entry_id in range(action.first_entry_id, action.last_entry_id + 1):
                for slot, (_, payload) in enumerate(self.entries.get(entry_id, ())):
                    self.c.checker.on_acked(DLSN(self.seg.seq, entry_id, slot), payload)
        elif core is self.core and isinstance(action, ev.FailAdds):
            self._fail(LogFencedError(f"adds failed ({action.code})"))
        elif core is self.core and isinstance(action, ev.CloseDone):
            if action.code != OK:
                self._fail(LogFencedError(f"close failed ({action.code})"))
                return
            self._segment_closed(action.last_entry_id)

    def _owned_again(self) -> None:
        self.c.logs.read(self._owned)

    def _segment_closed(self, last: int) -> None:
        seq, end = self.seg.seq, SegmentEnd(
            self.seg_records, self.seg_first, self.last_txid if self.seg_records else NO_TXID,
            DLSN(self.seg.seq, *self.seg_last_data) if self.seg_last_data[0] >= 0 else None,
            last)

        def after(result):
            if isinstance(result, Exception):
                self._fail(result)
                return
            self.closing = False
            if self.final_close:
                if self.on_closed is not None:
                    self.on_closed(self)
                return
            self._start_segment()
        self.c.logs.update(lambda m: complete_segment(m, self.epoch, seq, end), after)


class SimLogReader:
    """Reads the log from ``start``: completed segments to their end, the
    in-progress one up to the LAC (polling), re-reading the log's metadata
    when it runs dry; ``until_heal``: a tailer that stops at the heal."""

    def __init__(self, c: LogCluster, name: str, start: DLSN, until_heal: bool, on_done=None):
        self.c, self.name, self.start = c, name, start
        self.until_heal, self.on_done = until_heal, on_done
        self.host = CoreHost(c.world, name, c.meta, self.on_result)
        self.pos = start
        self.delivered: list[tuple[DLSN, int, bytes]] = []
        self.seg = None
        self.core = None
        self.next_entry = 0
        self.done = False
        c.logs.read(self._md)

    def _md(self, md) -> None:
        if self.done:
            return
        if self.until_heal and self.c.healed:
            self.done = True
            return
        self.md = md
        if self.seg is not None:
            current = md.segment(self.seg.seq)
            if current is not None and current.state == COMPLETED \
                    and self.seg.state != COMPLETED:
                self.seg = current
                self._open()
                return
            self.c.world.schedule(20, self._step)
            return
        live = md.segments_from(self.pos)
        if not live:
            if not self.until_heal and md.in_progress is None and self._all_read(md):
                self._finish()
                return
            self.c.world.schedule(20, self.c.logs.read, self._md)
            return
        self.seg = live[0]
        if self.seg.seq > self.pos.seq:
            self.pos = DLSN(self.seg.seq, 0, 0)
        self.next_entry = self.pos.entry_id
        self._open()

    def _all_read(self, md) -> bool:
        return all(s.seq < self.pos.seq for s in md.live_segments)

    def _open(self) -> None:
        ledger, _ = self.c.meta.get(self.seg.ledger_id)
        self.core = LedgerReader(ledger, self.c.digest, master_key=self.c.key, ids=self.host.ids,
                                 config=ReaderConfig(read_timeout_ms=100,
                                                     lac_poll_interval_ms=10,
                                                     read_rounds_max=5))
        self.host.call(self.core, self.core.open, self.c.world.now_ms)

    def _step(self) -> None:
        if self.done:
            return
        if self.until_heal and self.c.healed:
            self.done = True
            return
        end = self.seg.last_entry_id if self.seg.state == COMPLETED \
            else self.core.last_add_confirmed
        if self.next_entry <= end:
            upto = min(end, self.next_entry + 7)
            self.host.call(self.core, self.core.read, self.next_entry, upto,
                           self.c.world.now_ms)
        elif self.seg.state == COMPLETED:
            self.pos = max(self.pos, DLSN(self.seg.seq + 1, 0, 0))
            self.seg = None
            self.c.logs.read(self._md)
        else:
            self.host.call(self.core, self.core.wait_for_lac, self.next_entry - 1, 60,
                           self.c.world.now_ms)

    def on_result(self, core, action) -> None:
        if self.done or core is not self.core:
            return
        if isinstance(action, ev.OpenDone):
            if action.code != OK:
                self.c.world.schedule(30, self._open)
                return
            if self.seg.state == COMPLETED:  # its end is in the log's metadata
                core.last_add_confirmed = max(core.last_add_confirmed, self.seg.last_entry_id)
            self.c.world.schedule(1, self._step)
        elif isinstance(action, ev.ReadDone):
            if action.code != OK:
                self.c.world.schedule(30, self._step)
                return
            for i, data in enumerate(action.payloads):
                entry_id = action.first_entry_id + i
                header, txids, payloads = unpack_entry(bytes(data))
                if header.control:
                    continue
                for slot, (txid, payload) in enumerate(zip(txids, payloads, strict=True)):
                    dlsn = DLSN(self.seg.seq, entry_id, slot)
                    if dlsn >= self.pos:
                        self.delivered.append((dlsn, txid, payload))
            self.next_entry = action.first_entry_id + len(action.payloads)
            if self.delivered:
                self.pos = max(self.pos, self.delivered[-1][0].next())
            self.c.world.schedule(1, self._step)
        elif isinstance(action, ev.LacRead):
            if action.lac < self.next_entry:  # nothing new: has the segment completed?
                self.c.logs.read(self._md)
            else:
                self.c.world.schedule(1, self._step)

    def _finish(self) -> None:
        self.done = True
        if self.on_done is not None:
            self.on_done(self)


@dataclass
class LogRunResult:
    seed: int
    violation: str | None
    detail: str
    summary: str
    stats: dict = field(default_factory=dict)
    trace: list[str] = field(default_factory=list)


def run_log_seed(seed: int, break_fence: bool = False, trace_max: int = 60) -> LogRunResult:
    cfg = random_log_config(seed, break_fence)
    world = World(seed, trace_max)
    cluster = LogCluster(cfg, world)
    violation, detail = None, ""
    try:
        cluster.start()
        world.run(until_ms=cfg.heal_at_ms + RUN_MS_MAX, steps_max=STEPS_MAX,
                  until=lambda: cluster.finished)
        if not cluster.finished:
            raise Violation("liveness", f"not finished after {world.steps} steps")
    except Violation as exc:
        violation, detail = exc.name, exc.detail
    except Exception as exc:  # noqa: BLE001 - a harness or core bug: reported, never hidden
        import traceback

        violation, detail = "crash", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
    return LogRunResult(seed, violation, detail, cfg.summary(), dict(cluster.stats),
                        world.trace_lines() if violation else [])



def main(argv=None) -> int:
    import argparse
    import time

    parser = argparse.ArgumentParser(prog="python -m tests.sim.logsim",
                                     description="Run the log layer's simulation over seeds.")
    parser.add_argument("--seeds", type=int, default=2000)
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--seed", type=int, default=None, help="replay one seed, with its trace")
    parser.add_argument("--break-fence", action="store_true",
                        help="remove the fencing of the previous segment: must be caught")
    args = parser.parse_args(argv)
    seeds = [args.seed] if args.seed is not None else range(args.first, args.first + args.seeds)
    started = time.monotonic()
    failures, totals = [], {}
    for seed in seeds:
        result = run_log_seed(seed, args.break_fence, trace_max=80)
        for k, v in result.stats.items():
            totals[k] = totals.get(k, 0) + v
        if result.violation:
            failures.append(result)
            if args.seed is not None or args.break_fence:
                print(f"VIOLATION seed={seed} [{result.violation}] {result.detail}")
                print(f"  config: {result.summary}")
                print("\n".join("    " + line for line in result.trace[-40:]))
                break
    ran = len(seeds) if not failures or not args.break_fence else \
        failures[0].seed - (args.first if args.seed is None else args.seed) + 1
    counts = ", ".join(f"{k} {v}" for k, v in totals.items())
    print(f"log sim: {ran} seeds, {len(failures)} violation(s), "
          f"{time.monotonic() - started:.1f} s; {counts}")
    for f in failures[:5]:
        if not args.break_fence and args.seed is None:
            print(f"VIOLATION seed={f.seed} [{f.violation}] {f.detail}  "
                  f"(replay: python -m tests.sim.logsim --seed {f.seed})")
    return 1 if failures and not args.break_fence else 0


if __name__ == "__main__":
    raise SystemExit(main())
