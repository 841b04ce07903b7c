"""The ledger metadata model on both backends."""

from __future__ import annotations

import threading

import pytest

from appliance.errors import (
    CorruptMetadataError,
    LedgerClosedError,
    LedgerFencedError,
    MetadataVersionError,
    NoSuchLedgerError,
)
from appliance.meta import ledgers as ledgers_module
from appliance.meta.ledgers import NEW_LEDGER_VERSION, LedgerManager, ledger_path
from appliance.protocol.invariant import InvariantViolation
from appliance.protocol.metadata import CLOSED, IN_RECOVERY, OPEN, LedgerMetadata
from storage.metadata import ANY_VERSION

ENSEMBLE = ["bookie-1", "bookie-2", "bookie-3"]


@pytest.fixture
def ledgers(store):
    return LedgerManager(store)


def _create(ledgers, **kw) -> LedgerMetadata:
    args = {"ensemble_size": 3, "write_quorum": 3, "ack_quorum": 2, "ensemble": ENSEMBLE}
    return ledgers.create_ledger(**{**args, **kw})


def test_create_then_read_roundtrips_every_field(ledgers):
    md = _create(ledgers, digest_type="hmac-sha256", password_hash=b"\x00\xffhash",
                 custom={"app": "test", "owner": "me"}, ctime_ms=1234)
    read, version = ledgers.read_ledger(md.ledger_id)
    assert version == NEW_LEDGER_VERSION
    assert read == md
    assert (read.state, read.last_entry_id, read.ensembles) == (OPEN, -1, ((0, tuple(ENSEMBLE)),))
    assert (read.ensemble_size, read.write_quorum, read.ack_quorum) == (3, 3, 2)
    assert read.password_hash == b"\x00\xffhash" and read.digest_type == "hmac-sha256"
    assert dict(read.custom) == {"app": "test", "owner": "me"} and read.ctime_ms == 1234


def test_ids_are_unique_and_never_reused_after_delete(ledgers):
    first = [_create(ledgers).ledger_id for _ in range(3)]
    assert first == sorted(set(first))
    ledgers.delete_ledger(first[-1])  # the highest id
    ledgers.delete_ledger(first[0])
    again = _create(ledgers).ledger_id
    assert again > first[-1]
    assert ledgers.list_ledgers() == [first[1], again]


def test_invalid_arguments_are_refused_before_an_id_is_taken(ledgers):
    before = _create(ledgers).ledger_id
    with pytest.raises(ValueError, match="ack_quorum"):
        _create(ledgers, ack_quorum=4)
    with pytest.raises(ValueError, match="distinct bookies"):
        _create(ledgers, ensemble=["b1", "b1", "b2"])
    with pytest.raises(TypeError, match="custom"):
        _create(ledgers, custom={"k": 1})
    assert _create(ledgers).ledger_id == before + 1


def test_missing_ledger_and_bad_ids(ledgers):
    with pytest.raises(NoSuchLedgerError, match="42"):
        ledgers.read_ledger(42)
    with pytest.raises(NoSuchLedgerError):
        ledgers.delete_ledger(42)
    with pytest.raises(NoSuchLedgerError):
        ledgers.update_ledger(42, lambda md: md.to_in_recovery())
    with pytest.raises(ValueError, match="ledger_id"):
        ledgers.read_ledger(-1)
    with pytest.raises(ValueError, match="ledger_id"):
        ledgers.read_ledger(2**63)
    with pytest.raises(TypeError, match="ledger_id"):
        ledgers.read_ledger("7")
    assert ledgers.list_ledgers() == []


def test_update_applies_transforms_through_cas(ledgers):
    md = _create(ledgers)
    md2, v1 = ledgers.update_ledger(md.ledger_id, lambda m: m.with_fragment(5, ["bookie-4",
                                                                              "bookie-2",
                                                                              "bookie-3"]))
    assert v1 == 1 and md2.ensembles[1] == (5, ("bookie-4", "bookie-2", "bookie-3"))
    _, v2 = ledgers.update_ledger(md.ledger_id, lambda m: m.to_in_recovery())
    closed, v3 = ledgers.update_ledger(md.ledger_id, lambda m: m.to_closed(9, length=90))
    assert (v2, v3) == (2, 3)
    assert ledgers.read_ledger(md.ledger_id) == (closed, 3)
    assert (closed.state, closed.last_entry_id, closed.length) == (CLOSED, 9, 90)


def test_transform_may_abort_or_change_nothing(ledgers):
    md = _create(ledgers)
    ledgers.update_ledger(md.ledger_id, lambda m: m.to_closed(-1))
    with pytest.raises(LedgerClosedError):
        ledgers.update_ledger(md.ledger_id, lambda m: m.with_fragment(1, ["a", "b", "c"]))
    assert ledgers.read_ledger(md.ledger_id)[1] == 1
    assert ledgers.update_ledger(md.ledger_id, lambda m: None)[1] == 1
    calls = []
    assert ledgers.update_ledger(md.ledger_id, lambda m: calls.append(m) or m)[1] == 1
    assert len(calls) == 1


def test_in_recovery_refuses_ensemble_change(ledgers):
    md = _create(ledgers)
    ledgers.update_ledger(md.ledger_id, lambda m: m.to_in_recovery())
    with pytest.raises(LedgerFencedError):
        ledgers.update_ledger(md.ledger_id, lambda m: m.with_fragment(3, ["a", "b", "c"]))


def test_conflict_is_retried_on_fresh_metadata(backend):
    ledgers, rival = LedgerManager(backend.open()), LedgerManager(backend.open())
    md = _create(ledgers)
    seen = []

    def add_fragment(current):
        seen.append(current)
        if len(seen) == 1:  # a rival changes the ledger between our read and CAS
            rival.update_ledger(md.ledger_id,
                                lambda m: m.with_fragment(2, ["x", "bookie-2", "bookie-3"]))
        return current.with_fragment(7, ["y", "bookie-2", "bookie-3"])

    result, version = ledgers.update_ledger(md.ledger_id, add_fragment)
    assert version == 2 and len(seen) == 2
    assert [first for first, _ in result.ensembles] == [0, 2, 7]
    assert seen[1].ensembles[1][0] == 2


def test_retries_are_bounded(backend):
    ledgers, rival = LedgerManager(backend.open()), LedgerManager(backend.open())
    md = _create(ledgers)
    calls = []

    def always_conflicting(current):
        calls.append(1)
        _, version = rival.read_ledger(md.ledger_id)
        rival.write_ledger(current.with_fragment(len(calls), ["r", "bookie-2", "bookie-3"]),
                           version)
        return current.to_in_recovery()

    with pytest.raises(MetadataVersionError, match="gave up after 3 conflicts"):
        ledgers.update_ledger(md.ledger_id, always_conflicting, retries_max=3)
    assert len(calls) == 4
    assert ledgers.read_ledger(md.ledger_id)[0].state == OPEN


def test_cas_exactly_on_a_version(ledgers):
    md = _create(ledgers)
    recovering, v1 = ledgers.update_ledger(md.ledger_id, lambda m: m.to_in_recovery(),
                                           expected_version=0)
    assert v1 == 1 and recovering.state == IN_RECOVERY
    calls = []
    with pytest.raises(MetadataVersionError, match="expected version 0"):
        ledgers.update_ledger(md.ledger_id, lambda m: calls.append(m) or m.to_closed(3),
                              expected_version=0)
    assert calls == []
    with pytest.raises(MetadataVersionError):
        ledgers.write_ledger(md.to_closed(5), 0)  # derived from version 0: stale
    assert ledgers.write_ledger(recovering.to_closed(5), 1) == 2
    with pytest.raises(ValueError, match="version"):
        ledgers.write_ledger(md, ANY_VERSION)


def test_impossible_transitions_are_invariant_violations(ledgers):
    import dataclasses

    md = _create(ledgers)
    with pytest.raises(InvariantViolation, match="ledger id"):
        ledgers.update_ledger(md.ledger_id, lambda m: dataclasses.replace(m, ledger_id=999))
    with pytest.raises(InvariantViolation, match="write_quorum"):
        ledgers.update_ledger(md.ledger_id, lambda m: dataclasses.replace(m, write_quorum=2))
    ledgers.update_ledger(md.ledger_id, lambda m: m.to_closed(4))
    with pytest.raises(InvariantViolation, match="back"):
        ledgers.update_ledger(md.ledger_id, lambda m: dataclasses.replace(m, state=OPEN))
    with pytest.raises(InvariantViolation, match="last entry"):
        ledgers.update_ledger(md.ledger_id, lambda m: dataclasses.replace(m, last_entry_id=9))
    assert ledgers.read_ledger(md.ledger_id) == (md.to_closed(4), 1)


def test_list_spans_buckets_and_empty_buckets_are_removed(ledgers, monkeypatch):
    monkeypatch.setattr(ledgers_module, "LEDGERS_PER_BUCKET", 2)
    ids = [_create(ledgers).ledger_id for _ in range(5)]
    assert ledgers.list_ledgers() == ids
    buckets = ledgers.store.children(ledgers_module.IDS_ROOT)
    assert len(buckets) == 3
    ledgers.delete_ledger(ids[2])
    ledgers.delete_ledger(ids[3])
    assert len(ledgers.store.children(ledgers_module.IDS_ROOT)) == 2
    assert ledgers.list_ledgers() == [ids[0], ids[1], ids[4]]
    assert ledgers.ledger_exists(ids[4]) and not ledgers.ledger_exists(ids[3])


def test_wait_for_change_sees_close_by_another_client(backend):
    waiter, closer = LedgerManager(backend.open()), LedgerManager(backend.open())
    md = _create(closer)
    assert waiter.wait_for_change(md.ledger_id, 0, 0.1) is None
    result = {}
    thread = threading.Thread(
        target=lambda: result.setdefault("v", waiter.wait_for_change(md.ledger_id, 0, 30)))
    thread.start()
    closer.update_ledger(md.ledger_id, lambda m: m.to_closed(11))
    thread.join(35)
    assert result["v"] == (md.to_closed(11), 1)
    closer.delete_ledger(md.ledger_id)
    with pytest.raises(NoSuchLedgerError):
        waiter.wait_for_change(md.ledger_id, 1, 1.0)


def _flip_one_byte(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1:]


def test_corrupt_record_raises_naming_the_path(ledgers):
    md = _create(ledgers)
    path = ledger_path(md.ledger_id)
    data, version = ledgers.store.get(path)
    ledgers.store.set(path, _flip_one_byte(data, len(data) - 5), version)
    with pytest.raises(CorruptMetadataError, match=path):
        ledgers.read_ledger(md.ledger_id)
    ledgers.store.set(path, b"not a record at all", ANY_VERSION)
    with pytest.raises(CorruptMetadataError, match=path):
        ledgers.read_ledger(md.ledger_id)
    with pytest.raises(CorruptMetadataError, match=path):
        ledgers.update_ledger(md.ledger_id, lambda m: m.to_in_recovery())
    other = _create(ledgers)  # the rest keeps working
    assert ledgers.read_ledger(other.ledger_id)[0] == other


def test_record_filed_under_another_id_is_corrupt(ledgers):
    a, b = _create(ledgers), _create(ledgers)
    data, _ = ledgers.store.get(ledger_path(a.ledger_id))
    ledgers.store.set(ledger_path(b.ledger_id), data, ANY_VERSION)
    with pytest.raises(CorruptMetadataError, match=ledger_path(b.ledger_id)):
        ledgers.read_ledger(b.ledger_id)


def test_corrupt_id_counter_raises_naming_the_path(ledgers):
    _create(ledgers)
    ledgers.store.set(ledgers_module.IDGEN_PATH, b"garbage", ANY_VERSION)
    with pytest.raises(CorruptMetadataError, match=ledgers_module.IDGEN_PATH):
        _create(ledgers)
