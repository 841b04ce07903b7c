"""The stored password check: a salted scrypt record (v2), ledgers created
with the unsalted v1 hash still accepted, anything else refused."""

from __future__ import annotations

import hashlib
import os

import pytest

from appliance.protocol.keys import (
    SALT_BYTES,
    check_password,
    master_key,
    password_hash,
    password_record,
)

KEY, OTHER = master_key(b"right"), master_key(b"wrong")


def test_v2_record_is_salted_scrypt_and_checks_only_its_key():
    salt = os.urandom(SALT_BYTES)
    record = password_record(KEY, salt)
    assert len(record) == 52 and record[0] == 2 and record[1:4] == bytes([14, 8, 1])
    assert record[4:20] == salt
    assert record[20:] == hashlib.scrypt(KEY, salt=salt, n=1 << 14, r=8, p=1, maxmem=1 << 25,
                                         dklen=32)
    assert check_password(record, KEY) and not check_password(record, OTHER)
    assert password_record(KEY, os.urandom(SALT_BYTES)) != record  # salted
    assert KEY not in record and password_hash(KEY) not in record


def test_v1_records_of_older_ledgers_still_check():
    assert check_password(password_hash(KEY), KEY)
    assert not check_password(password_hash(KEY), OTHER)
    assert check_password(None, KEY)  # a ledger without a password


@pytest.mark.parametrize("record", [b"", b"x" * 31, b"\x03" + bytes(51), b"\x02" + bytes(50),
                                    b"\x02\x1f\x08\x01" + bytes(48),  # N = 2^31: refused
                                    b"\x02\x0e\xff\x01" + bytes(48)])
def test_malformed_or_costly_records_match_nothing(record):
    assert not check_password(record, KEY)


def test_bad_salt_is_a_value_error():
    with pytest.raises(ValueError):
        password_record(KEY, b"short")
