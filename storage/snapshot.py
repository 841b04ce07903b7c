"""Index snapshots: the checkpointed index and ledger state, one file,
replaced atomically (temp file, fsync, rename, dir fsync).

File ``index.snap`` (little-endian)::

    64-byte header: 8s magic 'BKIDXS01'  u32 version  u32 hdr_crc
                    u64 meta_len  u64 page_count  u64 body_len  u32 body_crc  pad
    body: meta (JSON, utf-8)  |  page table: page_count x (u64 ledger, u64 page_no,
          u64 slots)  |  pages: slots x 3 x u32 each, in table order

``hdr_crc`` covers the header with that field zeroed; ``body_crc`` (crc32c,
computed incrementally while streaming) covers the whole body.  The meta
holds the checkpoint marks (journal segment/offset to replay from, entry log
position already covered), the operation sequence number, every ledger's
state and the per-log ledger byte counts.  A snapshot that fails either CRC
is refused (``CorruptRecordError``) rather than half-loaded.
"""

from __future__ import annotations

import json
import os
import struct

import numpy as np

from appliance.protocol.errors import CorruptRecordError

from . import aligned_io as aio
from .codec import crc
from .index import Index, Ledger

SNAPSHOT_NAME = "index.snap"
MAGIC = b"BKIDXS01"
HEADER = struct.Struct("<8sIIQQQI20x")
CHUNK_BYTES = 8 * 1024 * 1024


def _header(meta_len: int, pages: int, body_len: int, body_crc: int) -> bytes:
    raw = HEADER.pack(MAGIC, 1, 0, meta_len, pages, body_len, body_crc)
    return raw[:12] + struct.pack("<I", crc(raw)) + raw[16:]


def save(directory: str, meta: dict, index: Index) -> int:
    """Write the snapshot; returns its size in bytes."""
    meta = dict(meta)
    meta["ledgers"] = [led.state_tuple() for led in index.ledgers.values()]
    meta_bytes = json.dumps(meta, separators=(",", ":")).encode()
    table, pages = [], []
    for led in index.ledgers.values():
        for page_no, page in led.pages.items():
            table.append((led.ledger_id, page_no, page.shape[0]))
            pages.append(page)
    table_bytes = np.array(table, np.uint64).reshape(-1, 3).tobytes()
    body_crc = crc(table_bytes, crc(meta_bytes))
    for page in pages:
        body_crc = crc(page.data, body_crc)
    body_len = len(meta_bytes) + len(table_bytes) + sum(p.nbytes for p in pages)
    chunks = [_header(len(meta_bytes), len(table), body_len, body_crc), meta_bytes, table_bytes]
    aio.write_file_atomic(os.path.join(directory, SNAPSHOT_NAME), chunks + pages)
    return HEADER.size + body_len


def exists(directory: str) -> bool:
    return os.path.exists(os.path.join(directory, SNAPSHOT_NAME))


def load(directory: str) -> tuple[dict, Index]:
    """Read and verify the snapshot; returns (meta, index)."""
    path = os.path.join(directory, SNAPSHOT_NAME)
    fix = (f"restore {path} from a backup, or move it away to rebuild the index by "
           f"scanning the entry logs (fence/master-key state is then lost: the open "
           f"reports an unclean shutdown so the bookie fences and limbos its ledgers)")
    with open(path, "rb") as f:
        head = f.read(HEADER.size)
        if len(head) != HEADER.size:
            raise CorruptRecordError(f"index snapshot {path} is truncated: {fix}")
        magic, _ver, hdr_crc, meta_len, npages, body_len, body_crc = HEADER.unpack(head)
        if magic != MAGIC or crc(head[:12] + b"\0\0\0\0" + head[16:]) != hdr_crc:
            raise CorruptRecordError(f"index snapshot {path} has a corrupt header: {fix}")
        meta_bytes = f.read(meta_len)
        table_bytes = f.read(npages * 24)
        running = crc(table_bytes, crc(meta_bytes))
        if len(meta_bytes) != meta_len or len(table_bytes) != npages * 24:
            raise CorruptRecordError(f"index snapshot {path} is truncated: {fix}")
        table = np.frombuffer(table_bytes, np.uint64).reshape(-1, 3)
        pages = []
        for slots in table[:, 2].tolist():
            if slots > (1 << 20):
                raise CorruptRecordError(f"index snapshot {path} has a corrupt page table: {fix}")
            page = np.empty((slots, 3), np.uint32)
            if f.readinto(page.data) != page.nbytes:
                raise CorruptRecordError(f"index snapshot {path} is truncated: {fix}")
            running = crc(page.data, running)
            pages.append(page)
        if running != body_crc or f.read(1):
            raise CorruptRecordError(f"index snapshot {path} failed its checksum: {fix}")
    meta = json.loads(meta_bytes)
    index = Index()
    for row in meta.pop("ledgers"):
        led = Ledger.from_state(row)
        index.ledgers[led.ledger_id] = led
    for (ledger_id, page_no, _slots), page in zip(table.tolist(), pages, strict=True):
        index.ledgers[ledger_id].pages[page_no] = page
    return meta, index
