"""kill -9 crash test: a forked writer adds, fences and checkpoints while
logging every acknowledgement; it is SIGKILLed at a random moment (during
start-up/recovery, right after open, once a compaction started, or after a
random number of acks, polled at a random interval); a fresh open must hold every acknowledged entry
byte-identical, every acknowledged fence and master key, and report the
unclean shutdown.  The same directories carry over from one crash point to
the next, so recoveries of recoveries are exercised too.

``BK_CRASH_POINTS`` (default 200) and ``BK_CRASH_SEED`` scale/replay it
locally; ``BK_CRASH_POINTS_NO_JOURNAL`` (default 20) for the BP-46 mode.

The directories are on an ext4 file system of the test's own, in memory
when run as root with room in /dev/shm (``tests.support.small_fs``): the
fsyncs of the writers (about 180 a crash point) then cost no disk time,
and O_DIRECT and fsync are ext4's as on a disk (a kill -9 loses no page
cache either way); else under ``tmp_path``.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import traceback
from pathlib import Path

import pytest

from appliance.errors import CorruptRecordError
from storage import LedgerStorage, compaction
from tests.support.launch import ForkedChild, fork_child, stop_process, wait_for
from tests.support.small_fs import SmallFsError, ext4_fs

from . import crash_writer as cw
from .conftest import small_options

KiB = 1024
CRASH_POINTS = int(os.environ.get("BK_CRASH_POINTS", "200"))
NO_JOURNAL_POINTS = int(os.environ.get("BK_CRASH_POINTS_NO_JOURNAL", "20"))
FULL_CHECK_EVERY = 25
MUTATION_POINTS_MAX = 150  # the mutation must be caught within this many points
ACK_WAIT_S = 60.0
CRASH_FS_MB = 256  # a 200-point run leaves about 20 MB


# BP-32: both entry-log managers share the points (CI time): the interleaved
# one gets the odd one out.  Per-ledger: 5 open logs for the 5 data ledgers,
# so their logs stay open across checkpoints (the mark rule matters) and cap
# rotations come when a doomed 6th ledger is written; 16 KiB buffers
# (oversized blocks); 50 ms idle expiry (the checkpointer's ticks rotate logs
# between checkpoints); the writer also sends write-closes.
PER_LEDGER = dict(entry_log_per_ledger=True, entry_logs_open_max=5,
                  entry_log_ledger_buffer_bytes=16 * KiB, entry_log_idle_ms=50)
MODES = {"interleaved": {}, "per_ledger": PER_LEDGER}


def _points(total: int, mode: str) -> int:
    """Kill points per entry-log mode: ``BK_CRASH_POINTS`` each (the issue's
    floor of 200 holds for both modes, compaction included)."""
    return total


def crash_options(**overrides):
    # Small files so segment rolls, log rotations and checkpoints happen within a
    # crash point; an entry-log buffer bigger than a batch so acknowledged entries
    # often exist only in the journal when the kill lands.
    base = dict(journal_segment_bytes=256 * KiB, entry_log_rotate_bytes=768 * KiB,
                entry_log_buffer_bytes=256 * KiB, checkpoint_interval_s=0.2,
                checkpoint_bytes=600 * KiB, journal_group_wait_us=100,
                entry_log_rotate_garbage_bytes=64 * KiB)  # the GC pass rotates
    base.update(overrides)
    return small_options(**base)


@pytest.fixture
def crash_dir(tmp_path) -> Path:
    """Where a crash test's directories go (see the module docstring)."""
    with contextlib.ExitStack() as stack:
        yield _memory_fs(stack, tmp_path)


def _memory_fs(stack: contextlib.ExitStack, tmp_path: Path) -> Path:
    if os.geteuid() != 0:
        return tmp_path
    try:
        return stack.enter_context(ext4_fs(tmp_path, CRASH_FS_MB, mount_name="fs"))
    except SmallFsError as exc:  # no loop device, no mkfs.ext4: the same test, slower
        print(f"crash test directories under {tmp_path}: {exc}")
        return tmp_path


class AckBook:
    """What the killed writers acknowledged, parsed from the ack log."""

    def __init__(self, path: str):
        self.path = path
        self.offset = 0
        self.max_acked: dict[int, int] = {}
        self.fences: dict[int, bytes] = {}
        self.deleted: set[int] = set()
        self.logs_removed = 0
        self.compactions = {"runs": 0, "logs": 0, "entries": 0, "removed": 0,
                            "killed_inside": 0}

    def lines(self) -> int:
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            return f.read().count(b"\n")

    def saw(self, line: bytes, prefix: bool = False) -> bool:
        """True once this point's writer wrote ``line`` (a whole line, or a
        line starting with it)."""
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            return (b"\n" + f.read()).find(b"\n" + line + (b"" if prefix else b"\n")) >= 0

    def consume(self) -> tuple[list[tuple[int, int, int]], list[int], bool]:
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        complete = chunk[:chunk.rfind(b"\n") + 1]
        self.offset += len(complete)
        if len(complete) < len(chunk):
            # kill -9 can cut a multi-page write(2) short: drop the torn line so
            # the next writer's lines start on a line of their own (the torn
            # acks go unchecked, which only makes the check weaker, never wrong)
            os.truncate(self.path, self.offset)
        ranges, fences, opened = [], [], False
        compacting = False
        for line in complete.decode().splitlines():
            kind, *rest = line.split(" ", 1)
            if kind == "X":
                pytest.fail(f"writer reported: {rest}")
            if kind == "O":
                opened = True
            elif kind == "A":
                led, a, b = map(int, rest[0].split())
                ranges.append((led, a, b))
                self.max_acked[led] = max(self.max_acked.get(led, -1), b)
            elif kind == "D":
                self.deleted.add(int(rest[0]))
            elif kind == "G":
                self.logs_removed += int(rest[0])
            elif kind == "c":
                compacting = True
            elif kind == "C":
                compacting = False
                logs, entries, removed = map(int, rest[0].split())
                self.compactions["runs"] += 1
                self.compactions["logs"] += logs
                self.compactions["entries"] += entries
                self.compactions["removed"] += removed
            elif kind == "F":
                led_s, key = rest[0].split()
                self.fences[int(led_s)] = bytes.fromhex(key)
                fences.append(int(led_s))
        self.compactions["killed_inside"] += compacting
        return ranges, fences, opened


def _check_range(st, led: int, first: int, last: int, where: str) -> None:
    for lo in range(first, last + 1, 65536):
        hi = min(last, lo + 65535)
        got = st.read_entries(led, lo, hi)
        for entry, data in zip(range(lo, hi + 1), got, strict=True):
            assert data == cw.entry_data(led, entry), f"{where}: ledger {led} entry {entry}"


def _verify(st, book: AckBook, ranges, fences, rng, full: bool, where: str) -> None:
    for led, a, b in ranges:
        _check_range(st, led, a, b, where)
    for led in fences:
        assert st.is_fenced(led) and st.get_master_key(led) == book.fences[led], where
    for led in book.deleted:  # a durable delete stays deleted
        assert not st.ledger_exists(led), f"{where}: deleted ledger {led} is back"
    if full:
        for led, top in book.max_acked.items():  # every entry up to the top: no gaps
            _check_range(st, led, 0, top, where)
        for led, key in book.fences.items():
            assert st.is_fenced(led) and st.get_master_key(led) == key, where
        return
    for _ in range(50):  # a sample of older acknowledgements
        if book.max_acked:
            led = rng.choice(sorted(book.max_acked))
            entry = rng.randint(0, book.max_acked[led])
            assert st.read_entry(led, entry) == cw.entry_data(led, entry), where


def _kill_point(child: ForkedChild, book: AckBook, rng: random.Random,
                compacts: bool) -> None:
    """Wait for the chosen moment (polling, never sleeping blind); the caller
    then SIGKILLs the child."""
    choice = rng.random()
    interval_s = rng.uniform(0.0002, 0.003)

    def child_gone() -> bool:  # without reaping it, so the pid cannot be reused
        return child.poll() is not None

    if choice < 0.1:
        pass  # during start-up / recovery
    elif choice < 0.2:
        wait_for(lambda: book.lines() >= 1 or child_gone(), ACK_WAIT_S, interval_s, "open")
    elif choice < 0.3 and compacts:  # inside a compaction (copy, switch, checkpoint, removal)
        wait_for(lambda: book.saw(b"c") or child_gone(), ACK_WAIT_S, interval_s,
                 "a compaction")
    elif choice < 0.35 and compacts:  # right after one: logs removed, copies maybe in buffers
        wait_for(lambda: book.saw(b"C ", prefix=True) or child_gone(), ACK_WAIT_S,
                 interval_s, "a compaction's end")
    else:
        target = rng.randint(2, 30)
        wait_for(lambda: book.lines() >= target or child_gone(), ACK_WAIT_S, interval_s,
                 f"{target} ack lines")


def _writer_main(body, journal_dir, ledger_dir, options, ack_path: str, seed: int) -> None:
    """The forked child's body: a failure is logged as an ``X`` line for the test."""
    try:
        body(journal_dir, ledger_dir, options, ack_path, seed)
    except BaseException:
        with open(ack_path, "a") as f:
            f.write("X " + traceback.format_exc().replace("\n", " | ") + "\n")
        raise


def _run_crash_points(dirs, points: int, body, options, seed: int, tmp_path) -> AckBook:
    rng = random.Random(seed)
    book = AckBook(str(tmp_path / "acks.log"))
    open(book.path, "w").close()
    for point in range(points):
        where = f"seed {seed} crash point {point}"
        child = fork_child(_writer_main, body, *dirs, options, book.path,
                           rng.randrange(1 << 30))
        try:
            _kill_point(child, book, rng, body is cw.run_writer)
        finally:
            stop_process(child, ACK_WAIT_S, signal.SIGKILL)
        ranges, fences, opened = book.consume()
        st = LedgerStorage.open("bookie-1", *dirs, options)
        try:
            if opened:
                assert not st.clean_shutdown_before, where
            full = point % FULL_CHECK_EVERY == FULL_CHECK_EVERY - 1 or point == points - 1
            _verify(st, book, ranges, fences, rng, full, where)
        finally:
            st.close() if rng.random() < 0.5 else st.abort()
    assert sum(book.max_acked.values()) > points, "the writers acknowledged almost nothing"
    return book


def _seed() -> int:
    return int(os.environ.get("BK_CRASH_SEED") or random.randrange(1 << 31))


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.timeout(max(300, 2 * CRASH_POINTS))  # scaled up runs (BK_CRASH_POINTS) get time
def test_kill_9_loses_no_acknowledged_entry(tmp_path, crash_dir, mode):
    dirs = (crash_dir / "journal", crash_dir / "ledgers")
    options = crash_options(**MODES[mode])
    LedgerStorage.format("bookie-1", *dirs, options)
    book = _run_crash_points(dirs, _points(CRASH_POINTS, mode), cw.run_writer, options,
                             _seed(), tmp_path)
    # garbage collection and compaction ran between the kills (doomed ledgers,
    # some written in the same blocks as the data ledgers), so "no loss" also
    # covers crashes around deletes, checkpoints, copies and log removals
    assert book.deleted and book.logs_removed > 0, (len(book.deleted), book.logs_removed)
    assert book.compactions["entries"] > 0 and book.compactions["removed"] > 0, \
        book.compactions
    print(f"crash test ({mode}): {_points(CRASH_POINTS, mode)} points, "
          f"{len(book.deleted)} durable deletes, "
          f"{book.logs_removed} logs collected, compactions {book.compactions}")


def test_the_crash_test_catches_removing_a_log_before_the_switch_is_durable(
        tmp_path, crash_dir, monkeypatch):
    """The mutation: compaction removes the old log before the checkpoint that
    makes the switched index durable.  A kill in that window must show up as
    lost acknowledged entries (the snapshot points into a missing log)."""
    monkeypatch.setattr(compaction, "REMOVE_BEFORE_CHECKPOINT", True)  # inherited by fork
    dirs = (crash_dir / "journal", crash_dir / "ledgers")
    options = crash_options()
    LedgerStorage.format("bookie-1", *dirs, options)
    # the check finds the loss, or the next writer's compaction trips over the
    # missing log (reported as an X line: pytest.fail)
    with pytest.raises((AssertionError, CorruptRecordError, pytest.fail.Exception)) as caught:
        _run_crash_points(dirs, MUTATION_POINTS_MAX, cw.run_writer, options, _seed(), tmp_path)
    assert "missing" in str(caught.value) or "ledger" in str(caught.value), caught.value
    print(f"mutation caught: {str(caught.value).splitlines()[0][:200]}")


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.timeout(max(300, 2 * NO_JOURNAL_POINTS))
def test_kill_9_without_journaled_data_keeps_flushed_entries(tmp_path, crash_dir, mode):
    dirs = (crash_dir / "journal", crash_dir / "ledgers")
    options = crash_options(journal_write_data=False, **MODES[mode])
    LedgerStorage.format("bookie-1", *dirs, options)
    _run_crash_points(dirs, _points(NO_JOURNAL_POINTS, mode), cw.run_no_journal_writer,
                      options, _seed(), tmp_path)


def test_ack_book_drops_a_line_torn_by_the_kill(tmp_path):
    """kill -9 may cut the writer's last write(2) short; the next writer's
    lines must not be glued to the torn one (it read '1980O' once)."""
    book = AckBook(str(tmp_path / "acks.log"))
    with open(book.path, "wb") as f:
        f.write(b"O\nA 1 0 5\nA 1 6 19")  # torn: no newline
    assert book.consume() == ([(1, 0, 5)], [], True)
    with open(book.path, "ab") as f:
        f.write(b"O\nA 1 6 9\n")  # the next writer
    assert book.consume() == ([(1, 6, 9)], [], True)
    assert book.max_acked == {1: 9}
