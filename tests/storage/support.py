"""Helpers the storage tests share."""

from __future__ import annotations

import os


def fill(st, ledger_id: int, first: int, count: int, size: int = 1000) -> list[bytes]:
    """Add ``count`` random entries of ``size`` bytes to ``ledger_id`` from
    entry ``first``, 50 a batch, each batch waited durable; their payloads."""
    datas = [os.urandom(size) for _ in range(count)]
    for start in range(0, count, 50):
        part = datas[start:start + 50]
        st.wait_durable(st.add_entries([ledger_id] * len(part),
                                       list(range(first + start, first + start + len(part))),
                                       part), timeout_s=10)
    return datas
