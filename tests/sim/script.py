"""Scripted simulation runs: the same cluster, cores and checker as the
random runs, but every fault placed by hand (drop or hold chosen messages,
crash a bookie now, stall the writer) so a known scenario replays step by
step.  Used by the scenario tests in ``tests/sim/test_scenarios.py``.
"""

from __future__ import annotations

from appliance.checks.digest import master_key
from appliance.errors import OK
from appliance.protocol import events as ev
from appliance.protocol.entry import pack_entry
from appliance.protocol.invariant import InvariantViolation
from appliance.protocol.quorum import Protections
from appliance.protocol.reader import LedgerReader
from tests.sim.apps import ReaderApp, RecoveryApp, WriterApp
from tests.sim.cluster import Cluster
from tests.sim.config import SimConfig
from tests.sim.nodes import CoreHost
from tests.sim.world import Violation


def message(kind, src: str | None = None, dst: str | None = None, entry: int | None = None,
            fence: bool | None = None):
    """A predicate over (src, dst, msg) for ``drop``/``hold``/``release``."""
    def match(s, d, msg) -> bool:
        if not isinstance(msg, kind) or (src and s != src) or (dst and d != dst):
            return False
        if entry is not None and getattr(msg, "entry_id", None) != entry \
                and entry not in getattr(msg, "entry_ids", ()):
            return False
        return fence is None or getattr(msg, "fence", None) == fence
    return match


class Script:
    """A hand-driven cluster.  Bookies are ``bookie-1..N``; the ledger's first
    ensemble is ``bookie-1..E``; ``hosts`` > 0 labels them round-robin over
    that many hosts (``SimConfig.hosts``).  Nothing happens unless the script says so."""

    def __init__(self, ensemble: int, write_quorum: int, ack_quorum: int, *, bookies: int = 0,
                 journal: bool = True, disabled: tuple[str, ...] = (),
                 positive_min: int | None = None, timeout_ms: int = 10_000,
                 flush_interval_ms: int = 1_000_000, seed: int = 0, hosts: int = 0):
        cfg = SimConfig(
            seed=seed, ensemble=ensemble, write_quorum=write_quorum, ack_quorum=ack_quorum,
            bookies=bookies or ensemble, journal=journal, digest="crc32c",
            positive_min=positive_min, entries=0, batch_max=1, add_interval_ms=(1, 1),
            add_timeout_ms=timeout_ms, explicit_lac_ms=0, drop_p=0.0, dup_p=0.0, slow_p=0.0,
            delay_ms=(1, 1), slow_ms=(1, 1), sync_interval_ms=1,
            flush_interval_ms=flush_interval_ms, heal_at_ms=10**9,
            writer_close_at_ms=None, writer_dies_at_ms=None, hosts=hosts)
        self.cluster = Cluster(cfg, Protections.without(*disabled),
                               ensemble=tuple(f"bookie-{i}" for i in range(1, ensemble + 1)))
        self.world = self.cluster.world
        self.writer = WriterApp(self.cluster)
        self.cluster.writer = self.writer
        self.cluster.apps.append(self.writer)
        self.recoveries: dict[str, RecoveryApp] = {}
        self.results: list = []
        self.writer.host.on_result = self._writer_result
        self.violation: Violation | None = None

    # -- what the user of the ledger does ----------------------------------------------------
    def add(self, count: int = 1) -> list[int]:
        core = self.writer.core
        first = core.last_add_pushed + 1
        payloads = [b"entry-%d" % e for e in range(first, first + count)]
        self.writer.host.call(core, core.add_many, payloads, self.world.now_ms)
        return list(range(first, first + count))

    def close(self) -> None:
        self.writer.host.call(self.writer.core, self.writer.core.close, self.world.now_ms)

    def recover(self, name: str = "recovery", attempts_max: int = 1,
                password: bytes | None = None) -> RecoveryApp:
        """Open with recovery now (``password``: another password than the writer's)."""
        key = master_key(password) if password is not None else None
        app = RecoveryApp(self.cluster, name, self.world.now_ms, attempts_max=attempts_max,
                          master_key=key)
        self.recoveries[name] = app
        self.cluster.apps.append(app)
        return app

    def read_all(self, name: str = "reader", password: bytes | None = None) -> ReaderApp:
        """Open the (closed) ledger without recovery and read 0..last
        (``password``: another password than the writer's: its key)."""
        key = master_key(password) if password is not None else None
        return ReaderApp(self.cluster, name, self.world.now_ms, 0, whole=True, master_key=key)

    def open_no_recovery(self, name: str = "tail") -> tuple[CoreHost, LedgerReader]:
        """A reader opened without recovery (its results collect in ``host.got``)."""
        got: list = []
        host = CoreHost(self.world, name, self.cluster.meta, lambda core, a: got.append(a))
        host.got = got
        md, _ = self.cluster.meta.get(self.cluster.ledger_id)
        reader = LedgerReader(md, self.cluster.digest, master_key=self.cluster.master_key,
                              ids=host.ids)
        host.call(reader, reader.open, self.world.now_ms)
        return host, reader

    def inject_entry(self, entry_id: int, lac: int, bookies, payload: bytes = b"") -> None:
        """Store an entry as a writer would have made it (header LAC ``lac``),
        straight onto ``bookies``: for hand-built states such as gaps."""
        c = self.cluster
        record = pack_entry(c.ledger_id, entry_id, lac, entry_id, payload or b"e%d" % entry_id,
                            c.digest)
        c.checker.on_record(ev.SendAdd(0, "", c.ledger_id, (entry_id,), (record,), False, b""))
        for bookie in bookies:
            code = c.bookies[bookie].core.add(c.ledger_id, entry_id, record, c.master_key).code
            assert code == OK, f"{bookie} refused the injected entry {entry_id}: {code}"

    def kill_writer(self) -> None:
        self.writer.host.dead = True

    def _writer_result(self, core, action) -> None:
        self.results.append(action)
        WriterApp.on_result(self.writer, core, action)

    def writer_results(self, kind) -> list:
        return [a for a in self.results if isinstance(a, kind)]

    @property
    def writer_lac(self) -> int:
        return self.writer.core.last_add_confirmed

    # -- faults -----------------------------------------------------------------------------
    def drop(self, predicate) -> None:
        self.world.net.rules.append(lambda s, d, m: "drop" if predicate(s, d, m) else None)

    def hold(self, predicate) -> None:
        self.world.net.rules.append(lambda s, d, m: "hold" if predicate(s, d, m) else None)

    def clear_rules(self) -> None:
        self.world.net.rules.clear()

    def release(self, predicate=lambda s, d, m: True) -> int:
        return self.world.net.release(predicate)

    def crash(self, bookie: str, keep_ops: int = 0) -> None:
        b = self.cluster.bookies[bookie]
        self.cluster.checker.on_data_loss(bookie, b.crash(keep_ops))
        self.cluster.bookies_changed()

    def refuse_adds(self, bookie: str, code: int) -> None:
        """``bookie`` answers every add with ``code`` from now on (0: stops)."""
        self.cluster.bookies[bookie].refuse_adds = code

    def restart(self, bookie: str) -> None:
        self.cluster.restart(bookie)

    def sync(self, bookie: str) -> None:
        self.cluster.bookies[bookie].storage.sync()

    def stall_writer(self, length_ms: int) -> None:
        self.writer.host.paused_until = self.world.now_ms + length_ms

    # -- running ------------------------------------------------------------------------------
    def run(self, ms: int = 100) -> Violation | None:
        """Advance ``ms`` simulated milliseconds; a violation stops the run
        and is returned (and kept in ``self.violation``)."""
        if self.violation is not None:
            return self.violation
        try:
            self.world.run(until_ms=self.world.now_ms + ms)
        except Violation as exc:
            self.violation = exc
        except InvariantViolation as exc:
            self.violation = Violation(exc.rule or "core-invariant", str(exc))
        return self.violation

    def run_until(self, predicate, ms: int = 1_000) -> bool:
        """Advance until ``predicate()`` holds (checked after every step), at
        most ``ms`` simulated milliseconds.  Returns whether it held."""
        if self.violation is None:
            try:
                self.world.run(until_ms=self.world.now_ms + ms, until=predicate)
            except Violation as exc:
                self.violation = exc
            except InvariantViolation as exc:
                self.violation = Violation(exc.rule or "core-invariant", str(exc))
        return bool(predicate())

    def metadata(self):
        return self.cluster.meta.get(self.cluster.ledger_id)[0]

    def recovered(self, name: str = "recovery") -> ev.OpenDone | None:
        return self.recoveries[name].result

    def recovered_ok(self, name: str = "recovery") -> bool:
        result = self.recovered(name)
        return result is not None and result.code == OK
