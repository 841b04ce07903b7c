"""Many ledgers written at once through shared bookie messages: the
simulation of ``appliance.protocol.writer_multi``.

Each seed runs 2-12 real ``LedgerWriter`` cores (one client) against five
simulated bookies.  As the client does, every turn gathers the adds of
every ledger to one bookie into one message (an ``ADD_MULTI``: parts of
many ledgers, their entries in order) and a bookie answers a message with
one row (entry id, status) per entry, in order, naming no ledger; the reply
is applied with ``apply_multi_reply``, one step for the whole message.  The
network drops, duplicates and reorders messages and replies; a bookie
refuses some entries (an error row: the writer replaces it) and, the fault
this rule is about, sometimes fails to store an entry and leaves its row
out of the reply (a reply one row short).  Metadata writes (ensemble
changes) go to a store that applies each compare-and-set.

Invariants (``violation`` names the first one broken):

* ``acked-quorum``: every acknowledged entry is stored, with the record its
  writer made, on at least ``Qa`` bookies of its write set (in the fragment
  of the final metadata that holds it);
* ``acked-in-order``: each ledger's acknowledgements are one run from entry
  0 on, each entry once.

``break_rows`` switches the rule off (rows taken by position, not matched
to the entries they name): a row left out then shifts every later row onto
the wrong entries, and the checker must catch the false acks.
"""

from __future__ import annotations

import argparse
import itertools
import random
import sys
from collections import Counter
from dataclasses import dataclass, field

from appliance.checks.digest import make_digest, master_key
from appliance.errors import OK, BookieUnavailableError
from appliance.protocol import events as ev
from appliance.protocol.metadata import LedgerMetadata
from appliance.protocol.quorum import WriteSets
from appliance.protocol.writer import OPEN_STATE, LedgerWriter, WriterConfig
from appliance.protocol.writer_multi import apply_multi_reply

BOOKIES = tuple(f"bookie-{i}" for i in range(1, 6))
QUORUMS = ((3, 3, 2), (3, 2, 2), (4, 3, 2), (3, 3, 3))
SIM_MS_MAX = 20_000


@dataclass
class MultiConfig:
    seed: int
    ledgers: int
    quorums: tuple[int, int, int]
    entries: int
    batch_max: int
    drop: float  # a message or reply lost
    dup: float  # a reply delivered twice
    lost_row: float  # per message: one entry not stored and its row left out
    refuse: float  # per message: one entry refused with an error row


@dataclass
class MultiResult:
    seed: int
    violation: str | None = None
    stats: Counter = field(default_factory=Counter)


def random_config(seed: int) -> MultiConfig:
    rng = random.Random(seed)
    return MultiConfig(seed, rng.randint(2, 12), rng.choice(QUORUMS), rng.randint(10, 60),
                       rng.randint(1, 6), rng.choice((0.0, 0.02, 0.05)),
                       rng.choice((0.0, 0.05)), rng.choice((0.0, 0.05, 0.15)),
                       rng.choice((0.0, 0.0, 0.02)))


class _Violation(Exception):
    pass


class MultiSim:
    def __init__(self, cfg: MultiConfig, break_rows: bool):
        self.cfg, self.rng, self.break_rows = cfg, random.Random(cfg.seed * 7919 + 1), break_rows
        self.now, self.seq, self.queue = 0, itertools.count(), []
        self.stats = Counter()
        self.ids = itertools.count(1)
        self.meta: dict[int, tuple[LedgerMetadata, int]] = {}
        self.stored: dict[tuple[str, int, int], bytes] = {}  # (bookie, ledger, entry) -> record
        self.made: dict[tuple[int, int], bytes] = {}  # (ledger, entry) -> its writer's record
        self.acked: dict[int, int] = {}  # ledger -> last acknowledged entry
        self.timers: dict[int, LedgerWriter] = {}
        self.outbox: dict[str, list] = {}
        key = master_key(b"multi-%d" % cfg.seed)
        e, w, a = cfg.quorums
        config = WriterConfig(add_timeout_ms=50, placement="none")
        self.writers = []
        self.writer_of: dict[int, LedgerWriter] = {}
        for ledger in range(1, cfg.ledgers + 1):
            md = LedgerMetadata(ledger, e, w, a, ((0, tuple(self.rng.sample(BOOKIES, e))),))
            self.meta[ledger] = (md, 0)
            self.acked[ledger] = -1
            writer = LedgerWriter(md, 0, key, make_digest("crc32c", key), config=config,
                                  available_bookies=BOOKIES, ids=self.ids)
            self.writers.append(writer)
            self.writer_of[ledger] = writer

    # -- the event loop --------------------------------------------------------------
    def at(self, delay: int, fn, *args) -> None:
        self.queue.append((self.now + delay, next(self.seq), fn, args))

    def run(self) -> None:
        for writer in self.writers:
            self.at(self.rng.randint(0, 3), self.add_tick, writer)
        while self.queue and self.now < SIM_MS_MAX:
            self.queue.sort()
            self.now = self.queue[0][0]
            due = [item for item in self.queue if item[0] == self.now]
            self.queue = [item for item in self.queue if item[0] != self.now]
            self.rng.shuffle(due)  # what arrives at once, in any order
            for _, _, fn, args in due:
                fn(*args)
            self.flush()

    def add_tick(self, writer: LedgerWriter) -> None:
        first = writer.last_add_pushed + 1
        if writer.state != OPEN_STATE or first >= self.cfg.entries:
            return
        count = min(self.rng.randint(1, self.cfg.batch_max), self.cfg.entries - first)
        payloads = [b"%d:%d:" % (writer.ledger_id, e) + self.rng.randbytes(8)
                    for e in range(first, first + count)]
        self.carry_out(writer, writer.add_many(payloads, self.now))
        self.at(self.rng.randint(1, 4), self.add_tick, writer)

    def carry_out(self, writer: LedgerWriter, actions) -> None:
        for action in actions:
            kind = type(action)
            if kind is ev.SendAdd:
                for entry_id, record in zip(action.entry_ids, action.datas, strict=True):
                    self.made.setdefault((action.ledger_id, entry_id), record)
                self.outbox.setdefault(action.bookie_id, []).append((writer, action))
            elif kind is ev.CompleteAdds:
                self.check_acked(action)
            elif kind is ev.SetTimer:
                self.timers[action.timer_id] = writer
                self.at(action.delay_ms, self.fire, action.timer_id)
            elif kind is ev.WriteMetadata:
                self.at(self.rng.randint(1, 5), self.cas, writer, action)
            elif kind is ev.FailAdds:
                self.stats["failed_adds"] += action.last_entry_id - action.first_entry_id + 1

    def fire(self, timer_id: int) -> None:
        writer = self.timers.pop(timer_id)
        self.carry_out(writer, writer.handle(ev.TimerFired(timer_id, self.now)))

    def cas(self, writer: LedgerWriter, action: ev.WriteMetadata) -> None:
        md, version = self.meta[action.ledger_id]
        if version == action.expected_version:
            self.meta[action.ledger_id] = (action.metadata, version + 1)
            self.stats["metadata_writes"] += 1
            reply = ev.MetadataWritten(action.request_id, action.ledger_id, OK, version + 1,
                                       self.now)
        else:  # never with one writer per ledger; kept for completeness
            reply = ev.MetadataRead(action.request_id, action.ledger_id, OK, md, version,
                                    self.now)
        self.carry_out(writer, writer.handle(reply))

    # -- messages of many ledgers ---------------------------------------------------------
    def flush(self) -> None:
        """End of a client turn: one message per bookie with every part to it."""
        out, self.outbox = self.outbox, {}
        for bookie, parts in out.items():
            self.stats["messages"] += 1
            self.stats["parts"] += len(parts)
            if self.rng.random() >= self.cfg.drop:
                self.at(self.rng.randint(1, 6), self.bookie_receives, bookie, parts)

    def bookie_receives(self, bookie: str, parts: list) -> None:
        entries = [(part.ledger_id, e, record) for _, part in parts
                   for e, record in zip(part.entry_ids, part.datas, strict=True)]
        lost = self.rng.randrange(len(entries)) if self.rng.random() < self.cfg.lost_row else -1
        refused = self.rng.randrange(len(entries)) if self.rng.random() < self.cfg.refuse else -1
        ids, codes = [], []
        for i, (ledger, entry_id, record) in enumerate(entries):
            if i == lost:  # not stored, and no row for it: the reply is a row short
                self.stats["lost_rows"] += 1
                continue
            if i == refused:
                ids.append(entry_id)
                codes.append(BookieUnavailableError.code)
                continue
            self.stored[(bookie, ledger, entry_id)] = record
            ids.append(entry_id)
            codes.append(OK)
        heads = [(part.request_id, part.bookie_id, part.ledger_id, part.entry_ids)
                 for _, part in parts]
        writers = [writer for writer, _ in parts]
        for _ in range(2 if self.rng.random() < self.cfg.dup else 1):
            if self.rng.random() >= self.cfg.drop:
                self.at(self.rng.randint(1, 6), self.reply, writers, heads, ids, codes)

    def reply(self, writers, heads, ids, codes) -> None:
        self.stats["replies"] += 1
        for writer, actions in apply_multi_reply(writers, heads, ids, codes, self.now,
                                                 rows_checked=not self.break_rows):
            self.carry_out(writer, actions)

    # -- the checker ---------------------------------------------------------------------
    def check_acked(self, action: ev.CompleteAdds) -> None:
        ledger = action.ledger_id
        if action.first_entry_id != self.acked[ledger] + 1:
            raise _Violation(f"acked-in-order: ledger {ledger} acknowledged "
                             f"{action.first_entry_id}..{action.last_entry_id} after "
                             f"{self.acked[ledger]}")
        md = self.writer_of[ledger].metadata
        for entry_id in range(action.first_entry_id, action.last_entry_id + 1):
            self.check_copies(ledger, entry_id, md, "at its ack")
        self.acked[ledger] = action.last_entry_id
        self.stats["acked"] += action.last_entry_id - action.first_entry_id + 1

    def check_quorums(self) -> None:
        """Every acknowledged entry on Qa bookies of its write set (the
        final metadata's fragment that holds it)."""
        for ledger, last in self.acked.items():
            md, _ = self.meta[ledger]
            for entry_id in range(last + 1):
                self.check_copies(ledger, entry_id, md, "at the end")

    def check_copies(self, ledger: int, entry_id: int, md: LedgerMetadata, when: str) -> None:
        fragment = [bs for first, bs in md.ensembles if first <= entry_id][-1]
        write_set = WriteSets(fragment, md.write_quorum).of(entry_id)
        record = self.made[(ledger, entry_id)]
        copies = sum(self.stored.get((b, ledger, entry_id)) == record for b in write_set)
        if copies < md.ack_quorum:
            raise _Violation(f"acked-quorum: ledger {ledger} entry {entry_id} acknowledged "
                             f"with {copies} copies on its write set {list(write_set)} "
                             f"(Qa {md.ack_quorum}) {when}")


def run_multi_seed(seed: int, break_rows: bool = False) -> MultiResult:
    sim = MultiSim(random_config(seed), break_rows)
    result = MultiResult(seed)
    try:
        sim.run()
        sim.check_quorums()
    except _Violation as exc:
        result.violation = str(exc)
    result.stats = sim.stats
    result.stats["ensemble_changes"] = sum(w.ensemble_changes for w in sim.writers)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.sim.multisim", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=300)
    parser.add_argument("--first", type=int, default=0, help="first seed (default 0)")
    parser.add_argument("--break-rows", action="store_true",
                        help="take reply rows by position, unmatched (the checker must fail)")
    args = parser.parse_args(argv)
    failures, totals = [], Counter()
    for seed in range(args.first, args.first + args.seeds):
        result = run_multi_seed(seed, args.break_rows)
        totals.update(result.stats)
        if result.violation:
            failures.append(f"seed {seed}: {result.violation} ({random_config(seed)})")
    print(f"{args.seeds} seeds: {len(failures)} violation(s); {dict(totals)}")
    print("\n".join(failures[:10]))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
