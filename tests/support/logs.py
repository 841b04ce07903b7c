"""Helpers the log tests share."""

from __future__ import annotations


def read_now(log) -> list:
    """Every record a reader of ``log`` from its start gets without waiting."""
    out = []
    with log.reader() as r:
        while True:
            got = r.read(max_records=1000, timeout_s=0)
            if not got:
                return out
            out += got
