"""``appliance.checks.record_check``: the vectorised record checks shared by the
client's catch-up reads and the Spark bulk reads answer exactly as the pure
core's ``verify_run`` (same verified prefix, same payloads, same LAC) on good
and damaged replies, with both digests and on both CRC paths; and the reader
core fed packed replies through it gives the same reads."""

from __future__ import annotations

import dataclasses
import random

import crc32c
import numpy as np
import pytest

from appliance.checks import record_check
from appliance.checks.digest import make_digest
from appliance.checks.record_check import check_records, verify_run_fast
from appliance.errors import OK
from appliance.protocol import events as ev
from appliance.protocol.entry import pack_entries, verify_run
from appliance.protocol.keys import master_key
from appliance.protocol.read_batch import PackedRecords
from appliance.protocol.reader import LedgerReader, ReaderConfig
from storage import crc_vec
from tests.protocol.helpers import DIGEST, metadata, one
from tests.protocol.test_read_batches import BatchLoop, fill

KEY = master_key(b"pw")


def _records(rng: random.Random, digest, count: int, first: int = 1000,
             uniform: bool = False) -> list[bytes]:
    """Records of varied payload sizes, or (``uniform``) of one size: the
    joined path that checks a whole reply with one CRC call."""
    one = rng.choice([0, 1, 100, 1024])
    sizes = [one if uniform else rng.choice([0, 1, 7, 100, 1024, 3000]) for _ in range(count)]
    payloads = [rng.randbytes(n) for n in sizes]
    records, _ = pack_entries(42, first, first - 1, 10_000, payloads, digest)
    return records


def _damage(rng: random.Random, records: list[bytes]) -> list[bytes]:
    """One of: a flipped bit, a record of another entry, a short record."""
    records = list(records)
    i = rng.randrange(len(records))
    kind = rng.choice(["flip", "swap", "short"])
    if kind == "flip":
        rec = bytearray(records[i])
        rec[rng.randrange(len(rec))] ^= 1 << rng.randrange(8)
        records[i] = bytes(rec)
    elif kind == "swap" and len(records) > 1:
        j = (i + 1) % len(records)
        records[i] = records[j]
    else:
        records[i] = records[i][:rng.randrange(36)]
    return records


@pytest.mark.parametrize("digest_type", ["crc32c", "hmac-sha256"])
@pytest.mark.parametrize("path", ["uniform", "varied", "many_lengths"])
def test_same_answers_as_verify_run(digest_type, path, monkeypatch):
    if path == "many_lengths":  # the two-calls-per-record CRC path
        monkeypatch.setattr(record_check, "FAST_LENGTHS_MAX", 0)
    digest = make_digest(digest_type, KEY)
    rng = random.Random(f"{digest_type}{path}")
    for trial in range(60):
        records = _records(rng, digest, rng.randrange(1, 40), uniform=path == "uniform")
        if trial % 3:
            records = _damage(rng, records)
        want_payloads, want_lac = verify_run(records, digest, 42, 1000)
        want = ([bytes(p) for p in want_payloads], want_lac)
        packed = PackedRecords(b"".join(records), [len(r) for r in records])
        for got in (verify_run_fast(records, digest, 42, 1000),
                    verify_run_fast(packed, digest, 42, 1000)):
            assert ([bytes(p) for p in got[0]], got[1]) == want
        if trial % 3 == 0:
            assert len(want_payloads) == len(records)  # undamaged: everything verifies


def test_every_damaged_record_is_cut_with_its_reason():
    digest = make_digest("crc32c", KEY)
    records = _records(random.Random(3), digest, 20)
    data = bytearray(b"".join(records))
    lengths = np.array([len(r) for r in records])
    for i in range(20):
        where = int(lengths[:i].sum()) + int(lengths[i]) - 1  # last byte of record i
        data[where] ^= 0x80
        check = check_records(bytes(data), lengths, 42, 1000, digest)
        data[where] ^= 0x80
        assert check.good == i and "digest or header" in check.why
        assert check.top_lac == (-1 if i == 0 else 999)  # the batch was packed with LAC 999
    check = check_records(bytes(data), lengths, 42, 999, digest)
    assert check.good == 0 and "asked for ledger 42 entry 999" in check.why


def test_strict_also_checks_lac_and_running_length():
    digest = make_digest("crc32c", KEY)
    bad_lac, _ = pack_entries(42, 5, 5, 0, [b"a", b"b"], digest)  # LAC == entry id
    lengths = [len(r) for r in bad_lac]
    assert check_records(b"".join(bad_lac), lengths, 42, 5, digest, strict=False).good == 2
    assert check_records(b"".join(bad_lac), lengths, 42, 5, digest, strict=True).good == 0
    one_rec, _ = pack_entries(42, 5, 4, 0, [b"a"], digest)
    other, _ = pack_entries(42, 6, 4, 999, [b"b"], digest)  # running length jumps
    recs = one_rec + other
    check = check_records(b"".join(recs), [len(r) for r in recs], 42, 5, digest, strict=True)
    assert check.good == 1 and "running length" in check.why


def _damaged_13(event):
    """b1's and b2's copies of entry 13 with their last byte flipped (single or
    batch replies): only b3 serves it."""
    if event is None or event.bookie_id not in ("b1", "b2") or event.code != OK:
        return event
    if isinstance(event, ev.ReadResponse):
        if event.entry_id == 13:
            return dataclasses.replace(event, data=event.data[:-1] + bytes([event.data[-1] ^ 1]))
        return event
    datas = [bytes(d) if d is not None else None for d in event.datas]
    for i, entry_id in enumerate(event.entry_ids):
        if entry_id == 13 and datas[i]:
            datas[i] = datas[i][:-1] + bytes([datas[i][-1] ^ 1])
    return dataclasses.replace(event, datas=tuple(datas))


class DamagingLoop(BatchLoop):
    damaged = True

    def _carry_out(self, a):
        out = super()._carry_out(a)
        return _damaged_13(out) if self.damaged else out


class PackedLoop(DamagingLoop):
    """Its replies carry their records packed, as the driver's do."""

    def _carry_out(self, a):
        out = super()._carry_out(a)
        if isinstance(out, ev.ReadBatchResponse) and out.datas:
            records = [r if c == OK else b"" for r, c in zip(out.datas, out.codes, strict=True)]
            out = dataclasses.replace(out, datas=PackedRecords(b"".join(records),
                                                               list(map(len, records))))
        return out


@pytest.mark.parametrize("damaged", [False, True])
def test_reader_core_with_packed_replies_reads_the_same(damaged):
    results = []
    for loop_cls, verify in ((DamagingLoop, verify_run), (PackedLoop, verify_run_fast)):
        loop = loop_cls(metadata())
        fill(loop, 40)
        loop.damaged = damaged
        r = LedgerReader(loop.meta[1][0], DIGEST, master_key=KEY, verify_batch=verify,
                         config=ReaderConfig(read_batch_entries=8))
        r.last_add_confirmed = 39
        loop.run(r, r.read(0, 39, 0))
        done = one(ev.ReadDone, loop.results)
        assert done.code == OK
        results.append(([bytes(p) for p in done.payloads], r.last_add_confirmed,
                         len(loop.sent)))
    assert results[0] == results[1]
    assert results[0][0] == [b"e%d" % e for e in range(40)]
    assert results[0][2] > 5 if damaged else results[0][2] == 5  # 5 batches, + failovers


def test_joined_crc_equals_the_crc_of_the_concatenation():
    rng = random.Random(5)
    for size in (0, 1, 100, 1024, 5000):
        for n in (1, 2, 31, 32, 33, 1000, 1025):
            pieces = [rng.randbytes(size) for _ in range(n)]
            crcs = np.array([crc32c.crc32c(p) for p in pieces], np.uint32)
            assert crc_vec.joined_crc(crcs, size) == crc32c.crc32c(b"".join(pieces))
    head, tail = rng.randbytes(32), rng.randbytes(70_000)  # squared advance tables
    advanced = crc_vec.advance(np.array([crc32c.crc32c(head)], np.uint32), len(tail))
    assert int(advanced[0]) ^ crc32c.crc32c(tail) == crc32c.crc32c(head + tail)


def _only(monkeypatch, path: str) -> None:
    """Make the other joined-CRC path of ``_check_uniform`` fail the test if taken."""
    def refuse(*args):
        raise AssertionError(f"took the other path than {path}")

    other = "_joined_digests_ok" if path == "stripped" else "_stripped_digests_ok"
    monkeypatch.setattr(record_check, other, refuse)
    monkeypatch.setattr(record_check, "STRIPPED_PAYLOAD_MAX", 1 << 30 if path == "stripped"
                        else -1)


@pytest.mark.parametrize("path", ["stripped", "joined"])
def test_uniform_reply_damage_anywhere_is_found_record_by_record(path, monkeypatch):
    _only(monkeypatch, path)
    digest = make_digest("crc32c", KEY)
    rng = random.Random(9)
    records = _records(rng, digest, 64, uniform=True)
    while len(records[0]) < 40:
        records = _records(rng, digest, 64, uniform=True)
    data, lengths = b"".join(records), [len(records[0])] * 64
    assert check_records(data, lengths, 42, 1000, digest).joined is not None  # one-call path
    for _ in range(40):
        pos = rng.randrange(len(data))
        bad = bytearray(data)
        bad[pos] ^= 1 << rng.randrange(8)
        check = check_records(bytes(bad), lengths, 42, 1000, digest, strict=False)
        assert check.good == pos // lengths[0]
        assert check.payload_list() == [r[36:] for r in records[:check.good]]


@pytest.mark.parametrize("path", ["stripped", "joined"])
@pytest.mark.parametrize("size", [0, 1, 100, 1024])
def test_both_joined_paths_take_exactly_the_good_uniform_replies(path, size, monkeypatch):
    """Each one-call CRC path passes an undamaged uniform reply whole and
    refuses it (for the record-by-record check) after any one-bit flip of a
    header, digest or payload byte."""
    _only(monkeypatch, path)
    digest = make_digest("crc32c", KEY)
    rng = random.Random(f"{path}{size}")
    payloads = [rng.randbytes(size) for _ in range(50)]
    records, _ = pack_entries(42, 1000, 990, 10_000, payloads, digest)
    rec = len(records[0])
    rows = np.frombuffer(b"".join(records), np.uint8).reshape(50, rec)
    ok = (record_check._stripped_digests_ok(rows, 36) if path == "stripped"
          else record_check._joined_digests_ok(rows[:, :36], rows[:, 36:].tobytes(), size))
    assert ok
    check = check_records(b"".join(records), [rec] * 50, 42, 1000, digest)
    assert (check.good, check.why, check.payload_bytes()) == (50, None, b"".join(payloads))
    for _ in range(30):
        bad = rows.copy()
        i, j = rng.randrange(50), rng.randrange(rec)
        bad[i, j] ^= 1 << rng.randrange(8)
        if path == "stripped":
            assert not record_check._stripped_digests_ok(bad, 36)
        else:
            assert not record_check._joined_digests_ok(bad[:, :36], bad[:, 36:].tobytes(), size)
