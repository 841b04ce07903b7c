"""The bookie's half of the protocol, over an injected storage object.

Pure decisions, no I/O of its own: the storage does the writing, and every
reply says which durability ``ticket`` it must wait for (send the reply only
once ``storage.durable_ticket >= ticket``).  Tickets are assumed to be
issued in one increasing order (a journal), so waiting for a later ticket
covers every earlier change.

Rules:

* **Master key**: every add, fence and LAC write carries the 32-byte key.
  The first one for a ledger stores it; a different key is refused with
  ``UnauthorizedError`` (checked before anything is stored).
* **Reads** (entries, LAC, long polls): ``appliance.protocol.read_access``
  decides, before anything is read: a read with another key than the
  stored one is refused (``UnauthorizedError``), one without a key too
  unless ``reads_need_key`` is off; a ledger whose key this bookie does not
  know answers as before.  A fencing read checks its key as a fence does.
* **Fencing**: a fenced ledger refuses normal adds (``LedgerFencedError``)
  and accepts recovery adds.  A read or LAC read with the fence flag fences
  first (creating the ledger if this bookie never saw it), then answers, and
  its reply waits for the fence to be durable.
* **Explicit negatives** (``NoSuchLedger``/``NoSuchEntry``) only when this
  bookie can vouch it never stored the entry; a **limbo** ledger (BP-46:
  data may have been lost) answers ``DataUnknownError`` instead.
* **LAC** = max(explicit LAC, LAC field of the highest stored entry).
* **Boot (BP-46)**: after possible data loss (unclean shutdown after
  journal-less adds, an index rebuilt from a scan, a replaced disk) ``boot``
  fences every ledger whose ensemble includes this bookie and marks it
  limbo, closed ones too.  Departures from BP-46's boot sequence, which says
  "non-closed" for both: its scenario 1 only stays safe when a ledger closed
  *before* the crash is fenced as well (its protection section asks for
  "all those ledgers are fenced"); and limbo is the durable "to repair"
  mark of phase two (``appliance.protocol.repair``), so a closed ledger whose
  share may be gone answers "unknown" rather than "no such entry" until it
  is repaired, and a crash during repair resumes where it stopped.
* **Write close (BP-32, advisory)**: ``write_close`` checks the key (a
  wrong one: ``UnauthorizedError``, nothing else happens), then asks the
  storage to rotate the ledger's entry log; a ledger this bookie does not
  hold is OK (nothing to rotate).  The core also rotates on a fencing read
  (recovery: the writer is done) and on a failed write (an add refused
  because the ledger is fenced, or one the storage failed), before the error
  reply.  Rotation is advice: its own failure is ignored here.
* **Records**: an add whose header names another ledger/entry than the
  request is refused (``BadRequestError``): a bookie never files entry i
  under another id.

The rules the storage's answers must keep (a fence holds once made, a
fenced ledger is a known one, the boot rule's fences and limbo marks hold,
a vouched record names its entry) are checked with ``invariant()``.

Storage interface used (``storage.LedgerStorage`` has exactly these):
``add_entries, durable_ticket, read_entry, last_entry_id, ledger_exists,
ledgers, set_master_key, get_master_key, fence, is_fenced, admission, mark_limbo,
clear_limbo, is_limbo, set_explicit_lac, get_explicit_lac, write_close``.  ``fence`` and
``mark_limbo`` must create an unknown ledger (without a key).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from appliance.protocol.entry import HEADER, HEADER_BYTES
from appliance.protocol.errors import (
    OK,
    BadRequestError,
    BKError,
    DataUnknownError,
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    UnauthorizedError,
    code_of,
)
from appliance.protocol.invariant import invariant
from appliance.protocol.keys import MASTER_KEY_BYTES
from appliance.protocol.quorum import ALL_PROTECTIONS, Protections
from appliance.protocol.read_access import read_allowed


@dataclass(frozen=True, slots=True)
class BookieReply:
    code: int
    data: bytes | None = None  # read: the stored record
    lac: int = -1  # read_lac: this bookie's LAC
    ticket: int = 0  # send the reply once storage.durable_ticket >= ticket


_NEGATIVE = (NoSuchLedgerError, NoSuchEntryError)


class BookieCore:
    """Request handling of one bookie (see module docstring)."""

    def __init__(self, storage, *, protections: Protections = ALL_PROTECTIONS,
                 reads_need_key: bool = True):
        self.storage = storage
        self.protections = protections
        self.reads_need_key = reads_need_key  # False: keyless reads served (BookKeeper's way)

    # -- adds -------------------------------------------------------------------------
    def add(self, ledger_id: int, entry_id: int, data: bytes, master_key: bytes,
            recovery: bool = False) -> BookieReply:
        codes, ticket = self.add_batch(ledger_id, (entry_id,), (data,), master_key, recovery)
        return BookieReply(codes[0], ticket=ticket)

    def add_batch(self, ledger_id: int, entry_ids: Sequence[int], datas: Sequence[bytes],
                  master_key: bytes, recovery: bool = False) -> tuple[list[int], int]:
        """Store several entries of one ledger: one code per entry, one ticket.
        (``add_groups`` of one group, written out: the usual add is one
        ledger's few entries, and this is its whole per-request cost.)"""
        code, ticket = self._admit_add(ledger_id, master_key, recovery)
        if code != OK:
            return [code] * len(entry_ids), ticket
        codes = [OK] * len(entry_ids)
        ids, good = [], []
        _check_entries(ledger_id, entry_ids, datas, codes, ids, good)
        if ids:  # one storage call: one block, one ticket
            ticket = max(ticket, self._store(ledger_id, ids, good))
        return codes, ticket

    def add_groups(self, groups: Sequence[tuple[int, bytes, Sequence[int], Sequence]],
                   recovery: bool = False, vouched: Sequence[bool] | None = None,
                   ) -> tuple[list[list[int]], int]:
        """``add_batch`` of several ledgers at once: ``groups`` of (ledger id,
        master key, entry ids, datas); one list of codes per group, one
        ticket, and one storage call (one block) for every accepted entry.
        Each group is admitted (key, fence) and checked on its own; a
        failed storage write fails them all (``BKError``).  ``vouched[i]``
        true: a vectorised check (``add_packed``'s ``records_match``)
        already found every record of group i naming its ledger and entry
        id, so they are not checked again."""
        all_codes, ticket = [], 0
        ledgers, ids, good = [], [], []
        for i, (ledger_id, master_key, entry_ids, datas) in enumerate(groups):
            code, t = self._admit_add(ledger_id, master_key, recovery)
            ticket = max(ticket, t)
            if code != OK:
                all_codes.append([code] * len(entry_ids))
                continue
            codes = [OK] * len(entry_ids)
            before = len(ids)
            if vouched is not None and vouched[i]:
                _check_vouched(ledger_id, entry_ids, datas)
                ids += entry_ids
                good += datas
            else:
                _check_entries(ledger_id, entry_ids, datas, codes, ids, good)
            ledgers += [ledger_id] * (len(ids) - before)
            all_codes.append(codes)
        if ids:  # one storage call: one block, one ticket
            ticket = max(ticket, self._store_many(ledgers, ids, good))
        return all_codes, ticket

    def _store(self, ledger_id: int, entry_ids, datas) -> int:
        return self._store_many([ledger_id] * len(entry_ids), entry_ids, datas)

    def _store_many(self, ledger_ids, entry_ids, datas) -> int:
        try:
            return self.storage.add_entries(ledger_ids, entry_ids, datas)
        except BKError:
            for ledger_id in dict.fromkeys(ledger_ids):
                self._rotate(ledger_id)  # a failed write: rotate before the error reply
            raise

    def add_packed(self, ledger_id: int, entry_ids: Sequence[int], lengths: Sequence[int],
                   data, master_key: bytes, recovery: bool = False, *,
                   records_match=None) -> tuple[list[int], int]:
        """``add_batch`` of entries lying back to back in ``data`` (``lengths[i]``
        bytes each).  ``records_match(ledger_id, entry_ids, lengths, data)`` may
        vouch in one call that every record is at least a header long and names
        ``ledger_id`` and its entry id (a vectorised check, injected like a
        digest); unless it returns True each record is checked as ``add_batch``
        does, so the codes are the same either way."""
        view = memoryview(data)
        datas, pos = [], 0
        for length in lengths:
            datas.append(view[pos:pos + length])
            pos += length
        if records_match is None or not records_match(ledger_id, entry_ids, lengths, data):
            return self.add_batch(ledger_id, entry_ids, datas, master_key, recovery)
        code, ticket = self._admit_add(ledger_id, master_key, recovery)
        if code != OK:
            return [code] * len(datas), ticket
        _check_vouched(ledger_id, entry_ids, datas)
        ticket = max(ticket, self._store(ledger_id, entry_ids, datas))
        return [OK] * len(datas), ticket

    def _stored_key(self, ledger_id: int) -> bytes | None:
        """The key this bookie holds for the ledger (None: none, or no ledger)."""
        storage = self.storage
        return storage.get_master_key(ledger_id) if storage.ledger_exists(ledger_id) else None

    def _admit_add(self, ledger_id: int, master_key: bytes, recovery: bool) -> tuple[int, int]:
        storage = self.storage
        exists, stored, fenced = storage.admission(ledger_id)  # one lookup: the hot path
        if not _key_ok(master_key) or (stored is not None and stored != master_key):
            return UnauthorizedError.code, 0
        if fenced and not recovery:
            invariant(exists, "ledger %d: storage says fenced but unknown", ledger_id)
            self._rotate(ledger_id)  # the writer's add failed: it is done with the ledger
            return LedgerFencedError.code, 0
        ticket = storage.set_master_key(ledger_id, master_key) if stored is None else 0
        return OK, ticket

    # -- reads --------------------------------------------------------------------------
    def read_access(self, ledger_id: int, master_key: bytes | None) -> int:
        """OK, or UnauthorizedError's code: may a read carrying ``master_key``
        (None: none) be served (``appliance.protocol.read_access``)."""
        return read_allowed(self._stored_key(ledger_id), master_key,
                            reads_need_key=self.reads_need_key)

    def read(self, ledger_id: int, entry_id: int, fence: bool = False,
             master_key: bytes | None = None) -> BookieReply:
        """One entry; ``fence``: fence the ledger first (the key is needed)."""
        code, ticket = (self._fence(ledger_id, master_key) if fence
                        else (self.read_access(ledger_id, master_key), 0))
        if code != OK:
            return BookieReply(code)
        try:
            data = self.storage.read_entry(ledger_id, entry_id)
        except _NEGATIVE as exc:
            return BookieReply(self._negative(ledger_id, exc.code), ticket=ticket)
        except BKError as exc:
            return BookieReply(exc.code, ticket=ticket)
        return BookieReply(OK, data=data, ticket=ticket)

    def read_lac(self, ledger_id: int, fence: bool = False,
                 master_key: bytes | None = None) -> BookieReply:
        """This bookie's LAC of the ledger (also for WAIT_LAC); ``fence`` first."""
        ticket = 0
        if fence:
            code, ticket = self._fence(ledger_id, master_key)
        elif not self.storage.ledger_exists(ledger_id):
            return BookieReply(NoSuchLedgerError.code)
        else:
            code = self.read_access(ledger_id, master_key)
        if code != OK:
            return BookieReply(code)
        try:
            return BookieReply(OK, lac=self.lac(ledger_id), ticket=ticket)
        except BKError as exc:
            return BookieReply(code_of(exc), ticket=ticket)

    def lac(self, ledger_id: int) -> int:
        """max(explicit LAC, LAC in the header of the highest stored entry)."""
        storage = self.storage
        lac = storage.get_explicit_lac(ledger_id)
        last = storage.last_entry_id(ledger_id)
        if last >= 0:
            lac = max(lac, HEADER.unpack_from(storage.read_entry(ledger_id, last), 0)[2])
        return lac

    def write_lac(self, ledger_id: int, lac: int, master_key: bytes) -> BookieReply:
        storage = self.storage
        if not storage.ledger_exists(ledger_id):
            return BookieReply(NoSuchLedgerError.code)
        stored = storage.get_master_key(ledger_id)
        if not _key_ok(master_key) or (stored is not None and stored != master_key):
            return BookieReply(UnauthorizedError.code)
        if lac > storage.get_explicit_lac(ledger_id):
            storage.set_explicit_lac(ledger_id, lac)
        return BookieReply(OK)

    def _fence(self, ledger_id: int, master_key: bytes | None) -> tuple[int, int]:
        storage = self.storage
        stored = self._stored_key(ledger_id)
        if not _key_ok(master_key) or (stored is not None and stored != master_key):
            return UnauthorizedError.code, 0
        ticket = storage.set_master_key(ledger_id, master_key) if stored is None else 0
        # always ask storage: an earlier fence may not be durable yet
        ticket = max(ticket, storage.fence(ledger_id))
        invariant(storage.is_fenced(ledger_id), "ledger %d: not fenced after a fence "
                  "(a fence-flagged read must fence before it answers)", ledger_id)
        self._rotate(ledger_id)  # recovery: the writer is done with the ledger
        return OK, ticket

    # -- write close (BP-32) -------------------------------------------------------------
    def write_close(self, ledger_id: int, master_key: bytes) -> BookieReply:
        """Advisory: the ledger's writer is done.  Wrong key: Unauthorized."""
        storage = self.storage
        if not _key_ok(master_key):
            return BookieReply(UnauthorizedError.code)
        if not storage.ledger_exists(ledger_id):
            return BookieReply(OK)  # nothing stored here, nothing to rotate
        stored = storage.get_master_key(ledger_id)
        if stored is not None and stored != master_key:
            return BookieReply(UnauthorizedError.code)
        try:
            storage.write_close(ledger_id)
        except BKError as exc:
            return BookieReply(exc.code)
        return BookieReply(OK)

    def _rotate(self, ledger_id: int) -> None:
        try:
            self.storage.write_close(ledger_id)
        except BKError:
            pass  # advice only: a broken storage reports itself on the next write

    def _negative(self, ledger_id: int, code: int) -> int:
        """An explicit negative, unless the ledger is in limbo (BP-46)."""
        if self.protections.limbo and self.storage.ledger_exists(ledger_id) \
                and self.storage.is_limbo(ledger_id):
            return DataUnknownError.code
        return code

    # -- boot and repair (BP-46) --------------------------------------------------------
    def boot(self, ledgers: Iterable[tuple[int, bool]], possible_data_loss: bool) -> int:
        """Apply the BP-46 boot rule before serving.

        ``ledgers``: ``(ledger_id, is_closed)`` for every ledger whose metadata
        names this bookie in an ensemble.  ``possible_data_loss``: the last
        shutdown was unclean while acks did not wait for a journal, or a
        cookie check failed.  Returns the ticket to wait for before serving."""
        if not possible_data_loss:
            return 0
        ticket, storage = 0, self.storage
        fence, limbo = self.protections.fence_on_boot, self.protections.limbo
        for ledger_id, _closed in ledgers:
            if fence:
                ticket = max(ticket, storage.fence(ledger_id))
            if limbo:
                ticket = max(ticket, storage.mark_limbo(ledger_id))
            invariant((not fence or storage.is_fenced(ledger_id))
                      and (not limbo or storage.is_limbo(ledger_id)),
                      "ledger %d: the boot rule left it unfenced or out of limbo", ledger_id)
        return ticket

    def clear_limbo(self, ledger_id: int) -> int:
        """After repair (this bookie again holds its share): explicit
        negatives are trustworthy again."""
        return self.storage.clear_limbo(ledger_id)


def _key_ok(master_key: bytes) -> bool:
    return isinstance(master_key, bytes) and len(master_key) == MASTER_KEY_BYTES


def _check_vouched(ledger_id: int, entry_ids: Sequence[int], datas: Sequence) -> None:
    """Records a vectorised check vouched for: the first one's header must
    name (``ledger_id``, its id) -- a sample, O(1) per group, so a broken
    vouching check is caught before a record is filed under another id."""
    if entry_ids:
        invariant(HEADER.unpack_from(datas[0], 0)[:2] == (ledger_id, entry_ids[0]),
                  "ledger %d: a vouched record filed as entry %d names another",
                  ledger_id, entry_ids[0])


def _check_entries(ledger_id: int, entry_ids, datas, codes: list, ids: list, good: list) -> None:
    """Each entry whose record header names (``ledger_id``, its id) goes to
    ``ids`` / ``good``; any other gets ``BadRequestError`` in ``codes``."""
    unpack = HEADER.unpack_from
    for i, (entry_id, data) in enumerate(zip(entry_ids, datas, strict=True)):
        if entry_id < 0 or len(data) < HEADER_BYTES or unpack(data, 0)[:2] != (
                ledger_id, entry_id):
            codes[i] = BadRequestError.code
            continue
        ids.append(entry_id)
        good.append(data)
