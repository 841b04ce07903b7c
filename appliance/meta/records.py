"""The checksummed envelope around every record the metadata model stores.

Layout: ``b"BKMD"`` magic, a format byte, the CRC32C of the body (big-endian
u32), then the body.  The same bytes go to SQLite and to ZooKeeper, so a
record damaged anywhere (a bit flip, a truncated write, a foreign tool
writing the node) is refused on read with ``CorruptMetadataError`` naming
the node's path, on either backend.  JSON records (registrations, leases)
are compact JSON with sorted keys (``encode_json_record``); one that is not
a JSON object with the keys it must have is refused the same way.
"""

from __future__ import annotations

import json
import struct

import crc32c

from appliance.errors import CorruptMetadataError

MAGIC = b"BKMD"
RECORD_FORMAT = 1
_HEADER = struct.Struct(">4sBI")


def encode_record(body: bytes) -> bytes:
    return _HEADER.pack(MAGIC, RECORD_FORMAT, crc32c.crc32c(body)) + body


def decode_record(data: bytes, path: str) -> bytes:
    """The body of a stored record, or ``CorruptMetadataError`` naming ``path``."""
    if len(data) < _HEADER.size:
        raise CorruptMetadataError(f"{path}: record too short ({len(data)} bytes)")
    magic, fmt, crc = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise CorruptMetadataError(f"{path}: not a metadata record (magic {magic!r})")
    if fmt != RECORD_FORMAT:
        raise CorruptMetadataError(f"{path}: unsupported record format {fmt}")
    body = data[_HEADER.size:]
    if crc32c.crc32c(body) != crc:
        raise CorruptMetadataError(f"{path}: record checksum mismatch")
    return body


def encode_json_record(doc: dict) -> bytes:
    """``doc`` as compact JSON with sorted keys, in the envelope."""
    return encode_record(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode())


def decode_json_record(data: bytes, path: str, what: str,
                       str_keys: tuple[str, ...] = ()) -> dict:
    """The JSON object stored at ``path``, whose ``str_keys`` hold strings;
    else ``CorruptMetadataError`` naming ``path`` (and ``what`` it is not)."""
    body = decode_record(data, path)
    try:
        doc = json.loads(body)
        if not isinstance(doc, dict) or not all(isinstance(doc.get(k), str) for k in str_keys):
            raise ValueError(f"not {what}")
        return doc
    except ValueError as exc:
        raise CorruptMetadataError(f"{path}: cannot decode ({exc})") from exc
