"""BookieCore.add_packed: entries packed in one frame, with and without the
vectorised id check (``appliance.bookie.add_check``), give the same codes and store
the same bytes as add_batch, on good batches and on damaged ones."""

from __future__ import annotations

import random

import pytest

from appliance.bookie.add_check import (
    VECTOR_ENTRIES_MIN,
    multi_records_match,
    packed_records_match,
)
from appliance.checks.digest import make_digest, master_key
from appliance.errors import OK, BadRequestError, LedgerFencedError, UnauthorizedError
from appliance.protocol.bookie import BookieCore
from appliance.protocol.entry import pack_entry
from tests.sim.storage import MemStorage

KEY = master_key(b"pw")
DIGEST = make_digest("crc32c", KEY)


def _records(ledger_id: int, first: int, count: int, rng: random.Random) -> list[bytes]:
    return [pack_entry(ledger_id, e, e - 1, e, rng.randbytes(rng.randint(0, 300)), DIGEST)
            for e in range(first, first + count)]


def _damage(records: list[bytes], ids: list[int], rng: random.Random) -> None:
    """One of: a record of another ledger, another entry, a short record, a negative id."""
    i = rng.randrange(len(records))
    kind = rng.randrange(4)
    if kind == 0:
        records[i] = pack_entry(2, ids[i], -1, 0, b"x", DIGEST)
    elif kind == 1:
        records[i] = pack_entry(1, ids[i] + 1, -1, 0, b"x", DIGEST)
    elif kind == 2:
        records[i] = records[i][:rng.randrange(32)]
    else:
        ids[i] = -1


def _stored(core: BookieCore) -> dict:
    st = core.storage
    if not st.ledger_exists(1):
        return {}
    return {e: st.read_entry(1, e) for e in range(st.last_entry_id(1) + 1)
            if _has(st, e)}


def _has(st, entry_id: int) -> bool:
    try:
        st.read_entry(1, entry_id)
        return True
    except Exception:  # noqa: BLE001 - absent
        return False


@pytest.mark.parametrize("count", [1, VECTOR_ENTRIES_MIN - 1, VECTOR_ENTRIES_MIN, 200])
def test_packed_adds_match_add_batch_on_good_and_damaged_batches(count):
    rng = random.Random(count)
    for trial in range(30):
        records = _records(1, 0, count, rng)
        ids = list(range(count))
        if trial % 3:
            _damage(records, ids, rng)
        lengths = [len(r) for r in records]
        data = memoryview(b"".join(records))
        want = BookieCore(MemStorage())
        want_codes, _ = want.add_batch(1, ids, records, KEY)
        for check in (None, packed_records_match):
            got = BookieCore(MemStorage())
            codes, ticket = got.add_packed(1, ids, lengths, data, KEY, records_match=check)
            assert codes == want_codes, (trial, check)
            assert _stored(got) == _stored(want)
            assert ticket > 0  # the key was set (and, with good records, entries stored)
        all_good = all(c == OK for c in want_codes)
        assert packed_records_match(1, ids, lengths, data) == (all_good and
                                                                count >= VECTOR_ENTRIES_MIN)
        assert (BadRequestError.code in want_codes) == (not all_good)


def test_packed_adds_keep_the_key_and_fence_rules():
    rng = random.Random(7)
    records = _records(1, 0, 40, rng)
    lengths, data = [len(r) for r in records], b"".join(records)
    core = BookieCore(MemStorage())
    codes, _ = core.add_packed(1, list(range(40)), lengths, data, master_key(b"other"),
                               records_match=packed_records_match)
    assert codes == [OK] * 40
    codes, _ = core.add_packed(1, list(range(40)), lengths, data, KEY,
                               records_match=packed_records_match)
    assert codes == [UnauthorizedError.code] * 40
    core.storage.fence(1)
    codes, _ = core.add_packed(1, list(range(40)), lengths, data, master_key(b"other"),
                               records_match=packed_records_match)
    assert codes == [LedgerFencedError.code] * 40
    codes, _ = core.add_packed(1, list(range(40)), lengths, data, master_key(b"other"),
                               recovery=True, records_match=packed_records_match)
    assert codes == [OK] * 40


class _CountingStorage(MemStorage):
    def __init__(self):
        super().__init__()
        self.add_calls = 0

    def add_entries(self, ledger_ids, entry_ids, datas):
        self.add_calls += 1
        return super().add_entries(ledger_ids, entry_ids, datas)


def test_add_groups_admits_each_ledger_alone_and_stores_all_in_one_call():
    rng = random.Random(5)
    core = BookieCore(_CountingStorage())
    fenced_key = master_key(b"other")
    core.add_batch(3, [0], [pack_entry(3, 0, -1, 0, b"x", DIGEST)], KEY)
    core.storage.fence(3)
    core.storage.add_calls = 0
    groups = [(1, KEY, [0, 1], _records(1, 0, 2, rng)),
              (2, KEY, [0], _records(2, 0, 1, rng)),
              (3, KEY, [1], [pack_entry(3, 1, 0, 1, b"y", DIGEST)]),  # fenced
              (4, fenced_key, [0], [pack_entry(4, 0, -1, 0, b"z", DIGEST)]),
              (5, KEY, [0, 1], [pack_entry(5, 0, -1, 0, b"a", DIGEST),
                                pack_entry(6, 1, -1, 0, b"b", DIGEST)])]  # 2nd: wrong ledger
    core.storage.set_master_key(4, KEY)  # ledger 4 belongs to another key
    codes, ticket = core.add_groups(groups)
    assert codes == [[OK, OK], [OK], [LedgerFencedError.code], [UnauthorizedError.code],
                     [OK, BadRequestError.code]]
    assert core.storage.add_calls == 1 and ticket > 0  # one block for every accepted entry
    assert core.storage.read_entry(1, 1) == groups[0][3][1]
    assert core.storage.read_entry(2, 0) == groups[1][3][0]
    assert core.storage.read_entry(5, 0) == groups[4][3][0]
    assert not core.storage.ledger_exists(6)


def _stored_all(core: BookieCore, ledgers) -> dict:
    st = core.storage
    return {(lid, e): st.read_entry(lid, e) for lid in ledgers if st.ledger_exists(lid)
            for e in range(st.last_entry_id(lid) + 1) if _has_in(st, lid, e)}


def _has_in(st, ledger_id: int, entry_id: int) -> bool:
    try:
        st.read_entry(ledger_id, entry_id)
        return True
    except Exception:  # noqa: BLE001 - absent
        return False


@pytest.mark.parametrize("count", [3, VECTOR_ENTRIES_MIN, 150])
def test_multi_check_vouches_only_for_good_batches_and_gives_the_same_codes(count):
    """ADD_MULTI's vectorised check (``multi_records_match``) and ``add_groups``
    with the groups it vouched for give the codes and bytes of the per-record
    check, on good batches and on batches with one record of another ledger,
    another entry, a short record or a negative id."""
    rng = random.Random(count)
    for trial in range(30):
        counts = [rng.randint(1, 9) for _ in range(count // 4 + 1)]
        groups, ids, records = [], [], []
        for g, n in enumerate(counts):
            lid = 1 + g % 5  # ledgers repeat across groups, as in a drain
            first = 100 * g
            groups.append((lid, KEY, n))
            ids += list(range(first, first + n))
            records += [pack_entry(lid, e, e - 1, e, rng.randbytes(rng.randint(0, 90)), DIGEST)
                        for e in range(first, first + n)]
        if trial % 3:
            i = rng.randrange(len(records))
            kind = rng.randrange(4)
            if kind == 0:  # a record of a ledger that is in the batch, but not its group's
                records[i] = pack_entry(99, ids[i], -1, 0, b"x", DIGEST)
            elif kind == 1:
                records[i] = pack_entry(1 + (i % 5), ids[i] + 1, -1, 0, b"x", DIGEST)
            elif kind == 2:
                records[i] = records[i][:rng.randrange(32)]
            else:
                ids[i] = -1
        lengths = [len(r) for r in records]
        data = b"".join(records)
        per_group, pos = [], 0
        for lid, key, n in groups:
            per_group.append((lid, key, ids[pos:pos + n], records[pos:pos + n]))
            pos += n
        vouch = multi_records_match(groups, ids, lengths, data)
        want = BookieCore(MemStorage())
        want_codes, _ = want.add_groups(per_group)
        all_good = all(c == OK for codes in want_codes for c in codes)
        assert vouch == (all_good and len(ids) >= VECTOR_ENTRIES_MIN), trial
        got = BookieCore(MemStorage())
        codes, _ = got.add_groups(per_group, vouched=[vouch] * len(per_group))
        assert codes == want_codes
        assert _stored_all(got, range(1, 6)) == _stored_all(want, range(1, 6))
