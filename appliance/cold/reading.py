"""A cold segment's records, verified, for readers (``LogReader``, Spark).

``open_file`` finds the file a segment names: through the configured store
(its endpoint and credentials) when the URI is under it, else with
pyarrow's defaults for the URI (a reader connected without a config).
``segment_records`` verifies the whole file (``segment_file.read_segment``)
before it returns a record, and ``open_checked_segment`` (Spark) the whole
file's checksum and footer before a record is decoded: a damaged file is
``CorruptColdSegmentError`` naming the segment, never served.
"""

from __future__ import annotations

from itertools import repeat

import pyarrow.fs as pafs

from appliance.cold.segment_file import open_segment, read_segment
from appliance.cold.store import ColdStore
from appliance.protocol.logs import DLSN, Segment


def open_file(cold_config, uri: str):
    """(filesystem, path) of a cold file."""
    if cold_config is not None and cold_config.uri:
        return ColdStore.from_config(cold_config).open(uri)
    return pafs.FileSystem.from_uri(uri)


def delete_file(cold_config, uri: str) -> bool:
    """Remove a cold file (truncation, deletion); False if it was not there."""
    fs, path = open_file(cold_config, uri)
    try:
        fs.delete_file(path)
    except FileNotFoundError:
        return False
    return True


def load_segment(cold_config, log_name: str, seg: Segment):
    """The verified Arrow table of a cold segment."""
    fs, path = open_file(cold_config, seg.cold.uri)
    return read_segment(fs, path, log_name, seg, seg.cold.crc32c, seg.cold.file_crc32c,
                        seg.cold.uri)


def open_checked_segment(cold_config, log_name: str, seg: Segment):
    """A cold segment's ``pyarrow.parquet.ParquetFile``, its whole file
    checked (``segment_file.open_segment``) before a record is decoded."""
    fs, path = open_file(cold_config, seg.cold.uri)
    return open_segment(fs, path, log_name, seg, seg.cold.crc32c, seg.cold.file_crc32c,
                        seg.cold.uri)


def segment_records(cold_config, log_name: str, seg: Segment, make_record,
                    start: DLSN, min_txid: int | None = None) -> list:
    """``make_record((dlsn, txid, payload))`` for each record at or after
    ``start`` (and with txid >= ``min_txid``), in order."""
    table = load_segment(cold_config, log_name, seg)
    entries = table.column("entry_id").to_numpy()
    slots = table.column("slot").to_numpy()
    txids = table.column("txid").to_pylist()
    payloads = table.column("payload").to_pylist()
    new = tuple.__new__
    dlsns = map(new, repeat(DLSN), zip(repeat(seg.seq), entries.tolist(), slots.tolist()))
    out = []
    for dlsn, txid, payload in zip(dlsns, txids, payloads, strict=True):
        if dlsn < start or (min_txid is not None and txid < min_txid):
            continue
        out.append(make_record((dlsn, txid, payload)))
    return out
