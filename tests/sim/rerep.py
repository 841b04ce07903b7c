"""Re-replication of an OPEN ledger's sealed fragments while its writer keeps
writing, in the simulation (what ``Rereplicator.recover_ledger(...,
sealed_only=True)`` and autorecovery do).

``SealedRereplicator`` picks a fragment that is not the ledger's last and a
bookie B it names (preferably one that is down), plans B's share with the
product's pure code (``plan_sealed``: the entries whose write set holds B's
position), picks a replacement R outside that fragment's ensemble, reads
each entry of the share from a surviving replica over the simulated network
(failing over, retrying lost messages), writes it to R as a recovery add,
and only once R acknowledged every copy (R answers once durable) CASes the
metadata with ``replace_bookie``.  The writer must adopt that change (its
CAS conflicts are on sealed fragments only) and go on writing, unfenced.

``broken=True`` re-points before copying: the checker's ``repoint-durable``
invariant (or ``acked-lost``) must catch it.
"""

from __future__ import annotations

import itertools
import random

from appliance.errors import OK
from appliance.protocol import events as ev
from appliance.protocol.metadata import CLOSED
from appliance.protocol.placement import Choice, choose_for_position
from appliance.protocol.rereplication_plan import StalePlanError, plan_sealed, replace_bookie

RETRY_MS = 60  # a copy request without an answer by then is asked again
ATTEMPTS_MAX = 40


class SealedRereplicator:
    def __init__(self, cluster, start_ms: int, rng: random.Random, broken: bool = False,
                 index: int = 0):
        self.c, self.rng, self.broken = cluster, rng, broken
        self.name = f"rereplicator-{index + 1}"
        self.ids = itertools.count(1)
        self.plan = None
        self.replacement = None
        self.pending: dict[int, tuple] = {}  # request id -> (kind, entry id, source index)
        self.copies: dict[int, bytes] = {}  # entry -> record read
        self.acked: set[int] = set()
        self.entries: list[int] = []
        self.attempts = 0
        self.done = False
        self.provoked = False
        self.writer_lac_at_repoint = None
        self.writer_close_asked = False
        self.outcome = "idle"
        cluster.world.nodes[self.name] = self
        cluster.world.at(start_ms, self.begin)

    # -- planning ------------------------------------------------------------------------
    def begin(self) -> None:
        c = self.c
        if c.healed:
            return
        md, _ = c.meta.get(c.ledger_id)
        if md.state == CLOSED:
            self.outcome = "ledger closed first"
            return
        up = {n for n, b in c.bookies.items() if b.up}
        choices = []
        for bookie in sorted(md.bookies()):
            for plan in plan_sealed(md, bookie):
                if plan.entry_count() and any(b not in plan.ensemble for b in up):
                    choices.append((bookie not in up, plan))
        if not choices:
            spare = up - set(md.last_fragment[1])
            if not self.provoked and spare and len(up) - 1 >= md.ensemble_size \
                    and not getattr(c, "rereplication_provoked", False):
                # make the writer change its ensemble (once per run; enough left up)
                self.provoked = c.rereplication_provoked = True
                victim = self.rng.choice(sorted(set(md.last_fragment[1]) & up) or [None])
                if victim is not None:  # down for longer than an add may wait
                    c.world.log(f"{self.name}: crash {victim} to seal a fragment")
                    c.crash(victim, self.rng.randint(3, 6) * c.cfg.add_timeout_ms)
            c.world.schedule(50, self.begin)  # no sealed fragment yet: look again later
            return
        down_first = [p for down, p in choices if down] or [p for _, p in choices]
        self.plan = self.rng.choice(down_first)
        self.replacement = self._choose_replacement(up)
        self.entries = [e for first, last in self.plan.runs() for e in range(first, last + 1)]
        c.world.log(f"rereplicator: fragment {self.plan.first_entry_id}.."
                    f"{self.plan.last_entry_id} {self.plan.lost} -> {self.replacement} "
                    f"({len(self.entries)} entries)" + (" BROKEN: re-point first" if self.broken
                                                       else ""))
        if self.broken:
            self._repoint()
        self._copy_round()

    def _choose_replacement(self, up: set[str]) -> str:
        """Host-aware, as the product's ``choose_replacement`` (a random
        candidate with the ``placement`` protection off); the checker sees it."""
        plan, c = self.plan, self.c
        candidates = sorted(b for b in up if b not in plan.ensemble)
        self.rng.shuffle(candidates)
        pick = candidates[0]
        if c.protections.placement:
            pick = choose_for_position(plan.ensemble, plan.write_quorum, plan.position,
                                       candidates, c.locations)
        after = tuple(pick if b == plan.lost else b for b in plan.ensemble)
        c.checker.on_placement(Choice(after, plan.write_quorum, plan.position,
                                      tuple(candidates), c.locations))
        return pick

    # -- copying ------------------------------------------------------------------------
    def _copy_round(self) -> None:
        if self.done or self.c.healed:
            return
        self.attempts += 1
        if self.attempts > ATTEMPTS_MAX:
            self.outcome = "gave up"
            self.done = True
            return
        for entry_id in self.entries:
            if entry_id in self.acked:
                continue
            if entry_id in self.copies:
                self._send_add(entry_id)
            else:
                sources = self.plan.sources(entry_id)
                source = sources[self.attempts % len(sources)] if sources else None
                if source is not None:
                    rid = next(self.ids)
                    self.pending[rid] = ("read", entry_id)
                    self.c.world.net.send(self.name, source, ev.SendRead(
                        rid, source, self.c.ledger_id, entry_id, False, self.c.master_key))
        self.c.world.schedule(RETRY_MS, self._copy_round)

    def _send_add(self, entry_id: int) -> None:
        rid = next(self.ids)
        self.pending[rid] = ("add", entry_id)
        self.c.world.net.send(self.name, self.replacement, ev.SendAdd(
            rid, self.replacement, self.c.ledger_id, (entry_id,), (self.copies[entry_id],),
            True, self.c.master_key))

    def receive(self, src: str, msg) -> None:
        if isinstance(msg, ev.MetadataWritten):
            self._cas_done(msg)
            return
        found = self.pending.pop(msg.request_id, None)
        if found is None or self.done:
            return
        kind, entry_id = found
        if kind == "read" and isinstance(msg, ev.ReadResponse):
            if msg.code == OK and msg.data == self.c.checker.records.get(entry_id):
                self.copies.setdefault(entry_id, msg.data)
                self._send_add(entry_id)
        elif kind == "add" and isinstance(msg, ev.AddResponse | ev.AddResponses):
            codes = msg.codes if isinstance(msg, ev.AddResponses) else (msg.code,)
            if all(code == OK for code in codes):
                self.acked.add(entry_id)
                if len(self.acked) == len(self.entries) and not self.broken:
                    self._repoint()

    # -- the CAS ------------------------------------------------------------------------
    def _repoint(self) -> None:
        c = self.c
        md, version = c.meta.get(c.ledger_id)
        if md.state == CLOSED:
            self.outcome, self.done = "ledger closed first", True
            return
        try:
            new = replace_bookie(md, self.plan, self.replacement)
        except StalePlanError as exc:
            self.outcome, self.done = f"stale plan ({exc})", True
            return
        if new is None:
            self.outcome, self.done = "already re-pointed", True
            return
        c.meta.request(self, ev.WriteMetadata(next(self.ids), c.ledger_id, new, version))

    def _writer_cas(self) -> None:
        """Make the writer write metadata over the version it knows, which
        our CAS made stale: it must adopt the re-pointed fragment and retry
        (an ensemble change after a crash, or its close), never count itself
        fenced."""
        c = self.c
        md, _ = c.meta.get(c.ledger_id)
        if c.healed or md.state == CLOSED or c.writer.host.dead:
            return
        up = {n for n, b in c.bookies.items() if b.up}
        last = sorted(set(md.last_fragment[1]) & up)
        if self.rng.random() < 0.5 and last and len(up) - 1 >= md.ensemble_size:
            victim = self.rng.choice(last)
            c.world.log(f"{self.name}: crash {victim}: the writer changes its ensemble "
                        "over a stale version")
            c.crash(victim, self.rng.randint(3, 6) * c.cfg.add_timeout_ms)
        else:
            c.world.log(f"{self.name}: the writer closes over a stale version")
            self.writer_close_asked = True
            c.writer.close()

    def _cas_done(self, msg: ev.MetadataWritten) -> None:
        if msg.code == OK:
            self.outcome = "re-pointed"
            self.writer_lac_at_repoint = self.c.checker.writer_lac
            self.c.repointed_sealed += 1
            if not self.broken:
                self.done = True
                self.c.world.schedule(self.rng.randint(1, 30), self._writer_cas)
        elif not self.done:
            self.c.world.schedule(5, self._repoint)  # a conflict: plan against the new version
