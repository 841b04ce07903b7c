"""The batched read path (``storage.read_path`` behind ``read_entries`` and
``read_entries_packed``): the exact bytes, in order, across blocks, entry logs
and run cuts; cut at a byte budget; and a record whose data or header was
damaged on disk is reported as ``CorruptRecordError``, never returned.  Both
paths: entries of one length (one CRC call per run, ``crc_vec``) and of
varied lengths (one CRC call per record)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from appliance.errors import CorruptRecordError, NoSuchEntryError
from appliance.protocol import limits
from storage.codec import RECORD_HEADER_BYTES
from storage.read_path import split_parts


def _payload(entry_id: int, varied: bool) -> bytes:
    size = 200 + (entry_id * 37) % 190 if varied else 300
    return ((b"e%06d-" % entry_id) * 64)[:size]


def _logs(ledger_dir) -> list[str]:
    return sorted(os.path.join(ledger_dir, n) for n in os.listdir(ledger_dir)
                  if n.startswith("entrylog-"))


def _flip(path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))


def _fill(st, count: int, varied: bool, batch: int = 40) -> list[bytes]:
    datas = [_payload(e, varied) for e in range(count)]
    for lo in range(0, count, batch):
        hi = min(count, lo + batch)
        st.add_entries([1] * (hi - lo), list(range(lo, hi)), datas[lo:hi])
    return datas


def _packed(st, first: int, last: int, bytes_max: int = 1 << 30) -> list[bytes]:
    parts, lengths = st.read_entries_packed(1, first, last, bytes_max)
    assert sum(map(len, parts)) == int(np.sum(lengths))
    return split_parts(parts, lengths)


@pytest.fixture(params=["one length", "varied lengths"])
def varied(request):
    return request.param == "varied lengths"


def test_exact_bytes_across_blocks_logs_and_runs(opener, monkeypatch, varied):
    st = opener()
    datas = _fill(st, 3000, varied)  # ~1 MB: many blocks and several 512 KiB entry logs
    assert len(_logs(st.ledger_dir)) > 1
    assert _packed(st, 0, 2999) == datas
    monkeypatch.setattr(limits, "STORAGE_READ_RUN_BYTES_MAX", 4096)  # many runs per stretch
    monkeypatch.setattr(limits, "STORAGE_READ_GAP_BYTES_MAX", 0)  # a run per block
    assert _packed(st, 5, 2999) == datas[5:]
    assert st.read_entries(1, 100, 1099) == datas[100:1100]


def test_byte_budget_keeps_the_leading_entries_that_fit(opener, varied):
    st = opener()
    datas = _fill(st, 50, varied)
    budget = sum(map(len, datas[10:13])) + 5
    assert _packed(st, 10, 49, budget) == datas[10:13]
    assert st.read_entries_packed(1, 10, 49, len(datas[10]) - 1)[0] == []
    with pytest.raises(NoSuchEntryError):
        st.read_entries_packed(1, 40, 60, 1 << 30)


@pytest.mark.parametrize("where", ["data", "ledger id", "length", "crc"])
def test_damaged_record_in_a_run_is_an_error_not_bytes(opener, where, varied):
    st = opener()
    datas = _fill(st, 200, varied)
    st.close()
    log = next(p for p in _logs(st.ledger_dir) if datas[137] in open(p, "rb").read())
    with open(log, "rb") as f:
        pos = f.read().find(datas[137])
    header = pos - RECORD_HEADER_BYTES  # u64 ledger, u64 entry, u32 length, u32 crc
    _flip(log, {"data": pos + 100, "ledger id": header + 1, "length": header + 16,
                "crc": header + 21}[where])
    st2 = opener()
    with pytest.raises(CorruptRecordError, match="entry log"):
        st2.read_entries_packed(1, 100, 199, 1 << 30)
    with pytest.raises(CorruptRecordError):
        st2.read_entries(1, 0, 199)
    # the records around it are still served, verified
    assert _packed(st2, 100, 136) == datas[100:137]
    assert st2.read_entries(1, 138, 199) == datas[138:]
