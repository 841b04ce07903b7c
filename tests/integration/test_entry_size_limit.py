"""One payload limit, checked once (CONTRACT: 5 MiB payloads succeed, one
byte more is a ValueError before anything is sent), with the wire and the
bookies sized for the largest legal record (payload + header + digest)."""

from __future__ import annotations

import pytest

from appliance.checks.digest import Crc32cDigest, HmacSha256Digest
from appliance.protocol.entry import ENTRY_OVERHEAD_MAX, HEADER_BYTES
from appliance.protocol.limits import STORAGE_ENTRY_BYTES_MAX as PAYLOAD_BYTES_MAX
from ipc.frames import DEFAULT_LIMITS
from storage.options import StorageOptions


def test_record_limits_hold_the_largest_legal_record():
    largest_digest = max(HmacSha256Digest.size, Crc32cDigest.size)
    assert ENTRY_OVERHEAD_MAX == HEADER_BYTES + largest_digest
    assert DEFAULT_LIMITS.entry_bytes_max >= PAYLOAD_BYTES_MAX + ENTRY_OVERHEAD_MAX
    assert StorageOptions().entry_bytes_max == PAYLOAD_BYTES_MAX  # the key is the payload
    assert StorageOptions().record_bytes_max >= PAYLOAD_BYTES_MAX + ENTRY_OVERHEAD_MAX


@pytest.mark.parametrize("digest", ["crc32c", "hmac-sha256"])
def test_a_payload_of_exactly_the_limit_succeeds_and_one_more_byte_is_refused(client, digest):
    lh = client.create_ledger(3, 3, 2, password=b"p", digest=digest)
    ensembles = client.ledger_metadata(lh.id).ensembles
    big = bytes(range(256)) * (PAYLOAD_BYTES_MAX // 256)
    assert len(big) == PAYLOAD_BYTES_MAX
    assert lh.add(big) == 0
    with pytest.raises(ValueError, match="limit"):
        lh.add(big + b"!")
    assert lh.add(b"after") == 1  # the ledger is still usable
    lh.close()
    md = client.ledger_metadata(lh.id)
    assert md.ensembles == ensembles  # no bookie was blamed: no ensemble change
    with client.open_ledger(lh.id, b"p") as rh:
        got = [e.payload for e in rh.read(0, 1)]
    assert got == [big, b"after"]
