"""Open-time recovery: rebuild the index from the last checkpoint, the
entry-log tail and the journal, in operation order.

Every mutation carries a storage-wide sequence number (``seq``): an add batch
is one entry block (in the entry log, and in the journal when data is
journaled) with the batch's seq; a fence, master-key, limbo, explicit-LAC or
delete change is one journal record with its seq.  Both streams are written
in seq order, so recovery merges them by seq:

1. load the snapshot (state as of its seq, marks for the journal and the
   entry logs); if it is missing but logs exist, rebuild from a full scan and
   report an unclean shutdown (ledger state from before the journal's start
   is lost, so BP-46 fencing/limbo must run);
2. scan entry logs from the entry-log mark: every valid block after it
   (stopping at the first invalid one per log);
3. replay the journal from the journal mark; an ADD whose block was found in
   step 2 (same seq) is indexed where it already is, otherwise its block is
   appended again to the new entry log; scanned blocks without a journal
   record (``journal_write_data=false``) are indexed in seq order.

A crash during recovery is harmless: nothing before the final checkpoint
changes the old files (new writes go to a new log and a new segment).
"""

from __future__ import annotations

import logging

import numpy as np

from appliance.protocol.errors import CorruptRecordError

from . import journal_scan as js
from .codec import parse_block
from .entry_log import list_logs, scan_log

log = logging.getLogger(__name__)


class ScannedBlock:
    """Where a verified block sits; its records are re-read when indexed, so a
    long entry-log tail costs memory per block, not per entry."""

    __slots__ = ("seq", "log_id", "offset", "block_len")

    def __init__(self, seq, log_id, offset, block_len):
        self.seq, self.log_id, self.offset, self.block_len = seq, log_id, offset, block_len


def scan_entry_logs(ledger_dir: str, mark_log: int, mark_offset: int, min_seq: int) -> list:
    """Valid blocks after the entry-log mark, in seq order."""
    found: list[ScannedBlock] = []
    for log_id in list_logs(ledger_dir):
        if log_id < mark_log:
            continue
        start = mark_offset if log_id == mark_log else 0

        def on_block(offset, info, _raw, log_id=log_id):
            if info.seq > min_seq:
                found.append(ScannedBlock(info.seq, log_id, offset, info.block_len))

        scan_log(ledger_dir, log_id, start, on_block)
    found.sort(key=lambda b: b.seq)
    return found


class Replayer:
    """Applies scanned blocks and journal records, merged by seq, to a storage."""

    def __init__(self, storage, scanned: list, min_seq: int):
        self.st = storage
        self.pending = scanned
        self.next_scanned = 0
        self.by_seq = {b.seq: b for b in scanned}
        self.min_seq = min_seq
        self.max_seq = max([min_seq] + [b.seq for b in scanned])
        self.applied = {"blocks_found": 0, "blocks_rewritten": 0, "state_records": 0}

    def _flush_scanned_before(self, seq: int) -> None:
        while self.next_scanned < len(self.pending) and self.pending[self.next_scanned].seq < seq:
            blk = self.pending[self.next_scanned]
            self.next_scanned += 1
            if blk.seq in self.by_seq:
                self._index_found(self.by_seq.pop(blk.seq))

    def _index_found(self, blk: ScannedBlock) -> None:
        raw = self.st._logs.read_record(blk.log_id, blk.offset, blk.block_len)
        info = parse_block(raw, 0, verify_data=False)  # data CRCs were checked by the scan
        if info is None or info.seq != blk.seq:
            raise CorruptRecordError(f"entry log {blk.log_id} block at {blk.offset} changed "
                                     f"during recovery")
        self.st._index_block(info.ledgers, info.entries, blk.log_id,
                             info.offsets + blk.offset, info.lengths, info.block_len)
        self.applied["blocks_found"] += 1

    def on_record(self, rtype: int, seq: int, body, block) -> None:
        if seq <= self.min_seq:
            return
        self._flush_scanned_before(seq)
        self.max_seq = max(self.max_seq, seq)
        if rtype == js.ADD:
            found = self.by_seq.pop(seq, None)
            if found is not None and found.block_len == block.block_len:
                self._index_found(found)
            else:
                log_id, base = self.st._logs.append_block(bytes(body))
                self.st._index_block(block.ledgers, block.entries, log_id,
                                     block.offsets + base, block.lengths, block.block_len)
                self.applied["blocks_rewritten"] += 1
            return
        if rtype not in js.STATE_TYPES:
            raise CorruptRecordError(f"journal record {seq} has unknown type {rtype}: written "
                                     f"by a newer version? Run that version or reformat")
        self.st._apply_state_record(rtype, seq, bytes(body))
        self.applied["state_records"] += 1

    def finish(self) -> None:
        self._flush_scanned_before(1 << 63)


def verify_block_bytes(raw) -> bool:
    """True if ``raw`` is one whole valid block (used by tests and tools)."""
    info = parse_block(raw, 0)
    return info is not None and info.block_len == len(raw)


def unique_ledger_bytes(ledgers: np.ndarray, sizes: np.ndarray) -> list[tuple[int, int]]:
    """(ledger, bytes) pairs for a batch: per-log accounting for GC."""
    if ledgers[0] == ledgers[-1] and (len(ledgers) < 3 or ledgers.min() == ledgers.max()):
        return [(int(ledgers[0]), int(sizes.sum()))]
    uniq, inverse = np.unique(ledgers, return_inverse=True)
    sums = np.bincount(inverse, weights=sizes)
    return list(zip(uniq.tolist(), sums.astype(np.int64).tolist(), strict=True))
