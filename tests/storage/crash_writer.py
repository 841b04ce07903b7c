"""The writer side of the kill -9 crash test (runs in a forked child).

It opens the storage, adds batches over a few ledgers, fences ledgers and sets
master keys, forces checkpoints now and then, and appends to an ack log every
(ledger, entry range), fence and key *after* its ticket became durable: that
is exactly what a bookie would have acknowledged.  The parent kills it at a
random moment and checks the ack log against a fresh open.

Ack log lines (``os.write`` with O_APPEND, one write per group of acks)::

    O                  the storage opened (so the next open must be unclean)
    A ledger first last   entries first..last of ledger are durable
    F ledger key_hex      ledger fenced and its master key set, both durable
    D ledger              a doomed ledger's delete is durable (then GC ran: "G logs")
    G removed             entry logs garbage-collected by one reclaim_entry_logs()
                          or give_back_space() (the GC pass: rotation, compaction)
    c                     a compaction starts (a "c" without its "C": killed inside it)
    C compacted copied removed   one compaction: logs rewritten, entries copied, logs removed
    X message             the writer saw something wrong (the test fails)
"""

from __future__ import annotations

import os
import random
import struct

from storage import LedgerStorage

DATA_LEDGERS = (1, 2, 3, 4, 5)
FENCE_LEDGER_BASE = 1_000_000
DOOMED_LEDGER_BASE = 2_000_000_000
DOOMED_ENTRY_BYTES = 2000
_POOL = random.Random(1234).randbytes(1 << 16)
BATCH_ENTRIES_MAX = 48
WINDOW_MAX = 8  # batches in flight before the writer waits


def entry_data(ledger: int, entry: int) -> bytes:
    """Deterministic, varied bytes for (ledger, entry): any mix-up shows."""
    h = (ledger * 0x9E3779B1 + entry * 0x85EBCA77 + 0x165667B1) & 0xFFFF_FFFF
    length = h % 2048
    offset = (h >> 11) % (len(_POOL) - 2048)
    return struct.pack("<QQ", ledger, entry) + _POOL[offset:offset + length]


def fence_key(ledger: int) -> bytes:
    return struct.pack("<Q", ledger) * 2


class Writer:
    def __init__(self, st: LedgerStorage, ack_fd: int, seed: int):
        self.st, self.ack_fd, self.rng = st, ack_fd, random.Random(seed)
        self.next_entry = {led: st.last_entry_id(led) + 1 if st.ledger_exists(led) else 0
                           for led in DATA_LEDGERS}
        self.pending: list[tuple[int, list[str]]] = []

    def step(self) -> None:
        roll = self.rng.random()
        if roll < 0.03:
            self.st.checkpoint()
        elif roll < 0.06:
            self.fence_new_ledger()
        elif roll < 0.075:
            self.doom_a_ledger()
        elif roll < 0.085:
            self.doom_mixed()
        elif roll < 0.10:
            self.compact()
        elif roll < 0.105:  # BP-32 advisory close: rotates the ledger's log (per-ledger mode)
            self.st.write_close(self.rng.choice(DATA_LEDGERS))
        else:
            self.add_batch()
        if len(self.pending) >= WINDOW_MAX:
            self.st.wait_durable(self.pending[0][0], timeout_s=30)
        self.ack_durable()

    def add_batch(self, doomed: int | None = None, doomed_first: int = 0) -> int:
        """One batch over the data ledgers (and, with ``doomed``, as many
        entries of that ledger in the same block); returns doomed entries added."""
        count = self.rng.randint(1, BATCH_ENTRIES_MAX)
        ledgers, entries, datas, ranges = [], [], [], {}
        extra = count if doomed is not None else 0
        ledgers += [doomed] * extra
        entries += list(range(doomed_first, doomed_first + extra))
        datas += [bytes(DOOMED_ENTRY_BYTES)] * extra
        for _ in range(count):
            led = self.rng.choice(DATA_LEDGERS)
            entry = self.next_entry[led]
            self.next_entry[led] = entry + 1
            ledgers.append(led)
            entries.append(entry)
            datas.append(entry_data(led, entry))
            first, _last = ranges.get(led, (entry, entry))
            ranges[led] = (first, entry)
        ticket = self.st.add_entries(ledgers, entries, datas)
        self.pending.append((ticket, [f"A {led} {a} {b}" for led, (a, b) in ranges.items()]))
        return extra

    def doom_mixed(self) -> None:
        """A doomed ledger written in the same blocks as the data ledgers, then
        deleted: entry logs that are half garbage, for compaction to rewrite."""
        led = DOOMED_LEDGER_BASE + self.rng.randrange(1 << 30)
        added = 0
        for _ in range(self.rng.randint(5, 40)):
            added += self.add_batch(doomed=led, doomed_first=added)
            if len(self.pending) >= WINDOW_MAX:
                self.st.wait_durable(self.pending[0][0], timeout_s=30)
            self.ack_durable()
        self.pending.append((self.st.delete_ledger(led), [f"D {led}"]))

    def compact(self) -> None:
        os.write(self.ack_fd, b"c\n")
        result = self.st.compact(major=self.rng.random() < 0.7,
                                 rotate_active=self.rng.random() < 0.5)
        if result["logs_failed"]:  # a log it had to copy was damaged or missing
            os.write(self.ack_fd, f"X compaction failed on {result['logs_failed']} logs "
                                  f"(a missing or damaged entry log)\n".encode())
        os.write(self.ack_fd, (f"C {result['logs_compacted']} {result['entries_copied']} "
                               f"{result['logs_removed']}\n").encode())

    def fence_new_ledger(self) -> None:
        led = FENCE_LEDGER_BASE + self.rng.randrange(1 << 30)
        self.st.set_master_key(led, fence_key(led))
        ticket = self.st.fence(led)
        self.pending.append((ticket, [f"F {led} {fence_key(led).hex()}"]))

    def doom_a_ledger(self) -> None:
        """Write a ledger over two entry logs' worth of bytes (so at least one
        log holds nothing else), delete it, checkpoint and collect garbage
        (half the time as the bookie's GC pass does, ``give_back_space``):
        the parent checks that no acknowledged entry of the data ledgers went
        with it and that the delete, once durable, stays."""
        led = DOOMED_LEDGER_BASE + self.rng.randrange(1 << 30)
        per_batch = max(1, self.st.options.add_batch_bytes_max // (DOOMED_ENTRY_BYTES + 64))
        total = 2 * self.st.options.entry_log_rotate_bytes // DOOMED_ENTRY_BYTES + per_batch
        data = bytes(DOOMED_ENTRY_BYTES)
        for first in range(0, total, per_batch):
            ids = list(range(first, min(total, first + per_batch)))
            self.st.add_entries([led] * len(ids), ids, [data] * len(ids))
        self.pending.append((self.st.delete_ledger(led), [f"D {led}"]))
        if self.rng.random() < 0.5:
            # the bookie GC pass's way: the active log (holding the doomed
            # tail) rotated, a checkpoint, removal, a minor compaction started
            removed = self.st.give_back_space(1)["logs_removed"]
        else:
            self.st.checkpoint()
            removed, _ = self.st.reclaim_entry_logs()
        os.write(self.ack_fd, f"G {len(removed)}\n".encode())

    def ack_durable(self) -> None:
        durable = self.st.durable_ticket
        lines = []
        while self.pending and self.pending[0][0] <= durable:
            lines.extend(self.pending.pop(0)[1])
        if lines:
            os.write(self.ack_fd, ("\n".join(lines) + "\n").encode())


def run_writer(journal_dir, ledger_dir, options, ack_path: str, seed: int,
               steps_max: int = 100_000) -> None:
    """Child body: never returns normally before being killed (bounded anyway)."""
    ack_fd = os.open(ack_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    st = LedgerStorage.open("bookie-1", journal_dir, ledger_dir, options)
    os.write(ack_fd, b"O\n")
    writer = Writer(st, ack_fd, seed)
    for _ in range(steps_max):
        writer.step()
    os.write(ack_fd, b"X writer ran out of steps before being killed\n")


def run_no_journal_writer(journal_dir, ledger_dir, options, ack_path: str, seed: int,
                          steps_max: int = 100_000) -> None:
    """journal_write_data=false: only entries covered by a flush() are acknowledged."""
    ack_fd = os.open(ack_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    st = LedgerStorage.open("bookie-1", journal_dir, ledger_dir, options)
    os.write(ack_fd, b"O\n")
    writer = Writer(st, ack_fd, seed)
    for step in range(steps_max):
        writer.add_batch()
        if step % 8 == 5:  # adds after a checkpoint must be found past its entry-log mark
            st.checkpoint()
        if step % 4 == 3:
            st.flush()
            lines = [line for _t, group in writer.pending for line in group]
            writer.pending.clear()
            os.write(ack_fd, ("\n".join(lines) + "\n").encode())
    os.write(ack_fd, b"X writer ran out of steps before being killed\n")
