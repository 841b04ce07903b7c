"""One bookie's local storage (journal, entry logs, index, cookies) and the
metadata store backends (``storage.metadata``: a compare-and-swap tree on
SQLite or ZooKeeper; the ledger model on top is ``appliance.meta``).

Layer: imports only ``appliance.protocol`` (errors, invariant, the ledger
model) of the project, never ``ipc`` or the rest of ``appliance``.

``LedgerStorage`` and ``StorageOptions`` are the public API of the local
storage engine; see ``docs/STORAGE.md`` for formats and durability rules.
"""

from .ledger_storage import LedgerStorage
from .options import StorageOptions

__all__ = ["LedgerStorage", "StorageOptions"]
