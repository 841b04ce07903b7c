"""One bookie's local storage (journal, entry logs, index, cookies) and the
metadata store backends (``storage.metadata``).

``LedgerStorage`` and ``StorageOptions`` are the public API of the local
storage engine; see ``docs/STORAGE.md`` for formats and durability rules.
"""

from .ledger_storage import LedgerStorage
from .options import StorageOptions

__all__ = ["LedgerStorage", "StorageOptions"]
