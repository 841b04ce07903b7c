"""Hand-driving a protocol core: build metadata, pick actions, answer them."""

from __future__ import annotations

import dataclasses

from appliance.checks.digest import make_digest, master_key, password_hash
from appliance.protocol import events as ev
from appliance.protocol.metadata import LedgerMetadata

KEY = master_key(b"pw")
DIGEST = make_digest("crc32c", KEY)


def metadata(ensemble=("b1", "b2", "b3"), write_quorum=3, ack_quorum=2, **kw) -> LedgerMetadata:
    return LedgerMetadata(1, len(ensemble), write_quorum, ack_quorum, ((0, tuple(ensemble)),),
                          password_hash=password_hash(KEY), **kw)


def of(kind, actions) -> list:
    return [a for a in actions if isinstance(a, kind)]


def one(kind, actions):
    found = of(kind, actions)
    assert len(found) == 1, f"expected one {kind.__name__}, got {actions}"
    return found[0]


def adds_by_bookie(actions) -> dict[str, list[int]]:
    """Entry ids sent to each bookie (over all SendAdd actions)."""
    sent: dict[str, list[int]] = {}
    for a in of(ev.SendAdd, actions):
        sent.setdefault(a.bookie_id, []).extend(a.entry_ids)
    return {b: sorted(ids) for b, ids in sent.items()}


def ack(core, send: ev.SendAdd, code: int = 0, entries=None, now_ms: int = 0) -> list:
    """Answer a SendAdd (all its entries, or ``entries``) with ``code``."""
    out = []
    for entry_id in entries if entries is not None else send.entry_ids:
        out += core.handle(ev.AddResponse(send.request_id, send.bookie_id, send.ledger_id,
                                          entry_id, code, now_ms))
    return out


class Loop:
    """Carries out a core's actions at once against real ``BookieCore``s and a
    dict CAS store: the smallest driver, for unit tests.  ``down`` bookies and
    ``drop(action)`` swallow requests (their timers must then be fired by the
    test); results (CompleteAdds, OpenDone, ...) collect in ``results``."""

    def __init__(self, md: LedgerMetadata, bookies=("b1", "b2", "b3", "b4", "b5")):
        from appliance.protocol.bookie import BookieCore
        from tests.sim.storage import MemStorage

        self.bookies = {b: BookieCore(MemStorage()) for b in bookies}
        self.meta = {md.ledger_id: (md, 1)}
        self.down: set[str] = set()
        self.drop = lambda action: False
        self.results: list = []
        self.timers: list[ev.SetTimer] = []
        self.sent: list = []
        self.now_ms = 0  # replies are stamped with it; fire_timers advances it

    def run(self, core, actions) -> list:
        queue = list(actions)
        while queue:
            action = queue.pop(0)
            reply = self._carry_out(action)
            for event in (reply if isinstance(reply, list) else [reply] if reply else []):
                queue += core.handle(dataclasses.replace(event, now_ms=self.now_ms))
        return self.results

    def fire_timers(self, core, now_ms: int) -> None:
        self.now_ms = now_ms
        timers, self.timers = self.timers, []
        for timer in timers:
            self.run(core, core.handle(ev.TimerFired(timer.timer_id, now_ms)))

    def _carry_out(self, a):
        if isinstance(a, ev.SetTimer):
            self.timers.append(a)
            return None
        if isinstance(a, ev.RESULT_ACTIONS):
            self.results.append(a)
            return None
        self.sent.append(a)
        if isinstance(a, ev.WriteMetadata):
            md, version = self.meta[a.ledger_id]
            if version != a.expected_version:
                return ev.MetadataWritten(a.request_id, a.ledger_id, 21)
            self.meta[a.ledger_id] = (a.metadata, version + 1)
            return ev.MetadataWritten(a.request_id, a.ledger_id, 0, version + 1)
        if isinstance(a, ev.ReadMetadata):
            md, version = self.meta[a.ledger_id]
            return ev.MetadataRead(a.request_id, a.ledger_id, 0, md, version)
        if a.bookie_id in self.down or self.drop(a):
            return None
        return self._bookie_reply(self.bookies[a.bookie_id], a)

    @staticmethod
    def _bookie_reply(bookie, a):
        if isinstance(a, ev.SendAdd):  # one reply event per entry: answer the first
            codes, _ = bookie.add_batch(a.ledger_id, a.entry_ids, a.datas, a.master_key,
                                        a.recovery)
            return _MultiReply([ev.AddResponse(a.request_id, a.bookie_id, a.ledger_id, e, c)
                                for e, c in zip(a.entry_ids, codes, strict=True)])
        if isinstance(a, ev.SendRead):
            r = bookie.read(a.ledger_id, a.entry_id, a.fence, a.master_key)
            return ev.ReadResponse(a.request_id, a.bookie_id, a.ledger_id, a.entry_id, r.code,
                                   r.data)
        if isinstance(a, ev.SendReadLac):
            r = bookie.read_lac(a.ledger_id, a.fence, a.master_key)
            return ev.ReadLacResponse(a.request_id, a.bookie_id, a.ledger_id, r.code, r.lac)
        if isinstance(a, ev.SendWriteClose):
            bookie.write_close(a.ledger_id, a.master_key)
            return None
        bookie.write_lac(a.ledger_id, a.lac, a.master_key)
        return None


class _MultiReply(list):
    """Several reply events for one request (a batched add)."""
