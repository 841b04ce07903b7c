"""Cold storage in a deterministic simulation: the real mover
(``appliance.cold.mover.Mover``) and the real log reader
(``appliance.logs.reader.LogReader``) over in-memory metadata, ledgers and
a pyarrow in-memory filesystem, one seed per run.

A log of sealed segments (and one in-progress segment) is moved by movers
that die at a random I/O call (before or after it took effect: ``kill -9``),
each followed by a new mover once the dead one's session (its lease) is
gone.  Between any two I/O calls of a mover, readers step (a few records
each, from the start or from a random position), and the clock moves.  At
the end one more mover runs whole, after every grace.

Invariants:

``cold-unreadable``  after every I/O call, every live segment can be read
                     from its tier: a hot one's ledger exists, a cold one's
                     file exists and holds its records;
``cold-readers``     every reader delivered exactly the log's records from
                     its start, in order, each once, with the same DLSNs,
                     txids and payloads;
``cold-orphan``      after the final pass the log's folder holds exactly
                     the files its segments name;
``cold-ledger``      ... and every sealed segment is cold with its ledger
                     deleted;
``cold-truncate``    a truncation then leaves no file of a dropped segment.

``break_order=True`` makes the mover swap the segment to cold *before* it
writes the file: a mover killed between the two leaves a cold segment
without a file, and ``cold-unreadable`` must catch it.

    python -m tests.sim.coldsim --seeds 300
    python -m tests.sim.coldsim --seeds 300 --break-order
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import dataclass, field

import pyarrow.fs as pafs

import appliance.cold.reading as cold_reading
from appliance.cold.mover import Mover
from appliance.cold.store import ColdStore
from appliance.errors import (
    MetadataVersionError,
    NodeExistsError,
    NoNodeError,
    NoSuchEntryError,
    NoSuchLedgerError,
)
from appliance.logs.log import Log
from appliance.logs.reader import LogReader
from appliance.meta.logs import LogManager, log_path
from appliance.meta.records import encode_record
from appliance.protocol.log_entry import EntryHeader, pack_entry
from appliance.protocol.logs import (
    COMPLETED,
    DLSN,
    IN_PROGRESS,
    NO_TXID,
    LogMetadata,
    Segment,
    move_to_cold,
)

NAME = "sim"


class Crash(BaseException):
    """The mover process dies here (not an Exception: nothing catches it)."""


class Violation(BaseException):  # never caught by the code under test
    def __init__(self, name: str, detail: str):
        super().__init__(f"{name}: {detail}")
        self.name, self.detail = name, detail


# -- the world ---------------------------------------------------------------------
class Store:
    """A metadata store: versioned nodes, CAS, ephemeral nodes per session."""

    def __init__(self):
        self.nodes: dict[str, tuple[bytes, int, object]] = {}

    def get(self, path):
        if path not in self.nodes:
            raise NoNodeError(path)
        data, version, _ = self.nodes[path]
        return data, version

    def set(self, path, data, expected_version):
        if path not in self.nodes:
            raise NoNodeError(path)
        _, version, owner = self.nodes[path]
        if expected_version not in (-1, version):
            raise MetadataVersionError(path)
        self.nodes[path] = (data, version + 1, owner)
        return version + 1

    def create(self, path, data=b"", *, ephemeral=False, make_parents=False, session=None):
        if path in self.nodes:
            raise NodeExistsError(path)
        self.nodes[path] = (data, 0, session if ephemeral else None)
        return path

    def delete(self, path, expected_version=-1):
        if path not in self.nodes:
            raise NoNodeError(path)
        del self.nodes[path]

    def exists(self, path):
        return path in self.nodes

    def children(self, path):
        prefix = path.rstrip("/") + "/"
        return sorted({p[len(prefix):].split("/")[0] for p in self.nodes if p.startswith(prefix)})

    def expire(self, session) -> None:
        for path in [p for p, (_, _, owner) in self.nodes.items() if owner is session]:
            del self.nodes[path]


class Session:
    """A mover's view of the store: its I/O calls are crash points."""

    def __init__(self, store: Store, sim: Sim):
        self.store, self.sim = store, sim

    def __getattr__(self, name):
        call = getattr(self.store, name)

        def io(*args, **kwargs):
            if name == "create":
                kwargs["session"] = self
            return self.sim.io(f"meta.{name}", lambda: call(*args, **kwargs))
        return io


class RH:
    """A read handle on a simulated ledger (list of entry payloads)."""

    def __init__(self, sim: Sim, ledger_id: int):
        self.sim, self.ledger_id = sim, ledger_id
        self.last_add_confirmed = len(sim.ledger(ledger_id)) - 1
        self.metadata = _LedgerMd(None)

    def read(self, first, last):
        entries = self.sim.ledger(self.ledger_id)
        if last >= len(entries):
            raise NoSuchEntryError(f"ledger {self.ledger_id} entry {last}")
        return [_Entry(i, entries[i]) for i in range(first, last + 1)]

    def read_chunks(self, first, last):
        for e in self.read(first, last):
            yield _Chunk(e.entry_id, 1, e.payload, [0, len(e.payload)])

    def close(self):
        pass


@dataclass
class _LedgerMd:
    password_hash: bytes | None


@dataclass
class _Entry:
    entry_id: int
    payload: bytes


@dataclass
class _Chunk:
    first_entry_id: int
    count: int
    payloads: bytes
    offsets: list


class ReaderClient:
    """What ``LogReader`` needs of a client."""

    def __init__(self, sim: Sim):
        self.sim, self.cold_config = sim, None

    def open_ledger(self, ledger_id, password=b"", recovery=True):
        self.sim.ledger(ledger_id)
        return RH(self.sim, ledger_id)


class SimColdStore(ColdStore):
    def __init__(self, sim: Sim):
        self.sim, self.uri, self.root, self.local = sim, "mock://cold", "cold", False
        self.fs = sim.fs

    def uri_of(self, path):
        return f"mock://{path}"

    def open(self, uri):
        return self.fs, uri.removeprefix("mock://")

    def new_path(self, log_name, seq, ledger_id):  # seeded, not secrets: runs replay
        token = self.sim.rng.getrandbits(48)
        return f"{self.root}/{log_name}/{seq}-{ledger_id}-{token:012x}.parquet"

    def write(self, path, data):
        def put():
            self.fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
            with self.fs.open_output_stream(path) as out:
                out.write(data)
            self.sim.mtime_ms[path] = self.sim.now_ms
        self.sim.io("fs.write", put)

    def delete(self, uri):
        return self.sim.io("fs.delete", lambda: ColdStore.delete(self, uri))

    def files(self, log_name):
        return self.sim.io("fs.list", lambda: [
            (self.uri_of(p), self.sim.mtime_ms.get(p, 0) / 1000) for p in self.sim.paths()])


@dataclass
class ColdSimConfig:
    seed: int
    segments: int
    movers: int  # movers that die before the final one
    readers: int
    delete_after_ms: int
    orphan_grace_ms: int
    break_order: bool = False


@dataclass
class ColdSimResult:
    seed: int
    violation: str | None = None
    detail: str = ""
    stats: dict = field(default_factory=dict)


def random_cold_config(seed: int, break_order: bool = False) -> ColdSimConfig:
    rng = random.Random(seed)
    return ColdSimConfig(seed=seed, segments=rng.randint(1, 5), movers=rng.randint(1, 4),
                         readers=rng.randint(0, 3), delete_after_ms=rng.choice((0, 5, 50)),
                         orphan_grace_ms=rng.choice((0, 10, 100)), break_order=break_order)


class Sim:
    def __init__(self, cfg: ColdSimConfig):
        self.cfg, self.rng = cfg, random.Random(cfg.seed * 7919 + 1)
        self.now_ms = 1_000_000
        self.store = Store()
        self.ledgers: dict[int, list[bytes]] = {}
        self.fs = pafs._MockFileSystem()
        self.mtime_ms: dict[str, int] = {}
        self.crash_at: int | None = None  # the mover's I/O call that kills it
        self.crash_after = False
        self.calls = 0
        self.violation: Violation | None = None  # the first one (a later one may replace it)
        self.readers: list[tuple[LogReader, list, list]] = []  # reader, got, expected
        self.stats = {"crashes": 0, "moved": 0, "reader_steps": 0, "orphans_removed": 0}
        self.records = self._build_log()

    # -- set-up ----------------------------------------------------------------
    def _build_log(self) -> list[tuple[DLSN, int, bytes]]:
        segments, records, txid = [], [], 0
        for seq in range(1, self.cfg.segments + 2):
            ledger, seg_records, first = [], [], NO_TXID
            for entry_id in range(self.rng.randint(1, 4)):
                count = self.rng.randint(1, 4)
                txids = [txid + 1 + i for i in range(count)]
                payloads = [b"s%d-e%d-%d" % (seq, entry_id, i) for i in range(count)]
                txid, first = txids[-1], txids[0] if first == NO_TXID else first
                seg_records += [(DLSN(seq, entry_id, i), t, p)
                                for i, (t, p) in enumerate(zip(txids, payloads, strict=True))]
                ledger.append(pack_entry(EntryHeader(False, count, len(seg_records), first, txid,
                                                     entry_id, count - 1), txids, payloads))
            if self.rng.random() < 0.3:  # an idle writer's control entry closes it
                last = seg_records[-1][0]
                ledger.append(pack_entry(EntryHeader(True, 0, len(seg_records), first, txid,
                                                     last.entry_id, last.slot), [], []))
            self.ledgers[100 + seq] = ledger
            sealed = seq <= self.cfg.segments
            segments.append(Segment(
                seq=seq, ledger_id=100 + seq, state=COMPLETED if sealed else IN_PROGRESS,
                records=len(seg_records) if sealed else 0,
                first_txid=first if sealed else NO_TXID, last_txid=txid if sealed else NO_TXID,
                last_dlsn=seg_records[-1][0] if sealed else None,
                last_entry_id=len(ledger) - 1 if sealed else -1, ctime_ms=0))
            records += seg_records
        md = LogMetadata(name=NAME, segments=tuple(segments), next_seq=len(segments) + 1,
                         last_txid=segments[-2].last_txid if len(segments) > 1 else NO_TXID)
        self.store.create(log_path(NAME), encode_record(md.to_bytes()))
        return records

    def ledger(self, ledger_id: int) -> list[bytes]:
        if ledger_id not in self.ledgers:
            raise NoSuchLedgerError(f"ledger {ledger_id}")
        return self.ledgers[ledger_id]

    def paths(self) -> list[str]:
        infos = self.fs.get_file_info(pafs.FileSelector(f"cold/{NAME}", allow_not_found=True))
        return sorted(i.path for i in infos if i.type == pafs.FileType.File)

    # -- the mover's I/O: a crash point, readers step, the clock moves ------------------
    def io(self, what: str, call):
        self.calls += 1
        self.now_ms += self.rng.randint(0, 20)
        self._step_readers()
        if self.crash_at == self.calls and not self.crash_after:
            raise Crash(what)
        result = call()
        try:
            self.check_readable(what)
        except Violation as v:
            self.violation = self.violation or v
            raise
        if self.crash_at == self.calls:
            raise Crash(what + " (after it took effect)")
        return result

    def _step_readers(self) -> None:
        for reader, got, _ in self.readers:
            if self.rng.random() < 0.5:
                try:
                    got += reader.read(max_records=self.rng.randint(1, 6), timeout_s=0)
                except Exception as exc:  # noqa: BLE001 - a reader must never fail here
                    raise Violation("cold-readers", f"a reader failed: {type(exc).__name__}: "
                                                    f"{exc}") from None
                self.stats["reader_steps"] += 1
        if len(self.readers) < self.cfg.readers and self.rng.random() < 0.05:
            self.add_reader()

    def add_reader(self) -> None:
        start = self.rng.choice(self.records)[0] if self.rng.random() < 0.5 else DLSN.FIRST
        reader = LogReader(ReaderClient(self), LogManager(self.store), NAME, b"", start)
        self.readers.append((reader, [], [r for r in self.records if r[0] >= start]))

    # -- invariants --------------------------------------------------------------
    def metadata(self) -> LogMetadata:
        return LogManager(self.store).read_log(NAME)[0]

    def check_readable(self, after: str) -> None:
        for seg in self.metadata().live_segments:
            if seg.cold is None:
                if seg.ledger_id not in self.ledgers:
                    raise Violation("cold-unreadable", f"after {after}: hot segment {seg.seq} "
                                                       f"has no ledger {seg.ledger_id}")
                continue
            try:
                cold_reading.load_segment(None, NAME, seg)
            except Exception as exc:  # noqa: BLE001 - any failure is the violation
                raise Violation("cold-unreadable", f"after {after}: cold segment {seg.seq}: "
                                                   f"{exc}") from None

    def check_end(self) -> None:
        for reader, got, expected in self.readers:
            while more := reader.read(max_records=100, timeout_s=0):
                got += more
            if [tuple(r) for r in got] != expected:
                raise Violation("cold-readers", f"from {expected[0][0] if expected else '-'}: "
                                                f"{len(got)} records delivered, "
                                                f"{len(expected)} expected")
        md = self.metadata()
        named = sorted(s.cold.uri.removeprefix("mock://") for s in md.segments if s.cold)
        if self.paths() != named:
            raise Violation("cold-orphan", f"files {self.paths()}, named {named}")
        for seg in md.live_segments:
            if seg.state == COMPLETED and not (seg.cold and seg.ledger_deleted
                                               and seg.ledger_id not in self.ledgers):
                raise Violation("cold-ledger", f"segment {seg.seq} tier {seg.tier}, ledger "
                                               f"deleted {seg.ledger_deleted}")

    # -- movers --------------------------------------------------------------------
    def mover(self, session: Session) -> Mover:
        cls = CasFirstMover if self.cfg.break_order else Mover
        return cls(LogManager(session), SimColdStore(self), self.cfg,
                   open_ledger=lambda lid: self.io("ledger.open", lambda: RH(self, lid)),
                   delete_ledger=lambda lid: self.io("ledger.delete", lambda: self._delete(lid)),
                   clock_ms=lambda: self.now_ms, owner="sim")

    def _delete(self, ledger_id: int) -> None:
        self.ledger(ledger_id)
        del self.ledgers[ledger_id]

    def run_mover(self, crash: bool) -> None:
        session = Session(self.store, self)
        self.crash_at = self.calls + self.rng.randint(1, 40) if crash else None
        self.crash_after = self.rng.random() < 0.5
        try:
            result = self.mover(session).offload(NAME)
            self.stats["orphans_removed"] += len(result.orphans_removed)
        except Crash:
            self.stats["crashes"] += 1
        finally:
            self.crash_at = None
            self.store.expire(session)  # its session lapses: the lease is gone

    def run(self) -> None:
        for _ in range(self.cfg.readers):
            if self.rng.random() < 0.5:
                self.add_reader()
        for _ in range(self.cfg.movers):
            self.run_mover(crash=True)
        self.now_ms += max(self.cfg.delete_after_ms, self.cfg.orphan_grace_ms) + 1
        self.run_mover(crash=False)  # moves what is left, deletes, collects
        self.now_ms += self.cfg.delete_after_ms + 1
        self.run_mover(crash=False)  # the ledgers of what the last pass moved
        self.stats["moved"] = sum(1 for s in self.metadata().segments if s.cold)
        self.check_end()
        self.check_truncation()

    def check_truncation(self) -> None:
        md = self.metadata()
        if len(md.live_segments) < 2:
            return
        before = DLSN(md.live_segments[-1].seq, 0, 0)

        Log(_TruncatingClient(self), LogManager(self.store), NAME, b"", None).truncate(before)
        left = {s.cold.uri.removeprefix("mock://") for s in self.metadata().segments if s.cold}
        if not set(self.paths()) <= left:
            raise Violation("cold-truncate", f"files {self.paths()} after truncation")


class _TruncatingClient(ReaderClient):
    def delete_ledger(self, ledger_id, password=b""):
        self.sim._delete(ledger_id)


class CasFirstMover(Mover):
    """``break_order``: the segment is marked cold before its file exists."""

    def move(self, name, seg):
        import crc32c

        from appliance.cold.segment_file import check_table, encode, with_metadata
        from appliance.protocol.logs import ColdCopy

        table, _ = self._read_ledger(seg)
        crc = check_table(name, seg, table)
        data = encode(with_metadata(name, seg, table, crc))
        path = self.store.new_path(name, seg.seq, seg.ledger_id)
        copy = ColdCopy(uri=self.store.uri_of(path), bytes=len(data), crc32c=crc,
                        file_crc32c=crc32c.crc32c(data), moved_ms=self._clock_ms())
        self.logs.update_log(name, lambda m: move_to_cold(m, seg.seq, seg.ledger_id, copy))
        self.store.write(path, data)
        return len(data)


def run_cold_seed(seed: int, break_order: bool = False) -> ColdSimResult:
    sim = Sim(random_cold_config(seed, break_order))
    saved = cold_reading.open_file
    cold_reading.open_file = lambda cfg, uri: (sim.fs, uri.removeprefix("mock://"))
    try:
        sim.run()
    except Violation as v:
        first = sim.violation or v
        return ColdSimResult(seed, first.name, first.detail, sim.stats)
    finally:
        cold_reading.open_file = saved
    return ColdSimResult(seed, None, "", sim.stats)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=300)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--break-order", action="store_true")
    args = parser.parse_args(argv)
    seeds = [args.seed] if args.seed is not None else range(args.seeds)
    started, bad, totals = time.monotonic(), 0, {}
    for seed in seeds:
        result = run_cold_seed(seed, args.break_order)
        for k, v in result.stats.items():
            totals[k] = totals.get(k, 0) + v
        if result.violation:
            bad += 1
            print(f"seed {seed}: {result.violation}: {result.detail}")
    print(f"cold sim: {len(seeds)} seeds, {bad} violation(s), "
          f"{time.monotonic() - started:.1f} s; " + ", ".join(f"{k} {v}" for k, v in
                                                               totals.items()))
    return 1 if bad and not args.break_order else 0


if __name__ == "__main__":
    sys.exit(main())
