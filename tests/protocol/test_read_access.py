"""Who may read: the pure rule (``appliance.protocol.read_access``) and the
bookie core that applies it to every read (entries, LAC, fencing or not)."""

import pytest

from appliance.checks.digest import make_digest, master_key
from appliance.errors import (
    OK,
    DataUnknownError,
    NoSuchEntryError,
    NoSuchLedgerError,
    UnauthorizedError,
)
from appliance.protocol.bookie import BookieCore
from appliance.protocol.entry import pack_entry
from appliance.protocol.read_access import read_allowed
from tests.sim.storage import MemStorage

KEY = master_key(b"pw")
WRONG = master_key(b"not-the-password")
DIGEST = make_digest("crc32c", KEY)
REFUSED = UnauthorizedError.code


@pytest.mark.parametrize(("stored", "given", "need", "code"), [
    (None, None, True, OK),  # the bookie knows no key: answer as before
    (None, WRONG, True, OK),
    (KEY, KEY, True, OK),
    (KEY, WRONG, True, REFUSED),
    (KEY, WRONG, False, REFUSED),  # a wrong key is refused whatever the setting
    (KEY, None, True, REFUSED),
    (KEY, b"", True, REFUSED),  # an event's "no key"
    (KEY, None, False, OK),  # BookKeeper's behaviour: reads carry no key
    (KEY, KEY[:31], False, REFUSED),
    (KEY, bytearray(KEY), True, OK),
])
def test_the_rule(stored, given, need, code):
    assert read_allowed(stored, given, reads_need_key=need) == code


def _bookie(**kw) -> BookieCore:
    bookie = BookieCore(MemStorage(), **kw)
    for e in range(3):
        assert bookie.add(1, e, pack_entry(1, e, e - 1, e + 1, b"e%d" % e, DIGEST), KEY).code == OK
    return bookie


def test_entry_reads_need_the_ledgers_key_and_see_no_data_without_it():
    bookie = _bookie()
    for key in (None, b"", WRONG):
        reply = bookie.read(1, 0, master_key=key)
        assert (reply.code, reply.data) == (REFUSED, None)
    reply = bookie.read(1, 0, master_key=KEY)
    assert reply.code == OK and reply.data is not None
    assert bookie.read(1, 7, master_key=KEY).code == NoSuchEntryError.code
    assert bookie.read(1, 7).code == REFUSED  # not even a negative leaks out


def test_lac_reads_need_the_key_too():
    bookie = _bookie()
    assert bookie.read_lac(1).code == REFUSED
    assert bookie.read_lac(1, master_key=WRONG).code == REFUSED
    reply = bookie.read_lac(1, master_key=KEY)
    assert (reply.code, reply.lac) == (OK, 1)
    assert bookie.read_access(1, None) == REFUSED and bookie.read_access(1, KEY) == OK


def test_a_fencing_read_with_a_wrong_key_is_refused_and_fences_nothing():
    bookie = _bookie()
    assert bookie.read(1, 0, fence=True, master_key=WRONG).code == REFUSED
    assert bookie.read_lac(1, fence=True, master_key=WRONG).code == REFUSED
    assert not bookie.storage.is_fenced(1)
    assert bookie.read(1, 0, fence=True, master_key=KEY).code == OK


def test_reads_need_key_off_serves_keyless_reads_but_never_a_wrong_key():
    bookie = _bookie(reads_need_key=False)
    assert bookie.read(1, 2).code == OK and bookie.read_lac(1).lac == 1
    assert bookie.read(1, 2, master_key=WRONG).code == REFUSED
    assert bookie.read_lac(1, master_key=WRONG).code == REFUSED


def test_a_ledger_whose_key_the_bookie_does_not_know_answers_as_before():
    bookie = _bookie()
    assert bookie.read(9, 0).code == NoSuchLedgerError.code
    assert bookie.read(9, 0, master_key=WRONG).code == NoSuchLedgerError.code
    assert bookie.read_lac(9).code == NoSuchLedgerError.code
    # fenced and put in limbo at boot (BP-46): the ledger exists, without a key
    booted = BookieCore(MemStorage())
    booted.boot([(5, False)], possible_data_loss=True)
    assert booted.storage.get_master_key(5) is None
    assert booted.read(5, 0).code == DataUnknownError.code
    assert booted.read_lac(5, master_key=WRONG).code == OK
