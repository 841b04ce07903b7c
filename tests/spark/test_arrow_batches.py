"""``ArrowBatcher`` / ``chunks_to_batch`` (pure, no Spark session): the rows
of the batches, in order, are exactly the chunks' entries; batches stay
within their bounds; a big chunk is a batch of its own over its buffer."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa

from appliance.client.bulk_read.records import VerifiedChunk
from appliance.spark.source import ARROW_SCHEMA, ArrowBatcher


def _chunk(rng: random.Random, ledger_id: int, first: int, count: int, size: int):
    payloads = [rng.randbytes(size if size >= 0 else rng.randrange(0, 50))
                for _ in range(count)]
    offsets = np.zeros(count + 1, np.int64)
    np.cumsum([len(p) for p in payloads], out=offsets[1:])
    rows = [(ledger_id, first + i, p) for i, p in enumerate(payloads)]
    return VerifiedChunk(ledger_id, first, b"".join(payloads), offsets), rows


def _rows(batch: pa.RecordBatch) -> list[tuple[int, int, bytes]]:
    d = batch.to_pydict()
    return list(zip(d["ledger_id"], d["entry_id"], d["payload"], strict=True))


def test_batches_hold_every_entry_once_in_order_within_bounds():
    rng = random.Random(1)
    batcher = ArrowBatcher(rows_max=50, bytes_max=4000, direct_bytes_min=2000)
    want, got, batches = [], [], []
    entry = {7: 0, 9: 0}
    for _ in range(60):  # small chunks, varied payloads, big uniform ones, two ledgers
        ledger_id = rng.choice([7, 9])
        count = rng.randrange(1, 30)
        size = rng.choice([-1, 10, 100])
        chunk, rows = _chunk(rng, ledger_id, entry[ledger_id], count, size)
        entry[ledger_id] += count
        want += rows
        batches += batcher.add(chunk)
    last = batcher.flush()
    batches += [last] if last is not None else []
    assert batcher.flush() is None
    for batch in batches:
        assert batch.schema.equals(ARROW_SCHEMA)
        got += _rows(batch)
        nbytes = sum(len(p) for _, _, p in _rows(batch))
        # a batch is cut once it reaches a bound, so it exceeds it by less than one chunk
        assert batch.num_rows < 50 + 30 and nbytes < 4000 + 3000
    assert got == want
    assert any(b.num_rows >= 2000 // 100 and b.num_rows < 30 for b in batches)  # direct ones


def test_a_big_chunk_is_its_own_batch_over_its_buffer():
    rng = random.Random(2)
    batcher = ArrowBatcher(rows_max=1000, bytes_max=1 << 20, direct_bytes_min=5000)
    small, small_rows = _chunk(rng, 3, 0, 10, 100)  # 1,000 bytes: kept
    big, big_rows = _chunk(rng, 3, 10, 60, 100)  # 6,000 bytes: flushes, then goes alone
    assert batcher.add(small) == []
    first, second = batcher.add(big)
    assert _rows(first) == small_rows and _rows(second) == big_rows
    data = second.column(2).buffers()[2]
    assert data.address == np.frombuffer(big.payloads, np.uint8).ctypes.data  # no copy
    assert batcher.flush() is None
