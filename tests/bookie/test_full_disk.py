"""A full disk on one bookie, without processes: a journal write that fails
with ENOSPC never lets a parked add be acknowledged, the handler hands the
failure on (a full disk: read-only), the storage reopens in place and takes
adds again; the direct-I/O probe does not mistake a full disk for one that
refuses O_DIRECT."""

from __future__ import annotations

import errno
import os
import time

import pytest

from appliance.bookie.disk_monitor import DiskMonitor, PublishedFlag
from appliance.bookie.full_disk import FullDisk
from appliance.checks.digest import make_digest
from appliance.errors import OK, BookieIOError, ReadOnlyError
from appliance.protocol.entry import pack_entries
from appliance.protocol.keys import master_key
from ipc.frames import DEFAULT_LIMITS
from ipc.packed import AddPackedReply, AddPackedRequest
from ipc.replies import ErrorReply
from storage import aligned_io
from tests.support.bookie_handler import handler_on_storage

KEY = master_key(b"pw")


class _Server:
    limits = DEFAULT_LIMITS

    def __init__(self):
        self.sent: list = []
        self.fds: dict = {}

    def watch_fd(self, fd, callback) -> None:
        self.fds[fd] = callback

    def unwatch_fd(self, fd) -> None:
        self.fds.pop(fd, None)

    def send_reply(self, peer: bytes, reply) -> bool:
        self.sent.append((peer, reply))
        return True


def _full() -> BookieIOError:
    try:
        raise OSError(errno.ENOSPC, "No space left on device")
    except OSError as exc:
        try:
            raise BookieIOError("write to journal-000000000001.seg failed") from exc
        except BookieIOError as wrapped:
            return wrapped


def _add(ledger_id: int, first: int, n: int, request_id: int) -> AddPackedRequest:
    records, _ = pack_entries(ledger_id, first, first - 1, 0, [b"e" * 100] * n,
                              make_digest("crc32c", KEY))
    req = AddPackedRequest.of(ledger_id, KEY, range(first, first + n), records)
    req.request_id = request_id
    return req


def _wait(predicate, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)  # polling a thread's progress


@pytest.fixture
def handler(tmp_path):
    with handler_on_storage(tmp_path, _Server()) as h:
        yield h


def test_an_add_parked_when_the_journal_meets_enospc_is_refused_never_acknowledged(
        handler, monkeypatch):
    h, storage = handler, handler.storage
    failures = []
    h.on_storage_failure = failures.append

    def no_room(group):
        raise _full()

    monkeypatch.setattr(storage._journal, "_write_group", no_room)
    h.handle(b"p", _add(1, 0, 3, request_id=7))
    h.after_drain()
    assert h.server.sent == []  # parked: not durable
    _wait(lambda: storage.failure() is not None)
    h._on_durable()
    replies = [reply for _, reply in h.server.sent]
    assert len(replies) == 1 and isinstance(replies[0], ErrorReply), replies
    assert replies[0].status == ReadOnlyError.code and replies[0].request_id == 7
    assert len(failures) == 1 and aligned_io.out_of_space(failures[0])

    h.detach_storage()  # the old journal's tickets are gone with it
    storage.reopen()
    h.attach_storage()
    assert storage.failure() is None and storage.counters["reopens"] == 1
    h.server.sent.clear()
    h.handle(b"p", _add(1, 0, 3, request_id=8))  # the writer's retry (or another writer)
    h.after_drain()
    storage.wait_durable(storage._journal_seq, 30)
    h._on_durable()
    replies = [reply for _, reply in h.server.sent]
    assert [type(r) for r in replies] == [AddPackedReply] and replies[0].request_id == 8
    assert list(replies[0].statuses) == [OK] * 3


def test_full_disk_turns_read_only_publishes_and_reopens_once_usage_is_back(handler,
                                                                            monkeypatch):
    h, storage = handler, handler.storage
    usage = {"now": 0.97}
    monitor = DiskMonitor([storage.journal_dir], 0.95, 0.90, usage_fn=lambda d: usage["now"])
    published = []
    full = FullDisk(storage, h, monitor, PublishedFlag(published.append),
                    after_reopen=lambda: None)
    h.on_storage_failure = full.failed
    monkeypatch.setattr(storage._journal, "_write_group", lambda group: (_ for _ in ()).throw(
        _full()))
    h.handle(b"p", _add(2, 0, 1, request_id=1))
    h.after_drain()
    _wait(lambda: storage.failure() is not None)
    full.check()  # notices the failure no durability wait reported yet
    assert full.full and monitor.read_only and published == [True]
    assert "a write failed" in monitor.reason
    full.check()  # still 97% used: stays read-only, no reopen
    assert storage.failure() is not None and storage.counters.get("reopens", 0) == 0
    usage["now"] = 0.50
    full.check()
    assert not full.full and storage.failure() is None and not monitor.read_only
    assert published == [True, False] and full.stats["reopens"] == 1


def test_any_other_storage_failure_still_stops_the_bookie(handler):
    full = FullDisk(handler.storage, handler, DiskMonitor([handler.storage.journal_dir],
                                                          0.95, 0.9),
                    PublishedFlag(lambda ro: None), lambda: None)
    with pytest.raises(BookieIOError, match="storage failed"):
        full.failed(BookieIOError("fdatasync of journal-000000000001.seg failed: EIO"))


def test_the_direct_io_probe_counts_a_full_disk_as_direct_io(tmp_path, monkeypatch):
    def no_room(fd, data, offset):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    real_open = os.open
    # the open as a file system that takes O_DIRECT would do it (tmpfs would refuse)
    monkeypatch.setattr(aligned_io.os, "open",
                        lambda path, flags, mode=0o777: real_open(path, flags & ~os.O_DIRECT,
                                                                  mode))
    monkeypatch.setattr(aligned_io.os, "pwrite", no_room)
    assert aligned_io.probe_direct_io(str(tmp_path)) is True
    assert not (tmp_path / ".direct-io-probe").exists()
