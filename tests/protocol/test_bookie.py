"""The bookie core over in-memory storage: keys, fencing, limbo, LAC, tickets, boot."""

import pytest

from appliance.checks.digest import make_digest, master_key
from appliance.errors import (
    OK,
    BadRequestError,
    BookieIOError,
    DataUnknownError,
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    UnauthorizedError,
)
from appliance.protocol.bookie import BookieCore
from appliance.protocol.entry import pack_entry
from appliance.protocol.quorum import Protections
from tests.sim.storage import MemStorage

KEY = master_key(b"pw")
DIGEST = make_digest("crc32c", KEY)


def entry(entry_id, lac=-1, ledger_id=1):
    return pack_entry(ledger_id, entry_id, lac, entry_id + 1, b"x", DIGEST)


@pytest.fixture
def bookie():
    return BookieCore(MemStorage())


def test_first_add_sets_the_key_and_other_keys_are_refused(bookie):
    assert bookie.add(1, 0, entry(0), KEY).code == OK
    assert bookie.add(1, 1, entry(1), master_key(b"wrong")).code == UnauthorizedError.code
    assert bookie.read(1, 1, master_key=KEY).code == NoSuchEntryError.code  # nothing was stored
    assert bookie.read(1, 0, fence=True, master_key=master_key(b"wrong")).code == \
        UnauthorizedError.code
    assert not bookie.storage.is_fenced(1)  # a refused fence fences nothing


def test_records_are_filed_only_under_their_own_id(bookie):
    assert bookie.add(1, 5, entry(4), KEY).code == BadRequestError.code
    assert bookie.add(1, 0, entry(0, ledger_id=2), KEY).code == BadRequestError.code
    assert bookie.add(1, 0, b"junk", KEY).code == BadRequestError.code
    assert bookie.storage.ledgers() == [1] and bookie.storage.last_entry_id(1) == -1


def test_fenced_ledger_refuses_adds_but_takes_recovery_adds(bookie):
    bookie.add(1, 0, entry(0), KEY)
    reply = bookie.read_lac(1, fence=True, master_key=KEY)
    assert (reply.code, reply.lac) == (OK, -1) and reply.ticket > 0
    assert bookie.add(1, 1, entry(1, lac=0), KEY).code == LedgerFencedError.code
    assert bookie.add(1, 1, entry(1, lac=0), KEY, recovery=True).code == OK
    assert bookie.read(1, 1, master_key=KEY).code == OK


def test_fencing_an_unknown_ledger_creates_it(bookie):
    reply = bookie.read(9, 0, fence=True, master_key=KEY)
    assert reply.code == NoSuchEntryError.code
    assert bookie.storage.is_fenced(9)
    assert bookie.add(9, 0, pack_entry(9, 0, -1, 1, b"x", DIGEST), KEY).code == \
        LedgerFencedError.code


def test_replies_wait_for_the_ticket_of_their_change(bookie):
    storage = bookie.storage
    codes, ticket = bookie.add_batch(1, (0, 1), (entry(0), entry(1)), KEY)
    assert codes == [OK, OK] and ticket > storage.durable_ticket
    storage.sync()
    assert storage.durable_ticket >= ticket
    # a second fence must still wait: the first may not be durable yet
    first = bookie.read_lac(1, fence=True, master_key=KEY).ticket
    again = bookie.read_lac(1, fence=True, master_key=KEY).ticket
    assert again >= first > storage.durable_ticket


def test_lac_is_max_of_explicit_and_highest_entry_header(bookie):
    assert bookie.read_lac(1, master_key=KEY).code == NoSuchLedgerError.code
    bookie.add(1, 0, entry(0), KEY)
    bookie.add(1, 3, entry(3, lac=1), KEY)
    bookie.add(1, 2, entry(2, lac=0), KEY)
    # the header of the highest entry (3), not of the last added
    assert bookie.read_lac(1, master_key=KEY).lac == 1
    assert bookie.write_lac(1, 2, KEY).code == OK
    assert bookie.read_lac(1, master_key=KEY).lac == 2
    assert bookie.write_lac(1, 0, KEY).code == OK
    assert bookie.read_lac(1, master_key=KEY).lac == 2  # only grows
    assert bookie.write_lac(1, 5, master_key(b"wrong")).code == UnauthorizedError.code


def test_limbo_never_answers_an_explicit_negative():
    bookie = BookieCore(MemStorage())
    bookie.add(1, 0, entry(0), KEY)
    bookie.boot([(1, False)], possible_data_loss=True)
    assert bookie.storage.is_fenced(1) and bookie.storage.is_limbo(1)
    assert bookie.read(1, 5, master_key=KEY).code == DataUnknownError.code
    assert bookie.read(1, 5, fence=True, master_key=KEY).code == DataUnknownError.code
    assert bookie.read(1, 0, master_key=KEY).code == OK
    bookie.clear_limbo(1)
    assert bookie.read(1, 5, master_key=KEY).code == NoSuchEntryError.code


def test_boot_fences_and_limbos_closed_ledgers_too():
    # limbo is phase two's durable "to repair" mark: a closed ledger whose
    # share may be gone answers "unknown", not "no such entry", until repaired
    bookie = BookieCore(MemStorage())
    bookie.boot([(1, True), (2, False)], possible_data_loss=True)
    storage = bookie.storage
    assert storage.is_fenced(1) and storage.is_limbo(1)
    assert storage.is_fenced(2) and storage.is_limbo(2)


def test_boot_after_a_clean_stop_changes_nothing():
    bookie = BookieCore(MemStorage())
    assert bookie.boot([(1, False)], possible_data_loss=False) == 0
    assert bookie.storage.ledgers() == []


def test_switched_off_protections_change_the_rules():
    bookie = BookieCore(MemStorage(), protections=Protections.without("fence-on-boot", "limbo"))
    bookie.add(1, 0, entry(0), KEY)
    bookie.boot([(1, False)], possible_data_loss=True)
    assert not bookie.storage.is_fenced(1)
    assert bookie.read(1, 5, master_key=KEY).code == NoSuchEntryError.code


def test_crash_loses_unsynced_fence_and_entries():
    storage = MemStorage()
    bookie = BookieCore(storage)
    bookie.add(1, 0, entry(0), KEY)
    storage.sync()
    bookie.add(1, 1, entry(1), KEY)
    bookie.read_lac(1, fence=True, master_key=KEY)
    lost = storage.crash(keep_ops=0)
    assert lost == {1: {1}}
    assert not storage.is_fenced(1) and storage.has(1, 0) and not storage.has(1, 1)


def test_write_close_checks_the_key_and_asks_storage_to_rotate(bookie):
    """BP-32: the right key rotates; a wrong one is refused and changes
    nothing; a ledger the bookie never held is OK with nothing to rotate."""
    bookie.add(1, 0, entry(0), KEY)
    assert bookie.write_close(1, master_key(b"wrong")).code == UnauthorizedError.code
    assert bookie.write_close(1, b"short").code == UnauthorizedError.code
    assert bookie.storage.write_closes == []
    assert bookie.write_close(1, KEY).code == OK and bookie.storage.write_closes == [1]
    assert bookie.write_close(9, KEY).code == OK and bookie.storage.write_closes == [1]
    assert bookie.add(1, 1, entry(1, lac=0), KEY).code == OK  # advice: the ledger still works


def test_fencing_reads_and_failed_writes_rotate_but_wrong_keys_do_not(bookie):
    bookie.add(1, 0, entry(0), KEY)
    assert bookie.read(1, 0, fence=True, master_key=master_key(b"x")).code == \
        UnauthorizedError.code
    assert bookie.storage.write_closes == []
    assert bookie.read_lac(1, fence=True, master_key=KEY).code == OK
    assert bookie.storage.write_closes == [1]  # recovery: the writer is done
    assert bookie.add(1, 1, entry(1, lac=0), KEY).code == LedgerFencedError.code
    assert bookie.storage.write_closes == [1, 1]  # and the failed (fenced) add


def test_a_storage_write_failure_rotates_before_the_error():
    class FailingStorage(MemStorage):
        def add_entries(self, *args):
            raise BookieIOError("disk gone")

    bookie = BookieCore(FailingStorage())
    with pytest.raises(BookieIOError):
        bookie.add(1, 0, entry(0), KEY)
    assert bookie.storage.write_closes == [1]
