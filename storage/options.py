"""Storage knobs for one bookie, each with a documented default and trade-off.

The config loader maps a ``[storage]`` TOML table onto these field names, so
they are part of the public contract: never rename, only add.  ``validate()``
refuses impossible combinations with a ``ConfigError`` naming the key and the
fix, before any file is touched.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from appliance.protocol import limits
from appliance.protocol.entry import ENTRY_OVERHEAD_MAX
from appliance.protocol.errors import ConfigError

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

# Direct I/O needs offsets, lengths and buffers aligned to the device's logical
# block; 4 KiB covers every NVMe/SSD sector size in use.
ALIGN_BYTES = 4 * KiB


@dataclass
class StorageOptions:
    # -- journal (the write-ahead log on the journal device) ------------------
    journal_group_wait_us: int = 0
    """Longest time the oldest record of a group commit waits for company
    before the group is written and fdatasync'ed.  0 (the default): no wait;
    a group is what queued while the previous sync ran, so groups grow with
    the load by themselves (and the client already sends a round trip's
    adds per message).  Longer: fewer syncs at low load, but every add's
    latency grows by up to this much (1000 us: p50 5.2-5.6 vs 2.7-4.2 ms at
    10,000 adds/s, same minutes)."""

    journal_group_bytes: int = 1 * MiB
    """A group commit closes as soon as it holds this many bytes.  Larger:
    fewer, bigger syncs (throughput) at the cost of latency under load."""

    journal_segment_bytes: int = 64 * MiB
    """Size of each preallocated journal segment file.  Larger: fewer file
    creations on the hot path; smaller: old segments are freed sooner after a
    checkpoint."""

    journal_write_data: bool = True
    """BP-46.  True: every add is journaled and durable (fdatasync'ed) before
    its ticket completes.  False: adds skip the journal (fence, master key and
    limbo changes are still journaled); an add's ticket completes at once and
    the entry is only as durable as the entry log: a process crash loses the
    unwritten entry-log buffer, a power loss loses everything since the last
    flush()/checkpoint.  Roughly halves disk writes; the bookie must then run
    the BP-46 limbo boot rule after an unclean shutdown."""

    journal_queue_bytes_max: int = 64 * MiB
    """Bound on journal bytes queued but not yet written: adds block (back
    pressure) beyond it.  Larger absorbs bursts at the cost of memory."""

    # -- entry logs (the ledger device) ---------------------------------------
    entry_log_rotate_bytes: int = 1 * GiB
    """An entry log is closed and a new one started past this size.  Smaller
    logs are cheaper to garbage-collect/compact; larger means fewer files.
    Must stay below 4 GiB (offsets are stored as 32-bit)."""

    entry_log_rotate_garbage_bytes: int = limits.STORAGE_ENTRY_LOG_ROTATE_GARBAGE_BYTES
    """The bookie's GC pass rotates the active entry log once this many of
    its bytes belong to deleted ledgers, or its live share is under
    ``compaction_minor_threshold``, so they can be given back (only a
    sealed log is removed or compacted); 0 = rotate only by size.  Lower:
    less deleted data waits in the active log; higher: fewer, larger logs
    (a rotation costs a new file and a checkpoint, at most once a pass)."""

    entry_log_buffer_bytes: int = 4 * MiB
    """Size of the page-aligned write buffer of the active entry log.  Larger
    means fewer, bigger direct writes; in journal_write_data=false mode it is
    also what a process crash can lose."""

    entry_log_write_slice_bytes: int = 256 * KiB
    """The entry-log writer writes a buffer in direct writes of this size
    (a multiple of 4 KiB): a journal sync that comes meanwhile waits behind
    one slice, not the whole buffer (p99 at 10,000 adds/s ~12-13 -> 4-7 ms
    with 256 KiB).  Larger: more bandwidth for big entries (64 KB adds
    ~14% more MB/s with whole 4 MiB writes); smaller: shorter journal
    stalls."""

    entry_log_per_ledger: bool = False
    """BP-32: one entry log per ledger instead of one interleaved log.  A
    deleted ledger's space comes back by removing whole files (no
    compaction), at the cost of more files, more (smaller) writes, and a
    write buffer per open log.  Every checkpoint rotates all open per-ledger
    logs (docs/STORAGE.md: the mark rule)."""

    entry_logs_open_max: int = 64
    """Per-ledger mode: most logs open at once (descriptors and write
    buffers).  Opening one more rotates the least recently appended one, so a
    bookie with more concurrently written ledgers than this churns files."""

    entry_log_idle_ms: int = 30_000
    """Per-ledger mode: a ledger's log not appended to for this long is
    rotated (its buffer and descriptor given back).  Shorter: less memory held
    by quiet ledgers; longer: fewer, bigger logs for slow writers."""

    entry_log_ledger_buffer_bytes: int = 256 * KiB
    """Per-ledger mode: the write buffer of each open log (a multiple of 4096).
    Memory is about (entry_logs_open_max + 3) x this, plus one block in
    flight; larger means fewer, bigger direct writes per ledger."""

    direct_io: bool = True
    """Write journal and entry logs with O_DIRECT from aligned buffers (no page
    cache pollution, steadier latency).  If a directory's filesystem refuses
    O_DIRECT the bookie refuses to start unless this is false, in which case
    it uses buffered writes + fdatasync and warns once."""

    # -- checkpoints -----------------------------------------------------------
    checkpoint_interval_s: float = 60.0
    """Time between checkpoints (entry logs synced, index snapshot written,
    old journal segments freed).  Shorter: faster crash recovery and less
    journal disk use; longer: less index-writing work."""

    checkpoint_bytes: int = 1 * GiB
    """Also checkpoint once this many bytes were added since the last one,
    bounding replay time and journal disk use under heavy load."""

    # -- compaction (storage/compaction.py) -----------------------------------
    compaction_minor_threshold: float = 0.2
    """Minor compaction rewrites sealed entry logs whose live share (bytes
    of entries the index still points at, over the file size) is below
    this.  Copying costs live / (1 - live) bytes written per byte given
    back: 0.25 at 0.2."""

    compaction_minor_interval_s: float = 3600.0
    """Seconds between minor compactions (0 = never by itself)."""

    compaction_major_threshold: float = 0.8
    """Major compaction's threshold (at least the minor one): more space
    back for more copying (4 bytes written per byte given back at 0.8)."""

    compaction_major_interval_s: float = 86400.0
    """Seconds between major compactions (0 = never by itself)."""

    compaction_rate_bytes_per_s: int = limits.STORAGE_COMPACTION_RATE_MAX
    """Most bytes compaction copies per second, every run (automatic or
    ``bkctl bookie compact``); 0 = no limit.  Lower: adds keep more of the
    entry-log device while a compaction runs; higher: the space comes back
    sooner."""

    # -- limits ----------------------------------------------------------------
    entry_bytes_max: int = limits.STORAGE_ENTRY_BYTES_MAX
    """Largest payload of one entry (the one limit, CONTRACT: 5 MiB).  A
    stored record adds the client's header and digest: storage accepts
    records up to ``record_bytes_max`` = this + ``ENTRY_OVERHEAD_MAX``."""

    add_batch_bytes_max: int = 16 * MiB
    """Largest block written as one journal record / entry-log block;
    add_entries splits bigger batches.  Bounds the journal's aligned buffer."""

    @property
    def record_bytes_max(self) -> int:
        """Largest record (payload + header + digest) storage accepts."""
        return self.entry_bytes_max + ENTRY_OVERHEAD_MAX

    def validate(self) -> StorageOptions:
        """Raise ConfigError (naming the key and the fix) on impossible values."""
        for f in fields(self):
            value = getattr(self, f.name)
            off_ok = f.name in _ZERO_IS_OFF and not isinstance(value, bool) and value == 0
            if f.type in ("int", "float") and (isinstance(value, bool) or value <= 0) \
                    and not off_ok:
                _refuse(f.name, value, "a positive number")
            if f.type == "bool" and not isinstance(value, bool):
                _refuse(f.name, value, "true or false")
        if self.entry_log_rotate_bytes >= 4 * GiB:
            _refuse("entry_log_rotate_bytes", self.entry_log_rotate_bytes, "less than 4 GiB")
        if self.record_bytes_max + 64 > self.add_batch_bytes_max:
            _refuse("add_batch_bytes_max", self.add_batch_bytes_max, "above entry_bytes_max")
        record_room = _align_up(self.add_batch_bytes_max + 64)
        if self.journal_segment_bytes < 2 * ALIGN_BYTES + record_room:
            _refuse("journal_segment_bytes", self.journal_segment_bytes,
                    f"at least {2 * ALIGN_BYTES + record_room} (add_batch_bytes_max + 8 KiB)")
        if self.entry_log_rotate_bytes < 2 * ALIGN_BYTES + record_room:
            _refuse("entry_log_rotate_bytes", self.entry_log_rotate_bytes,
                    "at least add_batch_bytes_max + 8 KiB")
        for key in ("compaction_minor_threshold", "compaction_major_threshold"):
            if not 0 < getattr(self, key) <= 1:
                _refuse(key, getattr(self, key), "a share above 0 and at most 1")
        if self.compaction_major_threshold < self.compaction_minor_threshold:
            _refuse("compaction_major_threshold", self.compaction_major_threshold,
                    "at least compaction_minor_threshold")
        for key in ("entry_log_buffer_bytes", "entry_log_ledger_buffer_bytes"):
            if getattr(self, key) % ALIGN_BYTES:
                _refuse(key, getattr(self, key), f"a multiple of {ALIGN_BYTES}")
        return self


_ZERO_IS_OFF = ("entry_log_rotate_garbage_bytes", "compaction_minor_interval_s",
                "compaction_major_interval_s", "compaction_rate_bytes_per_s",
                "journal_group_wait_us")


def _align_up(n: int) -> int:
    return -(-n // ALIGN_BYTES) * ALIGN_BYTES


def _refuse(key: str, value, wanted: str) -> None:
    raise ConfigError(f"[storage] {key} = {value!r} is invalid: set it to {wanted}")
