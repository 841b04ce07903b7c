"""Copy markers: "a re-replication is copying ledger L to bookie R now".

``/rereplication/copying/<ledger id>/<R>.copy-<seq>``, one persistent node
per copy in progress, JSON ``{"pid", "host", "since_ms"}`` for operators.
The re-replicator (``bkctl bookie recover``, autorecovery workers, the
copy that settles a recovery's write-back) creates it *before* the first
copy reaches R and deletes it only *after* the compare-and-swap that names
R (or after giving up).  A bookie's garbage collector
(``appliance.bookie.ledger_gc``) never deletes an over-replicated ledger
while a marker names it, and the two together with the bookie's local
"no add since" check make deleting copies that a CAS then names
impossible: the ordering argument is in ``appliance.bookie.ledger_gc``.

Why persistent, not ephemeral: an ephemeral node vanishes when its
session expires, and a re-replicator whose session expired may still be
alive and about to CAS (a long GC pause, a slow disk): the marker would be
gone while its copies still matter.  The price: a re-replicator killed
mid-copy (kill -9, power loss) leaves its marker, and the copies it made
on R (named by no fragment) then stay on R, as they always did before
over-replicated data was collected.  ``stale_markers`` lists them; removing
one by hand (``bkctl`` does not) is safe only once its process is gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Iterator

from appliance.errors import NoNodeError, NotEmptyError
from appliance.protocol import limits

ROOT = "/rereplication/copying"
SEPARATOR = ".copy-"


def _ledger_dir(ledger_id: int) -> str:
    return f"{ROOT}/{int(ledger_id)}"


def _bookie_of(name: str) -> str:
    return name.rsplit(SEPARATOR, 1)[0]


class CopyMarkers:
    """The marker nodes over one metadata store (see the module docstring)."""

    def __init__(self, store):
        self.store = store

    @contextlib.contextmanager
    def hold(self, ledger_id: int, replacement: str) -> Iterator[str]:
        """Hold a marker for copies of ``ledger_id`` to ``replacement`` for the
        ``with`` block (copy, then CAS, inside it)."""
        path = self.create(ledger_id, replacement)
        try:
            yield path
        finally:
            self.release(path)

    def create(self, ledger_id: int, replacement: str) -> str:
        doc = {"pid": os.getpid(), "host": socket.gethostname(),
               "since_ms": int(time.time() * 1000), "replacement": replacement}
        prefix = f"{_ledger_dir(ledger_id)}/{replacement}{SEPARATOR}"
        for _ in range(limits.REREPLICATION_MARK_CREATE_TRIES_MAX - 1):
            try:
                return self.store.create(prefix, json.dumps(doc).encode(), sequential=True,
                                         make_parents=True)
            except NoNodeError:
                continue  # a release removed the ledger's folder meanwhile
        return self.store.create(prefix, json.dumps(doc).encode(), sequential=True,
                                 make_parents=True)

    def release(self, path: str) -> None:
        """Delete the marker (and the ledger's folder when it is empty)."""
        with contextlib.suppress(NoNodeError):
            self.store.delete(path)
        with contextlib.suppress(NoNodeError, NotEmptyError):
            self.store.delete(path.rsplit("/", 1)[0])

    def held_for(self, ledger_id: int, bookie_id: str) -> bool:
        """A marker says a copy of ``ledger_id`` to ``bookie_id`` is in progress."""
        try:
            names = self.store.children(_ledger_dir(ledger_id))
        except NoNodeError:
            return False
        return any(_bookie_of(n) == bookie_id for n in names)

    def ledgers_marked_for(self, bookie_id: str) -> set[int]:
        """Every ledger with a marker naming ``bookie_id``."""
        found = set()
        for ledger in self._ledger_names():
            try:
                names = self.store.children(f"{ROOT}/{ledger}")
            except NoNodeError:
                continue
            if any(_bookie_of(n) == bookie_id for n in names):
                found.add(int(ledger))
        return found

    def markers(self) -> list[dict]:
        """Every marker: ``{"ledger_id", "bookie_id", "path", ...its data}``."""
        out = []
        for ledger in self._ledger_names():
            try:
                names = self.store.children(f"{ROOT}/{ledger}")
            except NoNodeError:
                continue
            for name in sorted(names):
                path = f"{ROOT}/{ledger}/{name}"
                try:
                    data, _ = self.store.get(path)
                    doc = json.loads(data)
                except (NoNodeError, ValueError):
                    doc = {}
                out.append({**(doc if isinstance(doc, dict) else {}), "ledger_id": int(ledger),
                            "bookie_id": _bookie_of(name), "path": path})
        return out

    def _ledger_names(self) -> list[str]:
        try:
            return [n for n in self.store.children(ROOT) if n.isdigit()]
        except NoNodeError:
            return []


def stale_markers(markers: CopyMarkers, now_ms: int, older_than_ms: int) -> list[dict]:
    """Markers older than ``older_than_ms`` (a copy that long is probably a
    re-replicator that died mid-copy: check its ``pid``/``host``)."""
    return [m for m in markers.markers() if now_ms - int(m.get("since_ms", now_ms)) > older_than_ms]
