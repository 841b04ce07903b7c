"""Directory-level steps of LedgerStorage: format, exclusive locks, the open
sequence (cookies, direct-I/O probe, clean marker, snapshot, scan, replay),
snapshot metadata and the clean marker.

Each directory keeps a RESERVE file (``limits.STORAGE_RESERVE_BYTES``,
created at open when there is room): a storage that failed for a full
disk gives it back before it reopens, so the reopen, the deletes and the
index snapshot of ``bkctl bookie gc`` have room (``LedgerStorage.reopen``).

Open refuses, before touching any data file, when: a cookie is missing,
foreign or swapped (``CookieMismatchError``); another process holds the
directories (``ConfigError``); O_DIRECT is refused and ``direct_io`` is on
(``ConfigError``); the snapshot or the journal is corrupt beyond a torn tail
(``CorruptRecordError``).  Each message names the file and the fix.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import time

from appliance.protocol import limits
from appliance.protocol.errors import ConfigError, CorruptRecordError

from . import aligned_io as aio
from . import cookie as ck
from . import journal_scan as js
from . import snapshot
from .entry_log import EntryLogger, list_logs
from .entry_log_per_ledger import PerLedgerEntryLogger
from .index import Index
from .journal import Journal, trim_tail
from .options import StorageOptions
from .recovery import Replayer, scan_entry_logs

log = logging.getLogger(__name__)

LOCK_NAME = "LOCK"
RESERVE_NAME = "RESERVE"
_OURS = re.compile(r"^(COOKIE|CLEAN|LOCK|RESERVE|index\.snap|journal-\d{12}\.seg|"
                   r"entrylog-\d{10}\.log|\.direct-io-probe)(\.tmp)?$")


def format_dirs(bookie_id: str, journal_dir: str, ledger_dir: str,
                options: StorageOptions, force: bool) -> None:
    if os.path.realpath(journal_dir) == os.path.realpath(ledger_dir):
        raise ConfigError(f"journal_dir and ledger_dir are the same directory ({journal_dir}): "
                          f"give each its own directory")
    for key, directory in (("journal_dir", journal_dir), ("ledger_dir", ledger_dir)):
        aio.make_dirs(directory)
        names = os.listdir(directory)
        if names and not force:
            raise ConfigError(f"{key} {directory} is not empty ({len(names)} files): refusing "
                              f"to format over data; pass force=True to wipe storage files")
        for name in names:
            if _OURS.match(name):
                os.unlink(os.path.join(directory, name))
        left = os.listdir(directory)
        if left:
            raise ConfigError(f"{key} {directory} holds files that are not bookie storage "
                              f"({', '.join(sorted(left)[:3])}): move them away first")
    instance_id = ck.write_cookies(bookie_id, journal_dir, ledger_dir)
    meta = _meta(instance_id, 0, (0, 0), (0, 0), {}, ())
    snapshot.save(ledger_dir, meta, Index())


def _meta(instance_id: str, seq: int, journal_mark, log_mark, ledger_bytes: dict,
          garbage_logs) -> dict:
    return {"instance_id": instance_id, "seq": seq, "journal_mark": list(journal_mark),
            "entry_log_mark": list(log_mark),
            "ledger_bytes": {str(k): list(v.items()) for k, v in ledger_bytes.items()},
            "garbage_logs": sorted(garbage_logs)}


def lock_dirs(st) -> None:
    for directory in (st.journal_dir, st.ledger_dir):
        fd = os.open(os.path.join(directory, LOCK_NAME), os.O_CREAT | os.O_RDWR | os.O_CLOEXEC,
                     aio.FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise ConfigError(f"{directory} is in use by another bookie process: stop it "
                                  f"first (one process per directory)") from exc
            raise
        st._lock_fds.append(fd)


def release_locks(st) -> None:
    for fd in st._lock_fds:
        os.close(fd)
    st._lock_fds.clear()


def ensure_reserve(directory: str) -> bool:
    """Keep ``limits.STORAGE_RESERVE_BYTES`` allocated in ``directory`` (the
    RESERVE file), to give back when the disk is full; False when there is
    no room for it now (nothing is left behind)."""
    path = os.path.join(directory, RESERVE_NAME)
    if os.path.exists(path):
        return True
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_CREAT | os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC, aio.FILE_MODE)
    try:
        os.posix_fallocate(fd, 0, limits.STORAGE_RESERVE_BYTES)
        os.fsync(fd)
    except OSError as exc:
        os.close(fd)
        os.unlink(tmp)
        if exc.errno in aio.FULL_ERRNOS:
            return False
        raise
    os.close(fd)
    os.rename(tmp, path)
    return True


def release_reserve(directory: str) -> int:
    """Give the RESERVE file's room back; returns the bytes freed."""
    path = os.path.join(directory, RESERVE_NAME)
    try:
        size = os.stat(path).st_blocks * 512
        os.unlink(path)
    except FileNotFoundError:
        return 0
    return size


def recover_into(st, reserve: bool = True) -> bool:
    """The open sequence; fills ``st`` (a LedgerStorage under construction).
    True when the caller must checkpoint before taking writes (anything was
    replayed or rebuilt, or the shutdown was not clean).  ``reserve``: make
    sure each directory holds its RESERVE (when there is room)."""
    started = time.monotonic()
    doc = ck.verify_cookies(st.bookie_id, st.journal_dir, st.ledger_dir)
    st.instance_id, st.cookie = doc["instance_id"], doc
    instance = bytes.fromhex(st.instance_id)
    lock_dirs(st)
    for directory in (st.journal_dir, st.ledger_dir) if reserve else ():
        if not ensure_reserve(directory):
            log.warning("%s: no room for its %d-byte reserve (the disk is full)", directory,
                        limits.STORAGE_RESERVE_BYTES)
    direct_j = aio.decide_direct_io(st.journal_dir, st.options.direct_io, "journal_dir")
    direct_l = aio.decide_direct_io(st.ledger_dir, st.options.direct_io, "ledger_dir")
    clean = ck.consume_clean_marker(st.ledger_dir, st.instance_id)
    journal_less = ck.read_marker(st.ledger_dir, ck.JOURNAL_LESS_NAME) is not None
    pending = ck.read_marker(st.ledger_dir, ck.POSSIBLE_LOSS_NAME)
    meta, rebuilt = _load_or_rebuild(st)
    min_seq = int(meta["seq"])
    log_mark, log_off = meta["entry_log_mark"]
    scanned = scan_entry_logs(st.ledger_dir, log_mark, log_off, min_seq)
    manager = PerLedgerEntryLogger if st.options.entry_log_per_ledger else EntryLogger
    st._logs = manager(st.ledger_dir, st.options, instance, direct_l,
                       max(list_logs(st.ledger_dir) + [log_mark]) + 1)
    st._logs.ledger_bytes = {int(k): {int(l): int(b) for l, b in v}
                             for k, v in meta["ledger_bytes"].items()}
    # compacted logs the snapshot says nothing points into (see storage.compaction)
    # (a crash right after removing one leaves its name behind: dropped here)
    on_disk = set(list_logs(st.ledger_dir))
    st._garbage = set(meta.get("garbage_logs", ())) & on_disk
    st._persisted_garbage = set(st._garbage)
    replayer = Replayer(st, scanned, min_seq)
    mark_seg, mark_off = meta["journal_mark"]
    journal_replaced = any(r.startswith("journal_dir ") and ck.REPLACED_MARK in r
                           for r in (pending or {}).get("reasons", []))
    end = js.replay(st.journal_dir, mark_seg, mark_off, replayer.on_record,
                    replayer.by_seq.__contains__, allow_missing_mark=journal_replaced)
    replayer.finish()
    st._seq = max(replayer.max_seq, end.last_seq, min_seq)
    segments = js.list_segments(st.journal_dir)
    prev_end = end.end_offset if segments and end.segment_id == segments[-1] else 0
    if prev_end and end.cut is None:  # its unused preallocated tail: room on a full disk
        trim_tail(js.segment_path(st.journal_dir, end.segment_id), prev_end)
    st._journal = Journal(st.journal_dir, st.options, instance, direct_j,
                          max(segments + [mark_seg]) + 1, prev_end, st._seq)
    st._journal_seq = st._seq
    replayed = end.records + len(scanned)
    if clean and (replayed or rebuilt):
        log.warning("%s: clean marker present but %d records had to be replayed; "
                    "treating the shutdown as unclean", st.ledger_dir, replayed)
    st.clean_shutdown_before = clean and not replayed and not rebuilt
    _note_possible_loss(st, pending, rebuilt, journal_less)
    st.fresh = st._seq == 0 and not st._index.ledgers
    st.recovery_stats = {"recovered_journal_records": end.records,
                         "recovered_log_blocks": len(scanned), "recovery_cut": end.cut,
                         "index_rebuilt": rebuilt, **replayer.applied}
    st.recovery_stats["open_s"] = round(time.monotonic() - started, 3)
    return bool(replayed or rebuilt or not clean)


def _note_possible_loss(st, pending: dict | None, rebuilt: bool, journal_less: bool) -> None:
    """BP-46 detection, kept durable before the open checkpoint can erase
    its evidence (a rebuilt index is checkpointed; a marker-less crash is
    not repeated): ``st.possible_loss_reasons`` lists why data may be gone."""
    reasons = list((pending or {}).get("reasons", ["damaged POSSIBLE_LOSS marker"]
                                       if pending else []))
    found = []
    if rebuilt:
        found.append("index rebuilt from a scan (fence bits and keys may be lost)")
    if journal_less and not st.clean_shutdown_before:
        found.append("unclean shutdown after adds acknowledged without the journal")
    reasons += [r for r in found if r not in reasons]
    if reasons and reasons != (pending or {}).get("reasons"):
        ck.write_marker(st.ledger_dir, ck.POSSIBLE_LOSS_NAME, {"reasons": reasons})
    if not st.options.journal_write_data and not journal_less:
        ck.write_marker(st.ledger_dir, ck.JOURNAL_LESS_NAME, {"since_seq": st._seq})
    elif st.options.journal_write_data and journal_less and st.clean_shutdown_before:
        # the clean close checkpointed what was written without the journal
        ck.remove_marker(st.ledger_dir, ck.JOURNAL_LESS_NAME)
    st.possible_loss_reasons = reasons


def note_possible_loss(st, reason: str) -> None:
    """Record one more reason (durably) before acting on it."""
    if reason not in st.possible_loss_reasons:
        st.possible_loss_reasons.append(reason)
        ck.write_marker(st.ledger_dir, ck.POSSIBLE_LOSS_NAME,
                        {"reasons": st.possible_loss_reasons})


def possible_loss_handled(st) -> None:
    """Phase one is durable: forget the reasons; the journal-less mark too
    once adds wait for the journal again (data written before is covered
    by phase one's limbo)."""
    ck.remove_marker(st.ledger_dir, ck.POSSIBLE_LOSS_NAME)
    if st.options.journal_write_data:
        ck.remove_marker(st.ledger_dir, ck.JOURNAL_LESS_NAME)
    st.possible_loss_reasons = []


def _load_or_rebuild(st) -> tuple[dict, bool]:
    if snapshot.exists(st.ledger_dir):
        meta, index = snapshot.load(st.ledger_dir)
        if meta.get("instance_id") != st.instance_id:
            raise CorruptRecordError(f"index snapshot in {st.ledger_dir} belongs to instance "
                                     f"{meta.get('instance_id')}, not {st.instance_id}: it was "
                                     f"copied from another bookie; move it away to rebuild")
        st._index = index
        return meta, False
    segments = js.list_segments(st.journal_dir)
    log.error("%s: index snapshot missing; rebuilding from every entry log and the "
              "journal: ledger state older than the journal is lost (reported as an "
              "unclean shutdown)", st.ledger_dir)
    st._index = Index()
    first_seg = segments[0] if segments else 0
    return _meta(st.instance_id, 0, (first_seg, 0), (0, 0), {}, ()), True


def snapshot_meta(st, journal_mark: tuple[int, int]) -> dict:
    """The snapshot's meta as of now (a copy: taken under the storage lock)."""
    return _meta(st.instance_id, st._seq, journal_mark, st._logs.position,
                 st._logs.ledger_bytes, st._garbage)


def save_snapshot(st, meta: dict, index: Index) -> None:
    """Write the snapshot of ``meta`` and ``index`` (a frozen copy: no lock needed)."""
    st.counters["snapshot_bytes"] = snapshot.save(st.ledger_dir, meta, index)


def write_clean_marker(st) -> None:
    ck.write_clean_marker(st.ledger_dir, st.instance_id, st._seq)
