"""A real ``BookieHandler`` over a fresh ``LedgerStorage`` in a temp dir,
for tests that drive the handler without a socket (the server is a fake the
test provides)."""

from __future__ import annotations

from contextlib import contextmanager

from appliance.bookie.handler import BookieHandler
from appliance.protocol.bookie import BookieCore
from storage import LedgerStorage, StorageOptions


@contextmanager
def handler_on_storage(tmp_path, server):
    """The handler, attached to ``server`` (which needs ``limits``,
    ``send_reply`` and ``watch_fd``); the storage is closed afterwards."""
    journal, ledgers = tmp_path / "journal", tmp_path / "ledgers"
    opts = StorageOptions(entry_log_buffer_bytes=64 * 1024, checkpoint_interval_s=3600.0)
    LedgerStorage.format("bookie-1", journal, ledgers, opts)
    storage = LedgerStorage.open("bookie-1", journal, ledgers, opts)
    handler = BookieHandler("bookie-1", storage, BookieCore(storage))
    handler.attach(server)
    try:
        yield handler
    finally:
        storage.close()
