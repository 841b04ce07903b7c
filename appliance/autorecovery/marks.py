"""Autorecovery's state in the metadata store (so it survives any process,
and works the same when several hosts run supervisors):

* ``/autorecovery/underreplicated/<ledger id>``: a durable mark, JSON
  ``{"missing": [bookie ids], "reasons": [...], "since_ms": t}``: this
  ledger has fragments naming bookies that lost their copy;
* ``/autorecovery/locks/<ledger id>``: an ephemeral node, the worker
  copying that ledger now; it disappears with the worker's session, so a
  worker that dies mid-copy leaves the mark for another;
* ``/autorecovery/auditor``: an ephemeral node, the one active auditor;
* ``/autorecovery/workers/<worker>``: each worker's ephemeral status;
* ``/autorecovery/disabled``: present while ``bkctl autorecovery disable``
  is in force (a maintenance switch honoured by the auditor and workers).

A mark changes through the one read / transform / CAS loop of
``appliance.meta.update_loop`` (created when absent, re-read on a conflict).
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable

from appliance.errors import MetadataVersionError, NodeExistsError, NoNodeError
from appliance.meta.update_loop import NO_CHANGE, MetadataUpdateLoop
from appliance.protocol import limits

log = logging.getLogger(__name__)

ROOT = "/autorecovery"
MARKS = f"{ROOT}/underreplicated"
LOCKS = f"{ROOT}/locks"
AUDITOR = f"{ROOT}/auditor"
WORKERS = f"{ROOT}/workers"
DISABLED = f"{ROOT}/disabled"


def _encode(doc: dict) -> bytes:
    return json.dumps(doc, sort_keys=True).encode()


def _decode(data: bytes) -> dict:
    try:
        doc = json.loads(data)
        return doc if isinstance(doc, dict) else {}
    except ValueError:
        return {}


class Marks:
    """The nodes above, over one metadata store; ``sleep`` and ``rng`` (the
    back-off after a CAS conflict) are injectable."""

    def __init__(self, store, *, sleep: Callable[[float], None] = time.sleep,
                 rng: random.Random | None = None):
        self.store = store
        self._loop = MetadataUpdateLoop(store, sleep=sleep, rng=rng)

    # -- under-replication marks ---------------------------------------------------
    def mark(self, ledger_id: int, missing, reason: str, now_ms: int) -> bool:
        """Add ``missing`` bookies to the ledger's mark (created if absent);
        True when something changed (False also when the conflicts ran out)."""
        path = f"{MARKS}/{ledger_id}"
        wanted = set(missing)

        def add(doc: dict | None) -> dict:
            if doc is None:
                return {"missing": sorted(wanted), "reasons": [reason], "since_ms": now_ms}
            known = set(doc.get("missing", []))
            if wanted <= known:
                return NO_CHANGE
            return {**doc, "missing": sorted(known | wanted),
                    "reasons": (doc.get("reasons", []) + [reason])[-5:]}

        try:
            return self._loop.update(path, add, decode=_decode, encode=_encode,
                                     retries_max=limits.METADATA_MARK_RETRIES_MAX,
                                     create_missing=True).changed
        except MetadataVersionError as exc:
            log.warning("ledger %d not marked under-replicated: %s", ledger_id, exc)
            return False

    def marks(self) -> dict[int, dict]:
        try:
            names = self.store.children(MARKS)
        except NoNodeError:
            return {}
        out = {}
        for name in names:
            try:
                out[int(name)] = _decode(self.store.get(f"{MARKS}/{name}")[0])
            except (NoNodeError, ValueError):
                continue
        return out

    def unmark(self, ledger_id: int) -> None:
        try:
            self.store.delete(f"{MARKS}/{ledger_id}")
        except NoNodeError:
            pass

    # -- per-ledger locks ------------------------------------------------------------
    def try_lock(self, ledger_id: int, owner: str) -> bool:
        try:
            self.store.create(f"{LOCKS}/{ledger_id}", _encode({"owner": owner}),
                              ephemeral=True, make_parents=True)
            return True
        except NodeExistsError:
            return False

    def unlock(self, ledger_id: int) -> None:
        try:
            self.store.delete(f"{LOCKS}/{ledger_id}")
        except NoNodeError:
            pass

    def locks(self) -> dict[int, str]:
        try:
            names = self.store.children(LOCKS)
        except NoNodeError:
            return {}
        out = {}
        for name in names:
            try:
                out[int(name)] = _decode(self.store.get(f"{LOCKS}/{name}")[0]).get("owner", "?")
            except (NoNodeError, ValueError):
                continue
        return out

    # -- the auditor: one at a time ----------------------------------------------------
    def try_become_auditor(self, who: str) -> bool:
        """True if this store's session holds the auditor node (now or already)."""
        try:
            self.store.create(AUDITOR, _encode({"auditor": who}), ephemeral=True,
                              make_parents=True)
            return True
        except NodeExistsError:
            return self.store.ephemeral_owner(AUDITOR) == self.store.session_id

    def auditor(self) -> str | None:
        try:
            return _decode(self.store.get(AUDITOR)[0]).get("auditor")
        except NoNodeError:
            return None

    # -- worker status ---------------------------------------------------------------
    def publish_worker(self, who: str, doc: dict) -> None:
        path = f"{WORKERS}/{who}"
        try:
            self.store.set(path, _encode(doc), -1)
        except NoNodeError:
            try:
                self.store.create(path, _encode(doc), ephemeral=True, make_parents=True)
            except NodeExistsError:
                pass

    def workers(self) -> dict[str, dict]:
        try:
            names = self.store.children(WORKERS)
        except NoNodeError:
            return {}
        out = {}
        for name in names:
            try:
                out[name] = _decode(self.store.get(f"{WORKERS}/{name}")[0])
            except NoNodeError:
                continue
        return out

    # -- the maintenance switch ------------------------------------------------------
    def enabled(self) -> bool:
        return not self.store.exists(DISABLED)

    def set_enabled(self, enabled: bool) -> None:
        if enabled:
            try:
                self.store.delete(DISABLED)
            except NoNodeError:
                pass
        else:
            try:
                self.store.create(DISABLED, b"", make_parents=True)
            except NodeExistsError:
                pass
