"""Re-replication of a lost bookie's data (``bkctl bookie recover``).

For a bookie B that is gone (dead disk, retired host), every ledger fragment
naming B is one copy short.  ``Rereplicator.recover(B)`` restores the write
quorum: for each CLOSED ledger naming B and each fragment naming B, it picks
a live writable replacement R outside that fragment's ensemble, copies every
entry of the fragment whose write set contains B from a surviving replica to
R, and only then re-points the fragment at R with a compare-and-swap.

Safety argument (durability is the product):

* **Never remove B before its entries are durable elsewhere.**  Entries go to
  R as recovery adds (accepted by a closed, fenced ledger) carrying the
  ledger's master key; R answers an ADD_PACKED only once the batch is durable
  (journal fsync).  The CAS that drops B from the fragment is issued only
  after every batch of that fragment was acknowledged OK by R.
* **Nothing unverified is copied.**  Each record read from a replica has its
  digest, ledger id and entry id checked (``verify_run``) before it is
  written; a bad or missing record makes the copier fail over to the next
  replica of that entry; when no replica can serve an entry the ledger is
  reported as failed and its metadata is left untouched.
* **Concurrent changes.**  The CAS transform (``replace_bookie``) only
  applies while the fragment still has exactly the planned ensemble; a
  version conflict is retried by re-reading; a changed fragment re-plans the
  ledger (at most ``REREPLICATION_REPLAN_TRIES_MAX`` times); a deleted ledger
  ends quietly.
* **Crashes and re-runs.**  A crash before the CAS leaves B in the metadata,
  so the next run copies again (re-adding an entry R already holds is
  harmless); after the CAS the fragment is done.  Running twice is a no-op.
* **Open ledgers** (OPEN / IN_RECOVERY) are skipped by default: their writer
  may still change the ensemble.  With ``recover_open`` they are first
  opened with recovery (fenced and closed by ``Client.open_ledger``).
* **Copy markers** (``appliance.rereplication.markers``): a persistent
  marker naming the replacement is created before the first copy reaches
  it and deleted only after the CAS (or after giving up), so a bookie's
  garbage collector never deletes, as over-replicated, copies that a CAS
  is about to name (the argument is in ``appliance.bookie.ledger_gc``).
* **Passwords.**  Metadata holds only a hash of the master key; ledgers whose
  hash matches none of the given passwords are skipped and reported.  The
  key found is carried by every read from a replica (bookies refuse reads
  without the ledger's key) as well as by the copies' adds.

Limits (``appliance.protocol.limits``): ``REREPLICATION_READ_BATCH_ENTRIES_MAX``
/ ``REREPLICATION_READ_BATCH_BYTES_MAX`` per read,
``REREPLICATION_WRITES_IN_FLIGHT_MAX`` unacknowledged write batches,
``REREPLICATION_REQUEST_TIMEOUT_MS`` per request,
``REREPLICATION_REPLACEMENT_TRIES_MAX`` replacements tried per fragment.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from appliance.checks.digest import make_digest
from appliance.client.write_close import WriteCloseOutcome, new_counters, reply_code
from appliance.curve import bookie_server_key
from appliance.errors import (
    OK,
    BKError,
    CorruptMetadataError,
    NoSuchLedgerError,
    error_class,
)
from appliance.meta.bookies import bookie_locations
from appliance.protocol import limits
from appliance.protocol.entry import verify_run
from appliance.protocol.invariant import invariant
from appliance.protocol.keys import master_key
from appliance.protocol.metadata import CLOSED, LedgerMetadata
from appliance.protocol.placement import host_count, shares_host
from appliance.protocol.rereplication_plan import (
    RECOVER_OPEN,
    SKIP_OPEN,
    FragmentPlan,
    StalePlanError,
    choose_replacement,
    ledger_action,
    matching_key,
    plan_ledger,
    plan_sealed,
    plan_settle,
    replace_bookie,
)
from appliance.rereplication.markers import CopyMarkers
from ipc.calls import Calls
from ipc.client import Transport
from ipc.packed import AddPackedRequest, ReadPackedRequest
from ipc.requests import WriteCloseRequest

log = logging.getLogger(__name__)

PROGRESS_ENTRIES_EVERY = 10_000  # a progress line at least this often while copying
FIRED_DRAIN_MS = 1000  # close() waits this long at most for advisory WRITE_CLOSE replies


class CopyError(Exception):
    """A fragment could not be copied: no surviving replica served an entry."""


class ReplacementError(CopyError):
    """The replacement refused (or did not acknowledge) a write."""


@dataclass
class RecoveryReport:
    """What one run did.  ``ok`` only when nothing was skipped or failed."""

    bookie_id: str
    dry_run: bool = False
    ledgers_recovered: list[int] = field(default_factory=list)
    fragments: list[dict] = field(default_factory=list)  # replaced (or planned, dry run)
    entries_copied: int = 0
    skipped: list[dict] = field(default_factory=list)  # {"ledger_id", "reason"}
    failed: list[dict] = field(default_factory=list)  # {"ledger_id", "reason"}
    sealed: list[int] = field(default_factory=list)  # open ledgers: sealed fragments done

    @property
    def ok(self) -> bool:
        return not self.skipped and not self.failed

    def to_json(self) -> dict:
        return {**asdict(self), "ok": self.ok}


def _code_name(status: int) -> str:
    return error_class(status).__name__


class Rereplicator:
    """Re-replicates the fragments of one lost bookie (see module docstring).

    ``ledgers``: a ``LedgerManager``; ``registry``: a ``BookieRegistry``;
    ``passwords``: the candidate ledger passwords; ``key_for(metadata)``: a
    ledger's master key without a password (``KeyCustody.unseal``: automatic
    re-replication), tried after the passwords; ``open_ledger(id, key)``
    fences and closes an open ledger (``Client.open_ledger_with_key``), needed only for
    ``recover_open``; ``on_progress(line)`` receives progress lines."""

    def __init__(self, ledgers, registry, *, passwords: Sequence[bytes] = (b"",),
                 open_ledger: Callable[[int, bytes], object] | None = None,
                 key_for: Callable[[LedgerMetadata], bytes | None] | None = None,
                 on_progress: Callable[[str], None] | None = None,
                 transport: Transport | None = None,
                 request_timeout_ms: int = limits.REREPLICATION_REQUEST_TIMEOUT_MS, curve=None):
        self.ledgers = ledgers
        self._curve = curve  # appliance.curve.ClientCurve: CURVE to tcp bookies
        self.registry = registry
        self._keys = {master_key(bytes(p)): bytes(p) for p in passwords}
        self._open_ledger = open_ledger
        self._key_for = key_for
        self._progress = on_progress or (lambda line: None)
        self._own_transport = transport is None
        self._transport = transport or Transport(
            curve_keys=curve.keys if curve is not None else None)
        self._wire = Calls(self._transport, request_timeout_ms)
        self._endpoints: dict[str, str] = {}
        self._load: dict[str, int] = {}  # fragments each bookie took in this run
        self._repointed: set[int] = set()  # ledgers with a fragment re-pointed by us
        self._live: dict[str, dict] = {}
        self._copied_at_last_line = 0
        self._markers = CopyMarkers(ledgers.store)
        self.write_close_outcomes = new_counters()  # BP-32, to replacements

    def close(self) -> None:
        try:
            self._wire.drain_fired(FIRED_DRAIN_MS)  # advisory replies, briefly
        finally:
            if self._own_transport:
                self._transport.close()

    def __enter__(self) -> Rereplicator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- whole runs -----------------------------------------------------------------
    def recover(self, bookie_id: str, *, recover_open: bool = False,
                dry_run: bool = False) -> RecoveryReport:
        """Re-replicate every ledger naming ``bookie_id``; ``ValueError`` if the
        id is unknown (never registered, no cookie, named by no ledger)."""
        if recover_open and self._open_ledger is None:
            raise ValueError("recover_open needs the open_ledger callable (Client.open_ledger)")
        report = RecoveryReport(bookie_id, dry_run=dry_run)
        targets = self._ledgers_naming(bookie_id, report)
        self._check_known(bookie_id, targets)
        if bookie_id in self.registry.available():
            self._progress(f"note: {bookie_id} is still registered; its fragments are "
                           "re-replicated from the other replicas all the same")
        for done, ledger_id in enumerate(targets, 1):
            if dry_run:
                self._plan_only(ledger_id, bookie_id, recover_open, report)
            else:
                self._recover_ledger(ledger_id, bookie_id, recover_open, report)
            self._progress(f"ledgers {done}/{len(targets)} done (last: {ledger_id}), "
                           f"{report.entries_copied} entries copied")
        return report

    def recover_ledger(self, ledger_id: int, lost: str, *, recover_open: bool = False,
                       sealed_only: bool = False) -> RecoveryReport:
        """Re-replicate one ledger's fragments naming ``lost``.  ``sealed_only``:
        an OPEN ledger's sealed fragments are re-pointed and its writer goes
        on (its last fragment is left to it); ``recover_open``: it is fenced
        and closed first, then every fragment is re-pointed."""
        report = RecoveryReport(lost)
        self._recover_ledger(ledger_id, lost, recover_open, report, sealed_only=sealed_only)
        return report

    def _ledgers_naming(self, bookie_id: str, report: RecoveryReport) -> list[int]:
        """Ledger ids whose metadata names ``bookie_id``; a damaged record is
        reported as failed (the others are still re-replicated)."""
        found = []
        for ledger_id in self.ledgers.list_ledgers():
            try:
                md, _ = self.ledgers.read_ledger(ledger_id)
            except NoSuchLedgerError:
                continue  # deleted since the listing
            except CorruptMetadataError as exc:
                report.failed.append({"ledger_id": ledger_id, "reason": str(exc)})
                continue
            if bookie_id in md.bookies():
                found.append(ledger_id)
        return found

    def _check_known(self, bookie_id: str, targets: list[int]) -> None:
        if targets or bookie_id in self.registry.available():
            return
        if self.registry.read_cookie(bookie_id) is None:
            raise ValueError(f"unknown bookie id {bookie_id!r}: not registered, no cookie, "
                             "and no ledger names it")

    # -- one ledger -----------------------------------------------------------------
    def _recover_ledger(self, ledger_id: int, lost: str, recover_open: bool,
                        report: RecoveryReport, sealed_only: bool = False) -> None:
        closed_by_us = False
        for _ in range(limits.REREPLICATION_REPLAN_TRIES_MAX):
            try:
                md, _ = self.ledgers.read_ledger(ledger_id)
            except NoSuchLedgerError:
                return  # deleted meanwhile: nothing left to protect
            if lost not in md.bookies():
                if closed_by_us:  # our recovery's write-back replaced the lost bookie
                    report.ledgers_recovered.append(ledger_id)
                return
            sealed = sealed_only and md.state != CLOSED and not recover_open
            key = self._admit(md, lost, recover_open or sealed, report)
            if key is None:
                return
            if sealed:
                try:
                    self.refresh_live()
                    if all(self._recover_fragment(md, plan, key, report)
                           for plan in plan_sealed(md, lost)):
                        report.sealed.append(ledger_id)
                    return
                except StalePlanError as exc:
                    log.info("ledger %d changed while re-replicating (%s); planning again",
                             ledger_id, exc)
                    continue
                except (CopyError, BKError) as exc:
                    report.failed.append({"ledger_id": ledger_id, "reason": str(exc)})
                    return
            if md.state != CLOSED:
                if not self._close_open(ledger_id, key, report) \
                        or not self._settle(md, lost, key, report):
                    return
                closed_by_us = True
                continue  # re-read the now closed ledger
            try:
                if self._recover_closed(md, lost, key, report) \
                        and ledger_id in self._repointed:
                    report.ledgers_recovered.append(ledger_id)
                return
            except StalePlanError as exc:
                log.info("ledger %d changed while re-replicating (%s); planning again",
                         ledger_id, exc)
            except NoSuchLedgerError:
                return
            except (CopyError, BKError) as exc:
                report.failed.append({"ledger_id": ledger_id, "reason": str(exc)})
                return
        report.failed.append({"ledger_id": ledger_id, "reason": f"its fragments changed "
                              f"{limits.REREPLICATION_REPLAN_TRIES_MAX} times while "
                              "re-replicating; run again"})

    def _admit(self, md: LedgerMetadata, lost: str, recover_open: bool,
               report: RecoveryReport) -> bytes | None:
        """The ledger's master key, or None after reporting why it is skipped."""
        if ledger_action(md, recover_open) == SKIP_OPEN:
            report.skipped.append({"ledger_id": md.ledger_id, "reason": (
                f"ledger is {md.state}: its writer may still change the ensemble "
                "(close it, or pass --recover-open)")})
            return None
        key = matching_key(md, list(self._keys))
        if key is None and self._key_for is not None:
            key = self._key_for(md)
        if key is None:
            report.skipped.append({"ledger_id": md.ledger_id,
                                   "reason": "wrong password (pass its --password)"})
        return key

    def _close_open(self, ledger_id: int, key: bytes, report: RecoveryReport) -> bool:
        invariant(self._open_ledger is not None, "recover_open needs an open_ledger callable")
        try:
            self._open_ledger(ledger_id, key)
        except NoSuchLedgerError:
            return False
        except BKError as exc:
            report.failed.append({"ledger_id": ledger_id,
                                  "reason": f"could not recover the open ledger: "
                                            f"{type(exc).__name__}: {exc}"})
            return False
        self._progress(f"ledger {ledger_id}: was open; fenced and closed")
        return True

    def _settle(self, before: LedgerMetadata, lost: str, key: bytes,
                report: RecoveryReport) -> bool:
        """After our recovery closed the ledger: copy, durably, the share its
        write-back gave each bookie that took ``lost``'s place
        (``plan_settle``), since those writes were acknowledged at the ack
        quorum only.  False (reported) when a copy failed or the ledger is gone."""
        try:
            after, _ = self.ledgers.read_ledger(before.ledger_id)
        except NoSuchLedgerError:
            return False
        plans = [p for p in plan_settle(before, after, lost) if p.entry_count()]
        if not plans:
            return True
        self.refresh_live()
        for plan in plans:
            try:
                with self._markers.hold(plan.ledger_id, plan.lost):
                    copied = self._copy_fragment(after, plan, key, plan.lost, report)
            except (ReplacementError, CopyError, BKError) as exc:
                report.failed.append({"ledger_id": plan.ledger_id, "reason": (
                    f"the recovery put {plan.lost} in place of {lost} from entry "
                    f"{plan.first_entry_id}, and its share could not be made durable "
                    f"there: {exc}")})
                return False
            report.fragments.append({"ledger_id": plan.ledger_id,
                                     "first_entry_id": plan.first_entry_id,
                                     "last_entry_id": plan.last_entry_id,
                                     "replacement": plan.lost, "entries": copied,
                                     "by_recovery": True})
            self._repointed.add(plan.ledger_id)
        return True

    def _recover_closed(self, md: LedgerMetadata, lost: str, key: bytes,
                        report: RecoveryReport) -> bool:
        """True once no fragment names ``lost``; False if one was skipped or
        failed (reported) or the ledger was deleted."""
        self.refresh_live()
        return all(self._recover_fragment(md, plan, key, report)
                   for plan in plan_ledger(md, lost))

    def _recover_fragment(self, md: LedgerMetadata, plan: FragmentPlan, key: bytes,
                          report: RecoveryReport) -> bool:
        """Copy one fragment and re-point it: True when it no longer names the
        lost bookie (re-pointed by us or by another run), False when the
        ledger was skipped, failed (both reported) or deleted."""
        refusals: dict[str, str] = {}
        for _ in range(limits.REREPLICATION_REPLACEMENT_TRIES_MAX):
            writable = {b: info["read_only"] for b, info in self._live.items()
                        if b not in refusals}
            replacement = self._choose(plan, writable, md.ledger_id)
            if replacement is None:
                break
            with self._markers.hold(md.ledger_id, replacement):  # until after the CAS
                try:
                    copied = self._copy_fragment(md, plan, key, replacement, report)
                except ReplacementError as exc:
                    log.warning("ledger %d: %s; trying another replacement", md.ledger_id, exc)
                    refusals[replacement] = str(exc)
                    continue
                self._write_close(md.ledger_id, key, replacement)
                return self._repoint(plan, replacement, copied, report)
        where = f"fragment at entry {plan.first_entry_id} (ensemble {', '.join(plan.ensemble)})"
        if refusals:
            report.failed.append({"ledger_id": md.ledger_id, "reason": (
                f"no replacement took the copies of {where}: {'; '.join(refusals.values())}")})
        else:
            report.skipped.append({"ledger_id": md.ledger_id,
                                   "reason": f"no writable replacement for {where}"})
        return False

    def _write_close(self, ledger_id: int, key: bytes, replacement: str) -> None:
        """BP-32: the copies are durable on ``replacement``; tell it nothing
        more comes for the ledger (it may rotate the ledger's entry log).
        Advisory: the outcome is only logged, never waited for."""
        outcome = WriteCloseOutcome(ledger_id, [replacement], self.write_close_outcomes)
        self._wire.fire(replacement, WriteCloseRequest(ledger_id, key),
                        lambda event: outcome.done(replacement,
                                                   reply_code(event.status, event.reply)))

    def _repoint(self, plan: FragmentPlan, replacement: str, copied: int,
                 report: RecoveryReport) -> bool:
        """The CAS, after every copy is durable on ``replacement``; False if
        the ledger was deleted meanwhile."""
        try:
            md, _ = self.ledgers.update_ledger(
                plan.ledger_id, lambda m: replace_bookie(m, plan, replacement))
        except NoSuchLedgerError:
            return False
        fragment = dict(md.ensembles)[plan.first_entry_id]
        invariant(plan.lost not in fragment,
                  f"ledger {plan.ledger_id} fragment {plan.first_entry_id} still names "
                  f"{plan.lost} after the CAS")
        if replacement not in fragment:
            return True  # another run re-pointed it at another bookie first
        self._repointed.add(plan.ledger_id)
        self._load[replacement] = self._load.get(replacement, 0) + 1
        report.fragments.append({"ledger_id": plan.ledger_id,
                                 "first_entry_id": plan.first_entry_id,
                                 "last_entry_id": plan.last_entry_id,
                                 "replacement": replacement, "entries": copied})
        return True

    # -- copying --------------------------------------------------------------------
    def _choose(self, plan: FragmentPlan, writable: dict, salt: int) -> str | None:
        """``choose_replacement``, host-aware; a pick sharing a host with the
        write sets of its position (none better was live) is logged."""
        where = bookie_locations(self._live)
        pick = choose_replacement(plan.ensemble, plan.lost, writable, self._load, salt=salt,
                                  write_quorum=plan.write_quorum, locations=where)
        if pick is not None and shares_host(plan.ensemble, plan.write_quorum, plan.position,
                                            pick, where):  # on one machine: not news
            level = logging.WARNING if host_count(list(self._live), where) > 1 else logging.INFO
            log.log(level, "ledger %d: placement degraded: %s replaces %s on a host its "
                    "write sets already use", plan.ledger_id, pick, plan.lost)
        return pick

    def refresh_live(self) -> None:
        self._live = self.registry.available()
        for bookie_id, info in self._live.items():
            try:
                route = (info["endpoint"], bookie_server_key(self._curve, bookie_id, info))
            except BKError as exc:  # fail closed: a plain socket the bookie refuses
                log.warning("%s", exc)
                route = (info["endpoint"], None)
            if self._endpoints.get(bookie_id) != route:
                self._transport.add_bookie(bookie_id, *route)
                self._endpoints[bookie_id] = route

    def _copy_fragment(self, md: LedgerMetadata, plan: FragmentPlan, key: bytes,
                       replacement: str, report: RecoveryReport) -> int:
        """Copy ``plan``'s entries to ``replacement``; returns how many, once
        every batch is durable there.  ``CopyError`` otherwise."""
        digest = make_digest(md.digest_type, key)
        pending: deque[tuple[int, list[int]]] = deque()
        copied = 0
        for first, last in plan.runs():
            next_id = first
            while next_id <= last:
                end = min(last, next_id + limits.REREPLICATION_READ_BATCH_ENTRIES_MAX - 1)
                records = self.read_verified(plan, next_id, end, digest, key)
                ids = list(range(next_id, next_id + len(records)))
                request = AddPackedRequest.of(md.ledger_id, key, ids, records, recovery=True)
                pending.append((self._wire.send(replacement, request), ids))
                while len(pending) >= limits.REREPLICATION_WRITES_IN_FLIGHT_MAX:
                    copied += self._await_write(replacement, *pending.popleft())
                next_id += len(records)
        while pending:
            copied += self._await_write(replacement, *pending.popleft())
        report.entries_copied += copied
        if report.entries_copied - self._copied_at_last_line >= PROGRESS_ENTRIES_EVERY:
            self._copied_at_last_line = report.entries_copied
            self._progress(f"{report.entries_copied} entries copied")
        return copied

    def _await_write(self, replacement: str, rid: int, ids: list[int]) -> int:
        event = self._wire.wait(rid)
        if event.status != OK:
            raise ReplacementError(f"replacement {replacement} refused entries "
                                   f"{ids[0]}..{ids[-1]}: {_code_name(event.status)}")
        reply = event.reply
        statuses = list(reply.statuses)
        if list(reply.entry_ids) != ids or any(s != OK for s in statuses):
            bad = next((s for s in statuses if s != OK), OK)
            raise ReplacementError(f"replacement {replacement} refused entries "
                                   f"{ids[0]}..{ids[-1]}: "
                                   f"{_code_name(bad) if bad != OK else 'rows do not match'}")
        return len(ids)

    def read_verified(self, plan: FragmentPlan, first: int, end: int, digest,
                      master_key: bytes | None) -> list:
        """Verified records of ``first..k`` (k >= first, k <= end) from one
        surviving replica of ``first``; fails over between replicas.  The
        reads carry ``master_key`` (None: none, refused by a replica holding
        the ledger's key unless its ``server.reads_need_key`` is off)."""
        errors = []
        for source in plan.sources(first):
            if source not in self._live:
                errors.append(f"{source}: not registered")
                continue
            request = ReadPackedRequest(plan.ledger_id, first, end, end - first + 1,
                                        limits.REREPLICATION_READ_BATCH_BYTES_MAX,
                                        master_key=master_key)
            event = self._wire.call(source, request)
            if event.status != OK:
                errors.append(f"{source}: {_code_name(event.status)}")
                continue
            records = _ok_prefix(event.reply, first)
            payloads, _ = verify_run(records, digest, plan.ledger_id, first)
            if payloads:
                return records[:len(payloads)]
            reason = (_code_name(event.reply.statuses[0]) if len(event.reply.statuses)
                      and event.reply.statuses[0] != OK else "record failed verification")
            errors.append(f"{source}: {reason}")
        raise CopyError(f"entry {first} of ledger {plan.ledger_id}: no surviving replica "
                        f"served it ({'; '.join(errors) or 'no replica besides the lost one'})")

    # -- dry run --------------------------------------------------------------------
    def _plan_only(self, ledger_id: int, lost: str, recover_open: bool,
                   report: RecoveryReport) -> None:
        try:
            md, _ = self.ledgers.read_ledger(ledger_id)
        except NoSuchLedgerError:
            return
        if self._admit(md, lost, recover_open, report) is None:
            return
        self.refresh_live()
        if ledger_action(md, recover_open) == RECOVER_OPEN:
            report.fragments.append({"ledger_id": ledger_id, "action": "recover-open first"})
            return
        for plan in plan_ledger(md, lost):
            writable = {b: info["read_only"] for b, info in self._live.items()}
            replacement = self._choose(plan, writable, ledger_id)
            if replacement is None:
                report.skipped.append({"ledger_id": ledger_id, "reason": (
                    f"no writable replacement for fragment at entry {plan.first_entry_id}")})
                return
            self._load[replacement] = self._load.get(replacement, 0) + 1
            report.fragments.append({"ledger_id": ledger_id,
                                     "first_entry_id": plan.first_entry_id,
                                     "last_entry_id": plan.last_entry_id,
                                     "replacement": replacement,
                                     "entries": plan.entry_count()})


def _ok_prefix(reply, first: int) -> list:
    """The records of the leading OK rows that are ``first, first+1, ...``."""
    records = reply.entries()
    out = []
    for i, (entry_id, status) in enumerate(zip(reply.entry_ids, reply.statuses, strict=True)):
        if status != OK or entry_id != first + i:
            break
        out.append(records[i])
    return out


def underreplicated(ledgers, registry) -> list[dict]:
    """Ledgers whose fragments name a bookie that is not registered now:
    ``[{"ledger_id", "state", "missing": [bookie ids]}]``, by ledger id."""
    live = set(registry.available())
    found = []
    for ledger_id in ledgers.list_ledgers():
        try:
            md, _ = ledgers.read_ledger(ledger_id)
        except NoSuchLedgerError:
            continue
        missing = sorted(md.bookies() - live)
        if missing:
            found.append({"ledger_id": ledger_id, "state": md.state, "missing": missing})
    return found
