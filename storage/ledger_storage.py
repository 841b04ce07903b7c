"""LedgerStorage: one bookie's local storage as a library (no network).

Guarantees (``journal_write_data = true``, the default):

* An add (or a batch from ``add_entries``) returns a ticket; once
  ``durable_ticket >= ticket`` (``wait_durable``, a callback, or
  ``durable_fd`` becoming readable) the entries survive a crash of the
  process or the machine: the journal record holding them was fdatasync'ed.
  Only then may the bookie acknowledge them.
* Fence, master-key, limbo, explicit-LAC and delete changes are journaled;
  a fence/master-key/limbo ticket is durable under the same rule.
* Reads return exactly the bytes added, or raise: ``NoSuchLedgerError``,
  ``NoSuchEntryError``, ``CorruptRecordError`` (a checksum or header check
  failed); never wrong bytes.
* ``close()`` checkpoints and leaves a clean marker; the next ``open()``
  reports ``clean_shutdown_before`` (False after a crash: BP-46 then fences
  and limbos the bookie's non-closed ledgers).

With ``journal_write_data = false`` (BP-46) adds skip the journal: an add's
ticket is the last journaled state change's, so it completes as soon as the
preceding fence/key/limbo records are durable.  An acknowledged entry is then
*not* durable: a process crash loses entries still in the entry-log write
buffer (up to ``entry_log_buffer_bytes``), a power loss loses every entry
added since the last ``flush()``/checkpoint.  Fence and key changes stay
journaled.  The bookie must use limbo after an unclean shutdown.

Threads: callers may use any thread (a lock serialises them; the intended
user is one event loop); the journal writes from its own thread and a
checkpointer thread runs ``checkpoint()`` every ``checkpoint_interval_s``
or after ``checkpoint_bytes`` of adds.

Where it lives: this module is the facade (open and format, the add path,
durability tickets, close, stats); its other responsibilities are mixins,
one module each: ``state_ops`` (fence, master key, limbo, explicit LAC,
delete), ``read_ops`` (reads), ``checkpoint_ops`` (checkpoints, ``flush``,
the checkpointer thread), ``space_ops`` (entry-log GC, compaction, disk
usage).  The add path stays here, in one class, with no extra call per add.
"""

from __future__ import annotations

import heapq
import os
import threading

import numpy as np

from appliance.protocol import limits
from appliance.protocol.errors import BookieIOError, ClientClosedError, TooManyRequestsError

from . import aligned_io as aio
from . import journal_scan as js
from . import storage_files as sf
from .checkpoint_ops import CheckpointOps
from .codec import (
    BLOCK_HEADER_BYTES,
    RECORD_HEADER_BYTES,
    build_block,
    build_ledger_block,
)
from .compaction import Compactor
from .entry_log_per_ledger import split_by_ledger
from .index import Index
from .options import StorageOptions
from .read_ops import ReadOps
from .recovery import unique_ledger_bytes
from .space_ops import SpaceOps
from .state_ops import StateOps

_SEQ = (list, tuple)
SMALL_BATCH_ENTRIES = 32  # up to this many entries, plain Python beats numpy's per-call cost


class LedgerStorage(StateOps, ReadOps, SpaceOps, CheckpointOps):
    """See the module docstring.  Build with ``format`` once, then ``open``."""

    @classmethod
    def format(cls, bookie_id: str, journal_dir, ledger_dir,
               options: StorageOptions | None = None, force: bool = False) -> None:
        """Write cookies and an empty index; refuses non-empty dirs unless force."""
        sf.format_dirs(bookie_id, str(journal_dir), str(ledger_dir),
                       (options or StorageOptions()).validate(), force)

    @classmethod
    def open(cls, bookie_id: str, journal_dir, ledger_dir,
             options: StorageOptions | None = None, *, reserve: bool = True) -> LedgerStorage:
        """Verify cookies, replay, checkpoint if anything was replayed.  On a
        disk too full for that, the directories' RESERVE room is given back
        and the open tried once more (``reserves_released`` is then True:
        the caller should not take writes)."""
        self = cls.__new__(cls)
        self._init(bookie_id, str(journal_dir), str(ledger_dir),
                   (options or StorageOptions()).validate())
        try:
            if sf.recover_into(self, reserve=reserve):
                self.checkpoint()
        except BaseException as exc:
            self._release_after_failed_open()
            if not reserve or not aio.out_of_space(exc) or \
                    not cls._release_reserves(journal_dir, ledger_dir):
                raise
            self = cls.open(bookie_id, journal_dir, ledger_dir, options, reserve=False)
            self.reserves_released = True
            return self
        self._start_checkpointer()
        return self

    @staticmethod
    def _release_reserves(journal_dir, ledger_dir) -> int:
        """Give both directories' RESERVE room back (a full disk); the bytes."""
        return sum(sf.release_reserve(str(d)) for d in (journal_dir, ledger_dir))

    def restore_reserves(self) -> bool:
        """Take the RESERVE room again once the disk has room (after a
        reopen gave it back); True when both directories hold theirs."""
        return all(sf.ensure_reserve(d) for d in (self.journal_dir, self.ledger_dir))

    def reopen(self) -> None:
        """After a failure, in this process: what a restart would do.  The
        journal and entry logs are dropped as a crash drops them (nothing
        unsynced is kept), then the directories are opened again (cookies,
        replay, checkpoint), so the index holds exactly what is durable.
        Meant for a disk that was full (``out_of_space``) and has room again;
        the caller must first fail every reply that waits for a ticket of
        the old journal (tickets start again from the last durable one).
        Other threads meanwhile wait on the storage lock or get
        ``ClientClosedError``.  Raises as ``open`` does; the storage is then
        still failed, and may be reopened again."""
        with self._lock:
            self._closing = True  # adds and state changes refuse from here on
        self._stop_checkpointer()
        counters, compaction = self.counters, self.compaction_status()
        with self._checkpoint_lock, self._lock:
            if not self._closed:
                self._closed = True
                self._shutdown(keep_unsynced=False)
                sf.release_locks(self)
            self._init(self.bookie_id, self.journal_dir, self.ledger_dir, self.options)
            self.counters.update(counters, reopens=counters.get("reopens", 0) + 1)
            self._compactor.status.update(  # tickets of bkctl bookie compact stay valid
                {k: v for k, v in compaction.items() if k not in ("running", "progress")})
            try:
                self._release_reserves(self.journal_dir, self.ledger_dir)  # room to reopen in
                if sf.recover_into(self, reserve=False):
                    self._checkpoint_locked()
            except BaseException as exc:
                self._failure = exc
                self._release_after_failed_open()
                raise
        self._start_checkpointer()

    def failure(self) -> BaseException | None:
        """Why the storage refuses writes (None: it does not).  A failure that
        ``aligned_io.out_of_space`` calls a full disk ends with ``reopen``."""
        journal, logs = self._journal, self._logs
        return self._failure or (journal.failure() if journal is not None else None) or \
            (logs.failure() if logs is not None else None)

    def _init(self, bookie_id: str, journal_dir: str, ledger_dir: str,
              options: StorageOptions) -> None:
        self.bookie_id = bookie_id
        self.journal_dir, self.ledger_dir = journal_dir, ledger_dir
        self.options = options
        # a block of at most this many bytes is one chunk (see _chunks)
        self._small_block_limit = min(options.add_batch_bytes_max,
                                      options.entry_log_buffer_bytes) - 64
        # kept by reopen(): other threads may be waiting on them
        self._lock = getattr(self, "_lock", None) or threading.RLock()
        self._index = Index()
        self._journal = None
        self._logs = None
        self._lock_fds: list[int] = []
        self._seq = 0
        self._journal_seq = 0
        self._callbacks: list = []
        self._closed = False
        self._closing = False  # close() is checkpointing: no more changes
        # one checkpoint at a time; taken before _lock
        self._checkpoint_lock = getattr(self, "_checkpoint_lock", None) or threading.Lock()
        self._failure: BaseException | None = None
        # (ledger ids, entry-log mark log) of the last snapshot written: GC input.
        self._persisted: tuple[frozenset, int] = (frozenset(), 0)
        # Entry logs compaction emptied (no index entry points into them), and
        # those of them the snapshot on disk names: only these are removed.
        self._garbage: set[int] = set()
        self._persisted_garbage: set[int] = set()
        self._compactor = Compactor(self)
        self._disk_cache: tuple[float, dict] | None = None
        self._bytes_since_checkpoint = 0
        self._checkpoint_wake = threading.Event()
        self._checkpointer = None
        self.clean_shutdown_before = False
        self.possible_loss_reasons: list[str] = []  # BP-46: why data may be gone (open)
        self.fresh = False  # holds nothing and never did since format
        self.reserves_released = False  # open needed the RESERVE room: the disk is full
        self.instance_id = ""
        self.recovery_stats: dict = {}
        self.counters = {"adds": 0, "add_batches": 0, "reads": 0, "checkpoints": 0,
                         "checkpoint_s_total": 0.0, "snapshot_bytes": 0,
                         "write_closes": 0}

    # -- adds ------------------------------------------------------------------
    def add_entry(self, ledger_id: int, entry_id: int, data: bytes | memoryview) -> int:
        return self.add_entries([ledger_id], [entry_id], [data])

    def add_entries(self, ledger_ids, entry_ids, datas) -> int:
        """Add a batch; returns one ticket covering all of it."""
        datas = datas if isinstance(datas, list) else list(datas)
        lengths = self._one_ledger_small(ledger_ids, entry_ids, datas)
        if lengths is not None:
            return self._add_one_ledger_small(ledger_ids[0], list(entry_ids), datas, lengths)
        ledgers, entries, lengths = self._validate_batch(ledger_ids, entry_ids, datas)
        with self._lock:
            self._check_usable()
            groups = [(ledgers, entries, datas, lengths)]
            if self.options.entry_log_per_ledger:  # BP-32: a block per ledger, each its own seq
                groups = split_by_ledger(ledgers, entries, datas, lengths)
            blocks = 0
            for g_ledgers, g_entries, g_datas, g_lengths in groups:
                for lo, hi in self._chunks(g_lengths):
                    self._add_chunk(g_ledgers[lo:hi], g_entries[lo:hi], g_datas[lo:hi],
                                    g_lengths[lo:hi])
                    blocks += 1
            if blocks > 1 and self.options.journal_write_data:
                self._journal.request_flush()  # the batch is whole: its last block waits for no one
            self.counters["adds"] += len(datas)
            self.counters["add_batches"] += 1
            if self._bytes_since_checkpoint >= self.options.checkpoint_bytes:
                self._checkpoint_wake.set()
            return self._journal_seq

    def _one_ledger_small(self, ledger_ids, entry_ids, datas) -> list[int] | None:
        """The lengths of ``datas`` if the batch can take the small path: a
        few entries (lists or tuples) of one ledger, ids in range, one block
        that fits the limits without chunking; else None (the general path
        then validates and raises exactly as before)."""
        n = len(datas)
        if not (0 < n <= SMALL_BATCH_ENTRIES and type(ledger_ids) in _SEQ
                and type(entry_ids) in _SEQ and len(ledger_ids) == n and len(entry_ids) == n):
            return None
        ledger_id = ledger_ids[0]
        if type(ledger_id) is not int or not 0 <= ledger_id <= limits.LEDGER_ID_MAX \
                or (n > 1 and ledger_ids.count(ledger_id) != n):
            return None
        if not all(type(e) is int for e in entry_ids) or min(entry_ids) < 0 \
                or max(entry_ids) > limits.ENTRY_ID_MAX:
            return None
        lengths = list(map(len, datas))
        if max(lengths) > self.options.record_bytes_max or \
                sum(lengths) + RECORD_HEADER_BYTES * n > self._small_block_limit:
            return None
        return lengths

    def _add_one_ledger_small(self, ledger_id: int, entry_ids: list, datas: list,
                              lengths: list) -> int:
        """``add_entries`` of a batch ``_one_ledger_small`` accepted: the same
        block, journal record, entry-log append and index rows as the general
        path (one chunk, one ledger), with plain lists instead of numpy (a
        few entries per message is the usual case at low load; numpy's
        per-call cost was most of this call then)."""
        with self._lock:
            self._check_usable()
            self._seq += 1
            seq = self._seq
            block, offsets = build_ledger_block(seq, ledger_id, entry_ids, datas, lengths)
            log_id, base = self._write_block(seq, block)
            block_len = len(block)
            self._index.put_ledger_small(ledger_id, entry_ids, log_id,
                                         [base + off for off in offsets], lengths)
            self._logs.note_ledger_bytes(log_id, ledger_id, block_len - BLOCK_HEADER_BYTES)
            self._index.ledgers[ledger_id].add_seq = seq
            self._bytes_since_checkpoint += block_len
            counters = self.counters
            counters["adds"] += len(datas)
            counters["add_batches"] += 1
            if self._bytes_since_checkpoint >= self.options.checkpoint_bytes:
                self._checkpoint_wake.set()
            return self._journal_seq

    def _validate_batch(self, ledger_ids, entry_ids, datas):
        n = len(datas)
        if 0 < n <= SMALL_BATCH_ENTRIES and isinstance(ledger_ids, list | tuple) \
                and isinstance(entry_ids, list | tuple) and len(ledger_ids) == n \
                and len(entry_ids) == n:
            return self._validate_small(ledger_ids, entry_ids, datas)
        ledgers = np.asarray(ledger_ids, dtype=np.int64).reshape(-1)
        entries = np.asarray(entry_ids, dtype=np.int64).reshape(-1)
        if n == 0 or len(ledgers) != n or len(entries) != n:
            raise ValueError(f"add_entries needs equal, non-empty ledger_ids, entry_ids and "
                             f"datas (got {len(ledgers)}, {len(entries)}, {n})")
        if ledgers.min() < 0 or entries.min() < 0:
            raise ValueError("ledger_ids and entry_ids must be non-negative")
        lengths = np.fromiter(map(len, datas), np.int64, n)
        if lengths.max() > self.options.record_bytes_max:
            raise ValueError(f"record of {int(lengths.max())} bytes exceeds entry_bytes_max "
                             f"plus header and digest ({self.options.record_bytes_max})")
        return ledgers.astype(np.uint64), entries.astype(np.uint64), lengths

    def _validate_small(self, ledger_ids, entry_ids, datas):
        """``_validate_batch`` for a few entries: the same checks without
        numpy's per-call cost (one add per message is common at low load)."""
        lengths = list(map(len, datas))
        if min(ledger_ids) < 0 or min(entry_ids) < 0:
            raise ValueError("ledger_ids and entry_ids must be non-negative")
        if max(lengths) > self.options.record_bytes_max:
            raise ValueError(f"record of {max(lengths)} bytes exceeds entry_bytes_max "
                             f"plus header and digest ({self.options.record_bytes_max})")
        return (np.array(ledger_ids, np.int64).astype(np.uint64),  # int64 first: the
                np.array(entry_ids, np.int64).astype(np.uint64),   # same overflow errors
                np.array(lengths, np.int64))

    def _chunks(self, lengths: np.ndarray):
        """Blocks of at most ``add_batch_bytes_max`` and, unless one entry is
        bigger, at most the entry-log buffer: a block that does not fit it is
        written synchronously from a fresh buffer on the caller's thread
        (64 KB entries in 8 MB batches spent 70% of a bookie's time there)."""
        opts = self.options
        limit = min(opts.add_batch_bytes_max, opts.entry_log_buffer_bytes) - 64
        if int(np.add.reduce(lengths)) + RECORD_HEADER_BYTES * len(lengths) <= limit:
            yield 0, len(lengths)
            return
        sizes = lengths + RECORD_HEADER_BYTES
        lo, acc = 0, 0
        for i, size in enumerate(sizes.tolist()):
            if acc + size > limit and i > lo:
                yield lo, i
                lo, acc = i, 0
            acc += size
        yield lo, len(lengths)

    def _add_chunk(self, ledgers, entries, datas, lengths) -> None:
        self._seq += 1
        seq = self._seq
        block, offsets = build_block(seq, ledgers, entries, datas, lengths)
        log_id, base = self._write_block(seq, block)
        self._index_block(ledgers, entries, log_id, offsets + base, lengths, len(block))

    def _write_block(self, seq: int, block) -> tuple[int, int]:
        """Holding the lock: journal ``block`` (when data is journaled) and
        append it to the entry log; (log id, offset).  A failed append stops
        writes (the entry log is broken)."""
        if self.options.journal_write_data:
            self._journal.submit(seq, js.ADD, block, self_verifying=True)
            self._journal_seq = seq
        try:
            return self._logs.append_block(block)
        except BaseException as exc:  # the entry log is broken: stop taking writes
            self._failure = exc
            raise

    def _append_unjournaled(self, ledgers, entries, datas, lengths) -> None:
        """Compaction's copies: a block with a fresh seq in the entry log only
        (the caller holds the lock; see ``storage.compaction``)."""
        self._seq += 1
        block, offsets = build_block(self._seq, ledgers, entries, datas, lengths)
        try:
            log_id, base = self._logs.append_block(block)
        except BaseException as exc:
            self._failure = exc
            raise
        self._index_block(ledgers, entries, log_id, offsets + base, lengths, len(block),
                          activity=False)

    def _index_block(self, ledgers, entries, log_id, offsets, lengths, block_len,
                     activity: bool = True) -> None:
        """Point the index at a block's records; ``activity``: an add (not a
        compaction copy), which ``delete_ledger_if_idle`` must see."""
        self._index.put_batch(ledgers, entries, log_id, offsets, lengths)
        ledger_rows = self._index.ledgers
        seq = self._seq if activity else None
        if ledgers[0] == ledgers[-1] and (len(ledgers) < 3 or ledgers.min() == ledgers.max()):
            # one ledger: its bytes are the block's records (as unique_ledger_bytes counts)
            self._logs.note_ledger_bytes(log_id, int(ledgers[0]), block_len - BLOCK_HEADER_BYTES)
            if seq is not None:
                ledger_rows[int(ledgers[0])].add_seq = seq
        else:
            for ledger_id, nbytes in unique_ledger_bytes(ledgers, lengths + RECORD_HEADER_BYTES):
                self._logs.note_ledger_bytes(log_id, ledger_id, nbytes)
                if seq is not None:
                    ledger_rows[ledger_id].add_seq = seq
        self._bytes_since_checkpoint += block_len

    # -- durability ------------------------------------------------------------
    @property
    def durable_ticket(self) -> int:
        return self._journal.durable_seq

    @property
    def durable_fd(self) -> int:
        """Readable when ``durable_ticket`` advanced; drain with ``drain_durable``."""
        return self._journal.durable_fd

    def wait_durable(self, ticket: int, timeout_s: float | None = None) -> bool:
        return self._journal.wait_durable(ticket, timeout_s)

    def write_journal_inline(self) -> bool:
        """The bookie loop's thread, at the end of each loop turn: write and
        sync the journal records queued since the last turn on this thread
        if the journal thread is idle (``Journal.write_inline``: two thread
        hops less per message at moderate load); True if it did, and then
        ``durable_ticket`` covers them (``durable_fd`` is not signalled for
        it: call ``drain_durable(clear_fd=False)``)."""
        return self._journal.write_inline()

    def add_durable_callback(self, ticket: int, callback) -> None:
        """Run ``callback(ticket)`` once durable: now if it already is, else from
        the next ``drain_durable()`` (in the caller's thread, never the journal's)."""
        if ticket <= self.durable_ticket:
            callback(ticket)
            return
        with self._lock:
            if len(self._callbacks) >= limits.STORAGE_CALLBACKS_MAX:
                raise TooManyRequestsError(f"{limits.STORAGE_CALLBACKS_MAX} durability "
                                           "callbacks pending")
            heapq.heappush(self._callbacks, (ticket, id(callback), callback))

    def drain_durable(self, clear_fd: bool = True) -> int:
        """Clear ``durable_fd`` (unless ``clear_fd`` is false: after an inline
        write, which did not signal it), run due callbacks; returns
        ``durable_ticket``."""
        if clear_fd:
            self._journal.drain_fd()
        durable = self.durable_ticket
        due = []
        with self._lock:
            while self._callbacks and self._callbacks[0][0] <= durable:
                due.append(heapq.heappop(self._callbacks))
        for ticket, _key, callback in due:
            callback(ticket)
        if self._journal.failure() is not None:
            raise BookieIOError(f"journal failed: {self._journal.failure()}") \
                from self._journal.failure()
        return durable

    # -- lifecycle -------------------------------------------------------------
    def close(self) -> None:
        """Checkpoint, stop threads, close files, write the clean marker.  After a
        write/sync failure nothing is synced and no marker is written."""
        error = None
        with self._checkpoint_lock:
            with self._lock:
                if self._closed or self._closing:
                    return
                self._closing = True  # adds and state changes refuse from here on
                healthy = self._failure is None and self._journal.failure() is None
            if healthy:
                try:
                    self._checkpoint_locked()
                except BaseException as exc:  # noqa: BLE001 - re-raised after cleanup
                    error, healthy = exc, False
            with self._lock:
                self._closed = True
        self._shutdown(keep_unsynced=healthy)
        if healthy:
            sf.write_clean_marker(self)
        sf.release_locks(self)
        if error is not None:
            raise error

    def _shutdown(self, keep_unsynced: bool) -> None:
        """Stop threads and close files; called (unlocked) with ``_closed`` set."""
        self._stop_checkpointer()
        self._journal.close()
        if keep_unsynced and self._logs.failure() is None:
            self._logs.close()
        else:  # after a failed write or sync nothing more is trusted to disk
            self._logs.abandon()

    def abort(self) -> None:
        """Stop without the final checkpoint or clean marker, as a crash would
        (queued journal records are still written; the write buffer is dropped)."""
        with self._checkpoint_lock, self._lock:  # a running checkpoint finishes first
            if self._closed:
                return
            self._closed = True
        self._shutdown(keep_unsynced=False)
        sf.release_locks(self)

    def _release_after_failed_open(self) -> None:
        self._closed = True
        if self._journal is not None:
            self._journal.close()
        if self._logs is not None:
            self._logs.abandon()
        sf.release_locks(self)

    def _check_open(self) -> None:
        if self._closed or self._closing:
            raise ClientClosedError(f"storage of {self.bookie_id} is closed")

    def _check_usable(self, closing_ok: bool = False) -> None:
        if not (closing_ok and self._closing):
            self._check_open()
        failure = self._failure or self._journal.failure() or self._logs.failure()
        if failure is not None:
            raise BookieIOError(f"storage of {self.bookie_id} failed and refuses writes: "
                                f"{failure}") from failure

    def __enter__(self) -> LedgerStorage:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- BP-46 detection (see storage_files.note_possible_loss) -------------------
    def note_possible_loss(self, reason: str) -> None:
        """Durably record another reason why data may be gone (a replaced
        disk, ...): every boot redoes phase one until ``possible_loss_handled``."""
        sf.note_possible_loss(self, reason)

    def possible_loss_handled(self) -> None:
        """Phase one's fences and limbo marks are durable: forget the reasons."""
        sf.possible_loss_handled(self)

    def limbo_count(self) -> int:
        with self._lock:
            return sum(1 for led in self._index.ledgers.values() if led.limbo)

    def stats(self) -> dict:
        with self._lock:
            out = dict(self.counters)
            out.update(self._journal.stats)
            out.update(self._logs.stats)
            out.update(entries=self._index.entry_count(), bytes=self._index.data_bytes(),
                       ledgers=len(self._index.ledgers), index_bytes=self._index.index_bytes(),
                       seq=self._seq, durable_ticket=self.durable_ticket,
                       pending_callbacks=len(self._callbacks), pid=os.getpid(),
                       limbo_ledgers=self.limbo_count())
            out.update(self.recovery_stats)
        out["compaction"] = self.compaction_status()
        out["disk"] = {} if self._closed or self._closing else self.disk_usage()
        return out

