"""Entry format, digests and key derivation."""

import pytest

from appliance.checks.digest import make_digest, master_key, password_hash
from appliance.errors import BadRequestError, DigestMismatchError
from appliance.protocol.entry import (
    HEADER_BYTES,
    pack_entries,
    pack_entry,
    unpack_header,
    verify_and_payload,
    verify_entries,
    verify_entry,
)

KEY = master_key(b"secret")


@pytest.fixture(params=["crc32c", "hmac-sha256"])
def digest(request):
    return make_digest(request.param, KEY)


def test_round_trip_header_and_payload(digest):
    record = pack_entry(7, 3, 2, 1000, b"hello", digest)
    assert len(record) == HEADER_BYTES + digest.size + 5
    assert unpack_header(record) == (7, 3, 2, 1000)
    assert bytes(verify_and_payload(record, digest)) == b"hello"
    lac, length, payload = verify_entry(record, digest, 7, 3)
    assert (lac, length, bytes(payload)) == (2, 1000, b"hello")


@pytest.mark.parametrize("offset", [0, 8, 16, 24, HEADER_BYTES, -1])
def test_any_flipped_bit_is_refused(digest, offset):
    record = bytearray(pack_entry(7, 3, 2, 1000, b"hello world", digest))
    record[offset] ^= 0x01
    with pytest.raises(DigestMismatchError):
        verify_and_payload(bytes(record), digest)


def test_truncated_and_foreign_records_are_refused(digest):
    record = pack_entry(7, 3, 2, 10, b"payload", digest)
    with pytest.raises(DigestMismatchError):
        verify_and_payload(record[:HEADER_BYTES + 1], digest)
    with pytest.raises(DigestMismatchError):
        verify_and_payload(record[:-1], digest)
    with pytest.raises(DigestMismatchError, match="asked for ledger 7 entry 4"):
        verify_entry(record, digest, 7, 4)
    with pytest.raises(BadRequestError):
        unpack_header(b"short")


def test_hmac_needs_the_password():
    right = make_digest("hmac-sha256", KEY)
    wrong = make_digest("hmac-sha256", master_key(b"other"))
    record = pack_entry(1, 0, -1, 3, b"abc", right)
    with pytest.raises(DigestMismatchError):
        verify_and_payload(record, wrong)
    # crc32c is keyless: the same record verifies under any password
    crc = make_digest("crc32c", KEY)
    assert bytes(verify_and_payload(pack_entry(1, 0, -1, 3, b"abc", crc),
                                    make_digest("crc32c", master_key(b"x")))) == b"abc"


def test_batch_packing_matches_single_packing(digest):
    payloads = [b"a", b"bb", b"", b"dddd"]
    records, length = pack_entries(9, 10, 8, 100, payloads, digest)
    assert length == 107
    expected, running = [], 100
    for offset, payload in enumerate(payloads):
        running += len(payload)
        expected.append(pack_entry(9, 10 + offset, 8, running, payload, digest))
    assert records == expected
    assert [bytes(p) for p in verify_entries(records, digest)] == payloads


@pytest.mark.parametrize("kw", [dict(entry_id=-1), dict(lac=5), dict(lac=-2), dict(length=-1)])
def test_impossible_headers_are_refused(digest, kw):
    args = dict(ledger_id=1, entry_id=5, lac=4, length=0)
    args.update(kw)
    with pytest.raises(ValueError):
        pack_entry(args["ledger_id"], args["entry_id"], args["lac"], args["length"], b"", digest)


def test_keys_are_deterministic_and_domain_separated():
    assert master_key(b"pw") == master_key(b"pw") and len(master_key(b"pw")) == 32
    assert master_key(b"pw") != master_key(b"pw2")
    assert password_hash(master_key(b"pw")) != master_key(b"pw")
    with pytest.raises(TypeError):
        master_key("not bytes")
    with pytest.raises(ValueError):
        make_digest("md5", KEY)
