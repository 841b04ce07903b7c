"""One log owned by this log server: the driver of its owner core
(``appliance.protocol.log_owner.LogOwner``: state, duplicate filter, group
commit, control entries, hand-over, answers) over its tagged log writer.

Threads and what each owns:

* the server's loop thread owns ``OwnedLog`` whole: its core (every event
  is fed there, ``step``), ``writer`` (the reference; the loop sends every
  entry: ``LogWriter.add_entry`` / ``add_control``), the tokens of
  requests waiting for an answer, and the counters (the core's ``stats``).
* the server's pool (``LOG_SERVICE_OPENS_MAX`` threads) opens the log
  (``LogWriter(tagged=True)`` takes it over, which fences and recovers the
  previous owner's segment, then ``learn_tail`` reads the tags of the
  records written during the last ``LOG_SERVICE_REBUILD_MS``), closes the
  writer and releases the lease.  It touches nothing of ``OwnedLog`` but its
  immutable fields (``name``, ``client``, ``owner``, ``host``): it hands
  the outcome to the loop thread (``post``) as the core's event
  (``Opened`` with the tags learnt, ``OpenFailed``, ``WriterClosed``,
  ``LeaseReleased``).
* the ledger client's threads complete the writer's futures; their
  callbacks only ``post`` the outcome (``EntryAcked`` with the positions,
  ``EntryFailed``) to the loop thread.

The writer (``appliance.logs.writer``) has its own lock for what the read
cache's thread asks of it (``listen``, ``acknowledged_now``).
"""

from __future__ import annotations

import logging
import time

from appliance.client.add_future import outcome
from appliance.logs.writer import LogWriter
from appliance.protocol import limits
from appliance.protocol.log_entry import HEADER_BYTES, unpack_tags
from appliance.protocol.log_owner import Answer, LogOwner, OwnerConfig, OwnerState
from appliance.protocol.log_owner_events import (
    CloseWriter,
    EntryAcked,
    EntryFailed,
    LeaseReleased,
    Opened,
    OpenFailed,
    ReleaseLease,
    Reply,
    SendControl,
    SendEntry,
    WriterClosed,
)
from appliance.protocol.logs import COMPLETED

log = logging.getLogger("appliance.logservice")


def now_ms() -> float:
    """The time the loop feeds its cores (monotonic, fractions of a ms)."""
    return time.monotonic() * 1000


def learn_tail(client, md, now_wall_ms: int, password: bytes) -> list[tuple]:
    """(producer id, seq, (segment seq, entry id, slot)) of every tagged
    record of the completed segments written during the last
    ``LOG_SERVICE_REBUILD_MS``, in log order (the pool's thread)."""
    done = [s for s in md.live_segments if s.state == COMPLETED]
    start = 0
    for i, seg in enumerate(done):
        if seg.ctime_ms <= now_wall_ms - limits.LOG_SERVICE_REBUILD_MS:
            start = i  # the segment being written when the window began
    learnt = []
    for seg in done[start:]:
        if seg.last_entry_id < 0:
            continue
        rh = client.open_ledger(seg.ledger_id, password, recovery=False)
        try:
            step = limits.LOG_READ_ENTRIES_MAX
            for first in range(0, seg.last_entry_id + 1, step):
                for entry in rh.read(first, min(first + step - 1, seg.last_entry_id)):
                    for slot, (pid, seq) in enumerate(unpack_tags(entry.payload) or ()):
                        learnt.append((pid, seq, (seg.seq, entry.entry_id, slot)))
        finally:
            rh.close()
    return learnt


def owner_config(client) -> OwnerConfig:
    """The owner core's limits from the client's config."""
    cfg = client.log_config
    ccfg = client.config
    return OwnerConfig(
        linger_ms=cfg.service_linger_us / 1000, gather_ms=cfg.service_gather_us / 1000,
        entries_inflight_max=cfg.service_entries_inflight,
        window_entries=ccfg.inflight_adds_max, window_bytes=ccfg.inflight_bytes_max,
        flush_bytes=cfg.flush_bytes, entry_room_bytes=client.payload_bytes_max - HEADER_BYTES,
        control_interval_ms=cfg.service_control_interval_ms)


class OwnedLog:
    """See the module docstring.  ``host`` is the server: ``post(fn)`` (any
    thread: run ``fn`` on the loop thread), ``queue_reply(identity, doc)``,
    ``schedule(owned, due_ms)``, ``changed(owned)`` (its state changed),
    ``pool``, ``registry``, ``observe(seconds)`` or None."""

    def __init__(self, host, client, name: str, owner: str, config: OwnerConfig):
        self.host = host
        self.client = client
        self.name = name
        self.owner = owner
        self.core = LogOwner(name, config)
        self.writer: LogWriter | None = None
        host.pool.submit(self._open)

    @property
    def state(self) -> OwnerState:
        return self.core.state

    # -- the loop thread -------------------------------------------------------------------
    def step(self, event) -> None:
        """Feed the core one event and carry out its actions."""
        before = self.core.state
        actions = self.core.handle(event)
        failed = []
        for action in actions:
            kind = type(action)
            if kind is Reply:
                self._reply(action)
            elif kind is SendEntry or kind is SendControl:
                error = self._send(action)
                if error is not None:
                    failed.append(EntryFailed(action.entry_no, error, now_ms()))
            elif kind is CloseWriter:
                self.host.pool.submit(self._close_writer, self.writer)
            elif kind is ReleaseLease:
                self.host.pool.submit(self._release)
        self.host.schedule(self, self.core.next_due_ms())
        if self.core.state is not before:
            self.host.changed(self)
        for event in failed:
            self.step(event)

    def _reply(self, reply: Reply) -> None:
        identity, head, t0 = reply.token
        answer = reply.answer
        if answer is Answer.WRITTEN:
            doc = {**head, "op": "written", "runs": reply.runs}
            if self.host.observe is not None:
                self.host.observe(time.perf_counter() - t0)
        elif answer is Answer.HELLO:
            doc = {**head, "op": "hello", "next_seq": reply.next_seq}
        else:
            doc = {**head, "op": "error", "code": answer.value, "message": reply.message}
            if answer in (Answer.GAP, Answer.FULL):
                doc["expected"] = reply.expected
        self.host.queue_reply(identity, doc)

    def _send(self, action) -> str | None:
        """Hand an entry to the writer; an error if it refused it at once."""
        entry_no, control = action.entry_no, type(action) is SendControl
        try:
            if not control:
                fut = self.writer.add_entry(action.payloads, action.tags)
            else:
                fut = self.writer.add_control()
        except Exception as exc:  # noqa: BLE001 - the writer is broken: the core drops the log
            return str(exc)
        post = self.host.post
        fut.add_done_callback(lambda f: post(lambda: self._entry_done(entry_no, f, control)))
        return None

    def _entry_done(self, entry_no: int, fut, control: bool) -> None:
        result, error = outcome(fut)
        if error is not None:
            log.warning("log %s: dropped after a failed write: %s", self.name, error)
            self.step(EntryFailed(entry_no, str(error), now_ms()))
        else:
            self.step(EntryAcked(entry_no, [] if control else result, now_ms()))

    # -- the pool's threads: they only post the outcome --------------------------------------
    def _open(self) -> None:
        try:
            writer = LogWriter(self.client, self.client.logs, self.name, b"",
                               self.client.log_config, self.owner, tagged=True, driven=True)
            md, _ = self.client.logs.read_log(self.name)
            learnt = learn_tail(self.client, md, self.client.logs.clock_ms(), b"")
        except Exception as exc:  # noqa: BLE001 - the log is dropped and retried by producers
            log.warning("log %s: could not take it over: %s", self.name, exc)
            reason = str(exc)
            self.host.post(lambda: self.step(OpenFailed(now_ms(), reason)))
            return
        log.info("log %s: owned (epoch %d); %d records learnt for %d producers", self.name,
                 writer.epoch, len(learnt), len({pid for pid, _seq, _at in learnt}))
        self.host.post(lambda: self._opened(writer, learnt))

    def _opened(self, writer: LogWriter, learnt: list) -> None:
        self.writer = writer
        self.step(Opened(now_ms(), tuple(learnt), writer.epoch))

    def _close_writer(self, writer: LogWriter | None) -> None:
        """Flush and close the writer (completing its segment)."""
        if writer is not None:
            try:
                writer.close()
            except Exception as exc:  # noqa: BLE001 - fenced or broken: the next owner recovers
                log.info("log %s: closed with %s", self.name, exc)
        self.host.post(lambda: self.step(WriterClosed(now_ms())))

    def _release(self) -> None:
        try:
            self.host.registry.release(self.name)
        except Exception as exc:  # noqa: BLE001 - the lease ends with the session anyway
            log.warning("log %s: could not release its lease: %s", self.name, exc)
        self.host.post(lambda: self.step(LeaseReleased(now_ms())))
