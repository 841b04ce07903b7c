"""The batched read path (``storage.read_path`` behind ``read_entries`` and
``read_entry_views``): the exact bytes, in order, across blocks, entry logs and
run cuts; cut at a byte budget; and a record whose data or header was damaged
on disk is reported as ``CorruptRecordError``, never returned."""

from __future__ import annotations

import os

import pytest

from appliance.errors import CorruptRecordError, NoSuchEntryError
from storage import read_path


def _payload(entry_id: int, size: int = 300) -> bytes:
    return (b"e%06d-" % entry_id) * (size // 8) + b"!" * (size % 8)


def _logs(ledger_dir) -> list[str]:
    return sorted(os.path.join(ledger_dir, n) for n in os.listdir(ledger_dir)
                  if n.startswith("entrylog-"))


def _flip(path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))


def _fill(st, count: int, batch: int = 40, ledger: int = 1) -> list[bytes]:
    datas = [_payload(e) for e in range(count)]
    for lo in range(0, count, batch):
        hi = min(count, lo + batch)
        st.add_entries([ledger] * (hi - lo), list(range(lo, hi)), datas[lo:hi])
    return datas


def test_views_are_the_exact_bytes_across_blocks_logs_and_runs(opener, monkeypatch):
    st = opener()
    datas = _fill(st, 3000)  # ~1 MB: several blocks and several 512 KiB entry logs
    assert len(_logs(st.ledger_dir)) > 1
    assert [bytes(v) for v in st.read_entry_views(1, 0, 2999, 1 << 30)] == datas
    monkeypatch.setattr(read_path, "RUN_BYTES_MAX", 4096)  # many runs per stretch
    assert [bytes(v) for v in st.read_entry_views(1, 5, 2999, 1 << 30)] == datas[5:]
    assert st.read_entries(1, 100, 1099) == datas[100:1100]


def test_byte_budget_keeps_the_leading_entries_that_fit(opener):
    st = opener()
    datas = _fill(st, 50)
    size = len(datas[0])
    got = st.read_entry_views(1, 10, 49, size * 3 + size // 2)
    assert [bytes(v) for v in got] == datas[10:13]
    assert st.read_entry_views(1, 10, 49, size - 1) == []
    with pytest.raises(NoSuchEntryError):
        st.read_entry_views(1, 40, 60, 1 << 30)


@pytest.mark.parametrize("where", ["data", "ledger id", "length"])
def test_damaged_record_in_a_run_is_an_error_not_bytes(opener, where):
    st = opener()
    datas = _fill(st, 200)
    st.close()
    log = next(p for p in _logs(st.ledger_dir) if datas[137] in open(p, "rb").read())
    with open(log, "rb") as f:
        pos = f.read().find(datas[137])
    header = pos - 24  # u64 ledger, u64 entry, u32 length, u32 crc
    _flip(log, {"data": pos + 100, "ledger id": header + 1, "length": header + 16}[where])
    st2 = opener()
    with pytest.raises(CorruptRecordError, match="entry log"):
        st2.read_entry_views(1, 100, 199, 1 << 30)
    with pytest.raises(CorruptRecordError):
        st2.read_entries(1, 0, 199)
    # the records around it are still served, verified
    assert [bytes(v) for v in st2.read_entry_views(1, 100, 136, 1 << 30)] == datas[100:137]
    assert st2.read_entries(1, 138, 199) == datas[138:]
