"""In-memory bookie storage for the simulation: the ``storage.LedgerStorage``
method names, with a durability model a crash can exercise.

Every change (entry, master key, fence, limbo) gets an increasing ticket and
goes to the live state and an unsynced log; ``sync()`` makes the log durable.
``crash(keep_ops)`` keeps only a prefix of the unsynced log (a torn tail), and
the live state becomes the durable one: whatever was not synced is gone,
fence flags and keys included.  The explicit LAC is volatile.
"""

from __future__ import annotations

from appliance.errors import NoSuchEntryError, NoSuchLedgerError


class _Ledger:
    __slots__ = ("entries", "key", "fenced", "limbo", "explicit_lac")

    def __init__(self):
        self.entries: dict[int, bytes] = {}
        self.key: bytes | None = None
        self.fenced = False
        self.limbo = False
        self.explicit_lac = -1

    def copy(self) -> _Ledger:
        other = _Ledger()
        other.entries = dict(self.entries)
        other.key, other.fenced, other.limbo = self.key, self.fenced, self.limbo
        return other


def _apply(ledgers: dict[int, _Ledger], op: tuple) -> None:
    kind, ledger_id = op[0], op[1]
    if kind == "delete":
        ledgers.pop(ledger_id, None)
        return
    ledger = ledgers.get(ledger_id)
    if ledger is None:
        ledger = ledgers[ledger_id] = _Ledger()
    if kind == "add":
        ledger.entries[op[2]] = op[3]
    elif kind == "key":
        ledger.key = op[2]
    elif kind == "fence":
        ledger.fenced = True
    elif kind == "limbo":
        ledger.limbo = op[2]


class MemStorage:
    """One simulated bookie's disks.  ``on_add(ledger_id, entry_id, data)`` is
    called for every stored entry (the checker's out-of-order probe)."""

    def __init__(self, on_add=None):
        self._live: dict[int, _Ledger] = {}
        self._durable: dict[int, _Ledger] = {}
        self._log: list[tuple[int, tuple]] = []
        self._ticket = 0
        self.durable_ticket = 0
        self.write_closes: list[int] = []  # BP-32 rotations asked for (advisory, volatile)
        self._on_add = on_add

    # -- durability ---------------------------------------------------------------------
    def _op(self, op: tuple) -> int:
        self._ticket += 1
        self._log.append((self._ticket, op))
        _apply(self._live, op)
        return self._ticket

    @property
    def unsynced_ops(self) -> int:
        return len(self._log)

    def sync(self) -> None:
        for _, op in self._log:
            _apply(self._durable, op)
        self.durable_ticket = self._ticket
        self._log.clear()

    def crash(self, keep_ops: int = 0) -> dict[int, set[int]]:
        """Lose the unsynced log except its first ``keep_ops`` records.
        Returns the entries lost: ledger id -> entry ids."""
        for ticket, op in self._log[:max(0, keep_ops)]:
            _apply(self._durable, op)
            self.durable_ticket = ticket
        self._log.clear()
        lost: dict[int, set[int]] = {}
        for ledger_id, ledger in self._live.items():
            kept = self._durable.get(ledger_id)
            gone = set(ledger.entries) - (set(kept.entries) if kept else set())
            if gone:
                lost[ledger_id] = gone
        self._live = {lid: ledger.copy() for lid, ledger in self._durable.items()}
        self._ticket = self.durable_ticket
        return lost

    def durable_has(self, ledger_id: int, entry_id: int) -> bool:
        ledger = self._durable.get(ledger_id)
        return ledger is not None and entry_id in ledger.entries

    def has(self, ledger_id: int, entry_id: int) -> bool:
        ledger = self._live.get(ledger_id)
        return ledger is not None and entry_id in ledger.entries

    # -- the LedgerStorage interface ------------------------------------------------------------
    def add_entry(self, ledger_id: int, entry_id: int, data: bytes) -> int:
        if self._on_add is not None:
            self._on_add(ledger_id, entry_id, data)
        return self._op(("add", ledger_id, entry_id, bytes(data)))

    def add_entries(self, ledger_ids, entry_ids, datas) -> int:
        """The batch form the bookie core uses: one ticket covering every entry."""
        ticket = 0
        for ledger_id, entry_id, data in zip(ledger_ids, entry_ids, datas, strict=True):
            ticket = self.add_entry(ledger_id, entry_id, data)
        return ticket

    def read_entry(self, ledger_id: int, entry_id: int) -> bytes:
        ledger = self._get(ledger_id)
        try:
            return ledger.entries[entry_id]
        except KeyError:
            raise NoSuchEntryError(f"ledger {ledger_id} has no entry {entry_id}") from None

    def last_entry_id(self, ledger_id: int) -> int:
        entries = self._get(ledger_id).entries
        return max(entries) if entries else -1

    def ledger_exists(self, ledger_id: int) -> bool:
        return ledger_id in self._live

    def ledgers(self) -> list[int]:
        return sorted(self._live)

    def set_master_key(self, ledger_id: int, key: bytes) -> int:
        return self._op(("key", ledger_id, bytes(key)))

    def get_master_key(self, ledger_id: int) -> bytes | None:
        return self._get(ledger_id).key

    def fence(self, ledger_id: int) -> int:
        return self._op(("fence", ledger_id))

    def is_fenced(self, ledger_id: int) -> bool:
        return self._get(ledger_id).fenced

    def admission(self, ledger_id: int) -> tuple[bool, bytes | None, bool]:
        led = self._live.get(ledger_id)
        return (False, None, False) if led is None else (True, led.key, led.fenced)

    def mark_limbo(self, ledger_id: int) -> int:
        return self._op(("limbo", ledger_id, True))

    def clear_limbo(self, ledger_id: int) -> int:
        return self._op(("limbo", ledger_id, False))

    def is_limbo(self, ledger_id: int) -> bool:
        return self._get(ledger_id).limbo

    def set_explicit_lac(self, ledger_id: int, lac: int) -> None:
        self._get(ledger_id).explicit_lac = lac

    def get_explicit_lac(self, ledger_id: int) -> int:
        return self._get(ledger_id).explicit_lac

    def write_close(self, ledger_id: int) -> bool:
        self.write_closes.append(ledger_id)
        return True

    def delete_ledger(self, ledger_id: int) -> None:
        self._op(("delete", ledger_id))

    def _get(self, ledger_id: int) -> _Ledger:
        try:
            return self._live[ledger_id]
        except KeyError:
            raise NoSuchLedgerError(f"no ledger {ledger_id}") from None
