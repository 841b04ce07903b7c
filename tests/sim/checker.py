"""The invariants of BookKeeper's TLA+ model, checked after every step.

Each check is triggered by the change that could break it (an ack, a crash
that lost data, a metadata write, a read) and runs at the end of that step:

``acked-lost``       every entry up to the highest acknowledged one (the
                     writer's LAC, or the end a close fixed) is stored on at
                     least one bookie of its write set in the current metadata.
``no-divergence``    once CLOSED, the last entry is >= the LAC of the writer and
                     of every reader; ``ack-after-close`` is the same failure
                     when the writer acknowledges an entry after the close (a
                     fenced writer acknowledged something recovery cut off).
``one-close``        no metadata write after CLOSED; every reported close or
                     recovery names the one closed end.
``out-of-order``     a bookie stores entry i only with the writer's record for i.
``readers-disagree`` every payload a reader gets is the writer's payload for that id.
``phantom-lac``      no reader sees a LAC the writer never had.
``closed-quorum``    (journal mode: no acknowledged data can be lost) every entry
                     of a closed ledger is durable on >= Qa bookies of its write set.
``fragments``        new fragments never start before the last one; an earlier
                     (sealed) fragment changes only by re-replication: the same
                     start and size, bookies replaced one for one.
``repoint-durable``  at the metadata write that puts a bookie into a sealed
                     fragment, it durably holds that position's share of the
                     fragment (every acknowledged entry of it in its write set).
``placement``        the first ensemble meets the host rule (every write set on
                     distinct hosts) whenever the bookies allow it, and every
                     replacement the writer, a recovery or a re-replicator
                     picks shares no host with the write sets holding its
                     position whenever one of its candidates did not.
``acked-sent``       while the ledger is OPEN, every entry the writer has
                     acknowledged in the last fragment was sent by a client to
                     (or is held by) every bookie of its write set there: an
                     ensemble change never names a replacement for an entry
                     that no one will give it (an entry confirmed while the
                     change was in flight would stay a copy short for good).
``refused-kept``     (while OPEN) no entry the writer first sent after a bookie's
                     refusal of an add reached it (read-only, I/O error, ...;
                     not a timeout, a fence or a wrong key, which stop it) is
                     acknowledged with that bookie still in its write set: a
                     refusing bookie is replaced, even when its refusal came
                     after the ack quorum (it stores nothing, so every later
                     entry would be a copy short).
``short-healed``     (the delayed ensemble change) when the writer reports its
                     own close done (and had not stopped before), every bookie
                     of the closed ledger's last ensemble that is up, reachable
                     from the writer and not in limbo holds every entry of its
                     share (a bookie down at any time since close() was called
                     is not checked: it may have been out of the registry when
                     the close stopped waiting): entries acknowledged
                     without it (it lagged, or was slow past the ack quorum)
                     were re-sent once it answered, before the close.  Where the
                     writer skips a lagging bookie, ``acked-sent`` and
                     ``refused-kept`` accept it for the entries the writer
                     still holds for that bookie (``owed``: its obligation to
                     heal them, which this rule checks).
``short-scrubbed``   (at the end: faults healed, the ledger closed, a few scrub
                     intervals later) every bookie of the closed ledger holds
                     every entry of its share, whoever closed it: entries a
                     writer left short and could not heal (it died, or
                     recovery closed the ledger) were found by the bookie's
                     scrub and repaired from peers (``appliance.protocol.scrub``).
``read-needs-key``   no bookie answers a read carrying another key than the
                     ledger's (or none, while the bookie's ``reads_need_key``)
                     with entry bytes (``appliance.protocol.read_access``).
``read-negative``    a reader's "no such entry" is backed, for some entry of the
                     range, by an explicit negative from every replica of its
                     write set (in the reader's metadata): BP-46's rule, also
                     when speculative reads race (the answers a reader's core
                     received are counted here, not by the core).
"""

from __future__ import annotations

from appliance.errors import (
    OK,
    BKTimeoutError,
    LedgerFencedError,
    UnauthorizedError,
    is_explicit_negative,
)
from appliance.protocol import events as ev
from appliance.protocol.entry import HEADER_BYTES
from appliance.protocol.metadata import CLOSED, OPEN
from appliance.protocol.placement import ensemble_possible, meets_rule
from appliance.protocol.repair import share_runs
from tests.sim.world import Violation

# reply codes that are not a bookie refusing an add: success, no answer (the
# tick decides), and the two that stop the writer instead of replacing one
_NOT_REFUSALS = frozenset((OK, BKTimeoutError.code, LedgerFencedError.code,
                           UnauthorizedError.code))


class Checker:
    def __init__(self, world, ledger_id: int, digest_size: int, journal: bool):
        self.world = world
        self.ledger_id = ledger_id
        self.payload_offset = HEADER_BYTES + digest_size
        self.journal = journal
        self.meta = None  # set by the cluster
        self.bookies: dict[str, object] = {}
        self.records: dict[int, bytes] = {}  # entry id -> the writer's record
        self.writer_lac = -1
        self.closed = None  # the CLOSED metadata, once written
        self.reader_lacs: dict[str, int] = {}
        self.reads_checked = 0
        self.placement_choices = 0  # replacements checked by the placement invariant
        self.master_key = None  # the ledger's key (set by the cluster): read-needs-key
        self.reads_refused = 0  # reads bookies refused for their key (the rule at work)
        self._to_check: set[int] = set()
        self._check_all = False
        self.sent: dict[int, set[str]] = {}  # entry id -> bookies a client sent it to
        self._seq = 0  # orders the writer's first sends and the refusals it got
        self.first_sent: dict[int, int] = {}  # entry id -> _seq of the writer's first send
        self.refused_at: dict[str, int] = {}  # bookie -> _seq of its first refusal the
        #                                       writer got since it (re)joined the ensemble
        self.joined_at: dict[str, int] = {}  # bookie -> _seq it last (re)joined the ensemble
        self.request_seq: dict[int, int] = {}  # the writer's add request id -> _seq sent
        self._sent_to_check: set[int] = set()  # acked-sent, at the end of the step
        # (reader, entry id) -> bookies that answered it an explicit negative
        self.read_negatives: dict[tuple[str, int], set[str]] = {}
        self.read_negatives_checked = 0  # negative reads found backed by every replica
        # (bookie, entry id) -> whether the writer holds that entry to re-send to
        # that bookie (set by the cluster: the writer's heal obligation)
        self.owed = lambda bookie, entry_id: False
        self.reachable = lambda a, b: True  # set by the cluster: the network's view
        self.heal_checks = 0  # writer closes checked by short-healed
        self.last_down_ms: dict[str, int] = {}  # bookie -> when it last went down
        self.last_up_ms: dict[str, int] = {}  # bookie -> when it last came back
        world.after_step.append(self.after_step)

    def fail(self, name: str, detail: str) -> None:
        self.world.log(f"VIOLATION {name}: {detail}")
        raise Violation(name, detail)

    @property
    def acked_max(self) -> int:
        closed_last = self.closed.last_entry_id if self.closed is not None else -1
        return max(self.writer_lac, closed_last)

    def payload(self, entry_id: int) -> bytes:
        return self.records[entry_id][self.payload_offset:]

    # -- hooks -------------------------------------------------------------------------
    def on_new_ensemble(self, md, bookies, locations) -> None:
        ensemble, qw = md.last_fragment[1], md.write_quorum
        if ensemble_possible(bookies, locations, len(ensemble), qw) \
                and not meets_rule(ensemble, qw, locations):
            self.fail("placement", f"first ensemble {list(ensemble)} puts a write set of {qw} "
                                   f"on one host while {bookies} allowed distinct ones")

    def on_placement(self, choice) -> None:
        """A replacement (``placement.Choice``) as its chooser saw it."""
        self.placement_choices += 1
        problem = choice.problem()
        if problem is not None:
            self.fail("placement", problem)

    def on_record(self, action) -> None:
        """Every SendAdd a client makes: the writer's first record for an id
        is canonical; no record for that id may ever differ."""
        sent, bookie = self.sent, action.bookie_id
        self._seq += 1
        if not action.recovery:
            self.request_seq[action.request_id] = self._seq
        for entry_id, data in zip(action.entry_ids, action.datas, strict=True):
            sent.setdefault(entry_id, set()).add(bookie)
            if not action.recovery:
                self.first_sent.setdefault(entry_id, self._seq)
            known = self.records.get(entry_id)
            if known is None:
                if action.recovery:
                    self.fail("out-of-order", f"recovery wrote entry {entry_id} that the "
                                              f"writer never made")
                self.records[entry_id] = data
            elif known != data:
                self.fail("out-of-order", f"two different records sent as entry {entry_id}")

    def on_store(self, bookie: str, ledger_id: int, entry_id: int, data: bytes) -> None:
        if self.records.get(entry_id) != data:
            self.fail("out-of-order", f"{bookie} stores as entry {entry_id} a record that is "
                                      f"not the writer's entry {entry_id}")

    def on_writer_ack(self, first: int, last: int) -> None:
        self.writer_lac = max(self.writer_lac, last)
        if self.closed is not None and last > self.closed.last_entry_id:
            self.fail("ack-after-close", f"writer acknowledged entries {first}..{last} after "
                                         f"the ledger was closed at {self.closed.last_entry_id}")
        self._to_check.update(range(first, last + 1))
        self._sent_to_check.update(range(first, last + 1))

    def on_writer_reply(self, bookie: str, msg) -> None:
        """A reply reaching the writer: note a bookie's first refusal of an add
        sent since it last joined the ensemble (a late refusal from an
        earlier stay is stale to the writer too)."""
        codes = (msg.code,) if type(msg) is ev.AddResponse else \
            msg.codes if type(msg) is ev.AddResponses else ()
        self._seq += 1
        sent = self.request_seq.get(msg.request_id)
        if bookie not in self.refused_at and sent is not None \
                and sent > self.joined_at.get(bookie, 0) \
                and any(c not in _NOT_REFUSALS for c in codes):
            self.refused_at[bookie] = self._seq

    def on_data_loss(self, bookie: str, lost: dict[int, set[int]]) -> None:
        limit = self.acked_max
        self._to_check.update(e for e in lost.get(self.ledger_id, ()) if e <= limit)
        if self.journal and self.closed is not None and lost.get(self.ledger_id):
            self._check_closed_quorum(lost[self.ledger_id])

    def on_limbo_cleared(self, bookie: str, ledger_id: int, md) -> None:
        """BP-46 repair: a bookie clears limbo only holding (durably) every
        entry of its share of the closed ledger; its explicit negatives are
        trusted again from here, and it may be the last copy."""
        if ledger_id != self.ledger_id or md.state != CLOSED:
            return
        storage = self.bookies[bookie].storage
        for first, last in share_runs(md, bookie):
            for entry_id in range(first, last + 1):
                if not storage.durable_has(ledger_id, entry_id):
                    self.fail("repair-incomplete", f"{bookie} cleared limbo without entry "
                                                   f"{entry_id} of its share (closed at "
                                                   f"{md.last_entry_id})")

    def on_metadata(self, old, new) -> None:
        if old.state == CLOSED:
            self.fail("one-close", f"metadata rewritten after CLOSED at {old.last_entry_id}")
        kept = len(old.ensembles) - 1
        if len(new.ensembles) < kept or any(
                a[0] != b[0] or len(a[1]) != len(b[1])
                for a, b in zip(old.ensembles[:kept], new.ensembles[:kept], strict=True)) \
                or any(first < old.last_fragment[0] for first, _ in new.ensembles[kept:]):
            self.fail("fragments", f"fragments {old.ensembles} became {new.ensembles}")
        for index in range(kept):
            if new.ensembles[index] != old.ensembles[index]:
                self._check_repointed(new, index, old.ensembles[index][1])
        if new.ensembles != old.ensembles:
            self._check_all = True
        if new.state == OPEN and new.last_fragment != old.last_fragment:
            # a new last fragment, or the last one redone at its start (nothing
            # of it was acknowledged yet): the writer's ensemble change
            self._sent_to_check.update(range(new.last_fragment[0], self.writer_lac + 1))
            self._seq += 1
            for bookie in set(new.last_fragment[1]) - set(old.last_fragment[1]):
                self.refused_at.pop(bookie, None)  # (re)joined: earlier refusals are moot
                self.joined_at[bookie] = self._seq
        if new.state == CLOSED:
            self.closed = new
            self._check_all = True
            self._check_lacs()
            if self.journal:
                self._check_closed_quorum(range(new.last_entry_id + 1))

    def _check_repointed(self, md, index: int, before: tuple[str, ...]) -> None:
        """A sealed fragment re-pointed: each newcomer must already hold, durably,
        its position's share of the fragment's acknowledged entries."""
        first, ensemble = md.ensembles[index]
        end = min(md.ensembles[index + 1][0] - 1, self.acked_max)
        size, quorum = md.ensemble_size, md.write_quorum
        for position, bookie in enumerate(ensemble):
            if bookie == before[position]:
                continue
            storage = self.bookies[bookie].storage
            for entry_id in range(first, end + 1):
                if (position - entry_id) % size < quorum \
                        and not storage.durable_has(self.ledger_id, entry_id):
                    self.fail("repoint-durable", f"{bookie} replaced {before[position]} in the "
                                                 f"fragment at {first} without entry "
                                                 f"{entry_id} of its share")

    def on_close_reported(self, who: str, last_entry_id: int) -> None:
        if self.closed is None or self.closed.last_entry_id != last_entry_id:
            closed = self.closed.last_entry_id if self.closed is not None else "not closed"
            self.fail("one-close", f"{who} reports the ledger closed at {last_entry_id}, "
                                   f"metadata says {closed}")

    def on_rejoin(self, bookie: str) -> None:
        """The writer takes a lagging bookie back (it answered again): as if it
        (re)joined the ensemble, for ``refused-kept``."""
        self._seq += 1
        self.joined_at[bookie] = self._seq
        self.refused_at.pop(bookie, None)

    def on_writer_closed(self, md, close_called_ms: int) -> None:
        """``short-healed``: the writer's own close is done.  A bookie that
        was down at any time since ``close()`` was called may have been out
        of the registry when the close decided not to wait: not checked."""
        self.heal_checks += 1
        for bookie in md.last_fragment[1]:
            node = self.bookies[bookie]
            if max(self.last_down_ms.get(bookie, -1),
                   self.last_up_ms.get(bookie, -1)) >= close_called_ms:
                continue
            if not node.up or not self.reachable("writer", bookie) \
                    or (node.storage.ledger_exists(self.ledger_id)
                        and node.storage.is_limbo(self.ledger_id)):
                continue
            for first, last in share_runs(md, bookie):
                for entry_id in range(first, last + 1):
                    if not node.storage.has(self.ledger_id, entry_id):
                        self.fail("short-healed", f"the writer closed the ledger at "
                                  f"{md.last_entry_id}, but {bookie} (up, reachable) lacks "
                                  f"entry {entry_id} of its share")

    def check_scrubbed(self, md) -> None:
        """``short-scrubbed`` (see the module docstring)."""
        for bookie in md.bookies():
            node = self.bookies[bookie]
            for first, last in share_runs(md, bookie):
                for entry_id in range(first, last + 1):
                    if not node.storage.has(self.ledger_id, entry_id):
                        self.fail("short-scrubbed", f"healed and closed at {md.last_entry_id}, "
                                  f"but {bookie} still lacks entry {entry_id} of its share")

    def on_reader_lac(self, reader: str, lac: int) -> None:
        if lac <= self.reader_lacs.get(reader, -1):
            return
        self.reader_lacs[reader] = lac
        if lac > self.writer_lac and (self.closed is None or lac > self.closed.last_entry_id):
            self.fail("phantom-lac", f"{reader} sees LAC {lac}; the writer's is {self.writer_lac}")
        self._check_lacs()

    def on_read(self, reader: str, first: int, payloads) -> None:
        for offset, payload in enumerate(payloads):
            entry_id = first + offset
            if entry_id not in self.records or bytes(payload) != self.payload(entry_id):
                self.fail("readers-disagree", f"{reader} read entry {entry_id} with a payload "
                                              f"the writer did not write as {entry_id}")
        self.reads_checked += len(payloads)

    def on_reader_reply(self, reader: str, bookie: str, msg) -> None:
        """A reply reached a reader's core: remember each explicit negative."""
        if isinstance(msg, ev.ReadResponse):
            rows = ((msg.entry_id, msg.code),)
        elif isinstance(msg, ev.ReadBatchResponse):
            rows = zip(msg.entry_ids, msg.codes, strict=False)
        else:
            return
        for entry_id, code in rows:
            if is_explicit_negative(code):
                self.read_negatives.setdefault((reader, entry_id), set()).add(bookie)

    def on_read_negative(self, reader: str, first: int, last: int, md) -> None:
        """BP-46 on reads: a reader answers "no such entry" only when every
        replica of some entry of the range (in the reader's metadata) said
        so itself; a race won by one negative (or one trusted negative) is
        caught here."""
        backed = [e for e in range(first, last + 1)
                  if set(md.write_set(e)) <= self.read_negatives.get((reader, e), set())]
        for entry_id in range(first, last + 1):
            self.read_negatives.pop((reader, entry_id), None)
        if not backed:
            self.fail("read-negative", f"{reader} read {first}..{last} as no such entry, but "
                                       "for no entry of it did every replica say so")
        self.read_negatives_checked += 1

    def on_served(self, bookie: str, msg, replies: list, reads_need_key: bool) -> None:
        """A bookie answered a read: with entry bytes only for the ledger's key."""
        key = msg.master_key
        if self.master_key is None or key == self.master_key:
            return
        if not key and not reads_need_key:
            return  # BookKeeper's mode: keyless reads are served
        for reply in replies:
            datas = reply.datas if isinstance(reply, ev.ReadBatchResponse) else (
                getattr(reply, "data", None),)
            if any(d is not None for d in datas):
                self.fail("read-needs-key", f"{bookie} answered a read of entry "
                                            f"{getattr(msg, 'entry_id', None)} carrying "
                                            f"{'a wrong key' if key else 'no key'} with data")
            codes = getattr(reply, "codes", None) or (reply.code,)
            self.reads_refused += UnauthorizedError.code in codes

    # -- checks ---------------------------------------------------------------------------
    def _check_lacs(self) -> None:
        if self.closed is None:
            return
        last = self.closed.last_entry_id
        if self.writer_lac > last:
            self.fail("no-divergence", f"closed at {last} but the writer acknowledged "
                                       f"up to {self.writer_lac}")
        for reader, lac in self.reader_lacs.items():
            if lac > last:
                self.fail("no-divergence", f"closed at {last} but {reader} saw LAC {lac}")

    def after_step(self) -> None:
        if self._sent_to_check:
            self._check_acked_sent()
        if self._check_all:
            self._check_all = False
            self._to_check.update(range(self.acked_max + 1))
        if not self._to_check:
            return
        md = self.meta.get(self.ledger_id)[0]
        for entry_id in sorted(self._to_check):
            holders = [b for b in md.write_set(entry_id)
                       if self.bookies[b].storage.has(self.ledger_id, entry_id)]
            if not holders:
                self._to_check.clear()
                self.fail("acked-lost", f"acknowledged entry {entry_id} is on no bookie of "
                                        f"its write set {list(md.write_set(entry_id))}")
        self._to_check.clear()

    def _check_acked_sent(self) -> None:
        """``acked-sent`` and ``refused-kept``."""
        entry_ids, self._sent_to_check = self._sent_to_check, set()
        md = self.meta.get(self.ledger_id)[0]
        if md.state != OPEN:
            return
        start, refused_at = md.last_fragment[0], self.refused_at
        for entry_id in sorted(e for e in entry_ids if start <= e <= self.writer_lac):
            sent = self.sent.get(entry_id, ())
            write_set = md.write_set(entry_id)
            missing = [b for b in write_set if b not in sent
                       and not self.bookies[b].storage.has(self.ledger_id, entry_id)
                       and not self.owed(b, entry_id)]
            if missing:
                self.fail("acked-sent", f"acknowledged entry {entry_id} is in the fragment at "
                                        f"{start} on {missing}, which were never sent it")
                return
            first = self.first_sent.get(entry_id)
            kept = [b for b in write_set if first is not None and refused_at.get(b, first) < first
                    and not self.owed(b, entry_id)
                    and not self.bookies[b].storage.has(self.ledger_id, entry_id)]
            if kept:
                self.fail("refused-kept", f"acknowledged entry {entry_id}, first sent after "
                                          f"{kept} refused an add, with them in its write set")
                return

    def _check_closed_quorum(self, entry_ids) -> None:
        md = self.closed
        for entry_id in entry_ids:
            if entry_id > md.last_entry_id:
                continue
            durable = sum(1 for b in md.write_set(entry_id)
                          if self.bookies[b].storage.durable_has(self.ledger_id, entry_id))
            if durable < md.ack_quorum:
                self.fail("closed-quorum", f"entry {entry_id} of the closed ledger is durable "
                                           f"on {durable} < Qa={md.ack_quorum} bookies")
