"""One bookie's local storage (journal, entry logs, index, cookies) and the
metadata store backends (``storage.metadata``: a compare-and-swap tree on
SQLite or ZooKeeper; the ledger model on top is ``appliance.meta``).

Layer: imports only ``appliance.protocol`` (errors, invariant, the ledger
model) of the project, never ``ipc`` or the rest of ``appliance``.

``LedgerStorage`` and ``StorageOptions`` are the public API of the local
storage engine; see ``docs/STORAGE.md`` for formats and durability rules.

Both are imported on first use (PEP 562): a client process imports
``storage.metadata`` and should not carry the bookie's engine, numpy and
all, in its heap (every full garbage collection scans it).
"""

from __future__ import annotations

import importlib

__all__ = ["LedgerStorage", "StorageOptions"]

_LAZY = {"LedgerStorage": ".ledger_storage", "StorageOptions": ".options"}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'storage' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_LAZY))
