"""Automatic moving to cold storage, hosted by the auditor.

The auditor (one at a time, elected through the metadata store) runs a pass
every ``[cold_storage] check_interval_ms``: for each log, the sealed hot
segments started ``offload_after_ms`` ago move to cold storage, the ledgers
of segments moved ``delete_after_ms`` ago are deleted and orphan files
removed, also the files of logs deleted since (``appliance.cold.mover``;
the per-log lease keeps it apart from a ``bkctl log offload`` at the same
time).  The auditor hosts it because it
runs in every bookie process, with or without the supervisor, one at a
time, and holds the ledgers' keys through key custody (``key_for``), so it
reads and deletes any log's ledgers without the log's password.

A failure on one log (busy, unreachable store, a segment that does not
verify) is logged and retried at the next pass; the other logs go on.
"""

from __future__ import annotations

import logging

log = logging.getLogger("appliance.autorecovery")


class ColdPass:
    def __init__(self, cold_config, store, ledger_manager, *, key_for, client_for):
        self.config = cold_config
        self._store = store
        self._ledgers = ledger_manager
        self._key_for = key_for
        self._client_for = client_for
        self._mover = None
        self._last_s = -1e18
        self.stats = {"passes": 0, "moved": 0, "ledgers_deleted": 0, "last_error": None}

    def tick(self, now_s: float) -> None:
        """One pass when ``check_interval_ms`` has passed since the last."""
        if not self.config.uri or now_s - self._last_s < self.config.check_interval_ms / 1e3:
            return
        self._last_s = now_s
        mover = self._mover or self._make_mover()
        for name in mover.logs.list_logs():
            try:
                result = mover.offload(name, by_age=True)
            except Exception as exc:  # noqa: BLE001 - one log's trouble stops no other
                self.stats["last_error"] = f"log {name}: {type(exc).__name__}: {exc}"
                log.warning("cold storage: log %s not moved now: %s", name, exc)
                continue
            self.stats["moved"] += len(result.moved)
            self.stats["ledgers_deleted"] += len(result.ledgers_deleted)
        try:
            mover.collect_deleted_logs()
        except Exception as exc:  # noqa: BLE001 - retried at the next pass
            self.stats["last_error"] = f"deleted logs' files: {type(exc).__name__}: {exc}"
            log.warning("cold storage: deleted logs' files not collected now: %s", exc)
        self.stats["passes"] += 1

    def _make_mover(self):
        # on use: the cold room needs pyarrow (the spark extra); a bookie
        # without [cold_storage] uri never loads it
        from appliance.cold.mover import Mover
        from appliance.cold.store import ColdStore
        from appliance.meta.logs import LogManager

        self._mover = Mover(LogManager(self._store), ColdStore.from_config(self.config),
                            self.config, open_ledger=self._open, delete_ledger=self._delete,
                            owner="auditor")
        return self._mover

    def _open(self, ledger_id: int):
        md, _ = self._ledgers.read_ledger(ledger_id)
        return self._client_for().open_ledger_with_key(ledger_id, self._key_for(md),
                                                       recovery=False)

    def _delete(self, ledger_id: int) -> None:
        self._open(ledger_id).close()  # proves the key to the client: delete without password
        self._client_for().delete_ledger(ledger_id)
