"""The owner of one log on a log server, as a pure core (issue 46): events in,
actions out (``appliance.protocol.log_owner_events``).

What it holds, each part owning its state:

* its state (``OwnerState``): OPENING until the driver took the log over
  (fenced the previous owner, recovered its segment) and fed back the tags
  read from the log's tail (``Opened``: the duplicate filter is rebuilt
  from them, so it survives the previous owner's ``kill -9``); OPEN while
  it takes writes; CLOSING while it hands the log over (what it holds is
  sent, every entry acknowledged, then the writer closed and the lease
  released); FAILED once an entry failed (it may or may not be in the log,
  so the filter can no longer tell: the log is dropped whole, its waiting
  requests answered RETRY, and whoever owns it next rebuilds the filter
  from the log itself); CLOSED once the lease is released.
* the duplicate filter (``DedupTable``, injected: the simulation passes a
  broken one to see its checker catch it): each record of a request is
  judged new, duplicate (answered with the kept position, or once the
  first copy is stored), old (stored, position forgotten), or the request
  is refused (GAP: resend from ``expected``; FULL: too many producers).
* the group commit (``GroupCommit``, ``log_owner_commit``): records of
  every producer share entries; the gather rule, the linger, the entries
  in flight and the ledger's window, counted from this core's own events.
  A write's records are held until the next ``Tick`` (``next_due_ms`` is
  then now): the driver ticks after the requests of one turn of its loop,
  so they share an entry even when none is in flight.
* control entries: once the log was idle ``control_interval_ms`` after an
  acknowledged entry with records (0: none), so readers of the bookies
  learn its last records (readers through the log service ask the owner
  how far its writer is acknowledged and never wait for one:
  ``appliance.logservice.readcache``, read your writes).

Rules it checks in place (``invariant``): a request is answered once, and
WRITTEN only when every one of its records has a position; no entry is
sent unless OPEN or CLOSING; acknowledgements come in the order entries
were sent; no (producer, seq) is sent twice while this owner has entries
held or in flight (``stored-once``, the simulation's name for the rule).

Pure (stdlib, no clocks, threads or I/O): ``now_ms`` comes with every
event.  One thread drives it (the log server's loop thread; the
simulation's single thread); every field is that thread's.
"""

from __future__ import annotations

import math

from appliance.protocol.invariant import invariant
from appliance.protocol.log_owner_commit import (
    Batch,
    GroupCommit,
    OwnerConfig,
    Pending,
    slice_runs,
)
from appliance.protocol.log_owner_events import (
    Answer,
    Close,
    CloseWriter,
    EntryAcked,
    EntryFailed,
    Hello,
    LeaseReleased,
    Opened,
    OpenFailed,
    OwnerState,
    ReleaseLease,
    Reply,
    SendControl,
    SendEntry,
    Tick,
    Write,
    WriterClosed,
)
from appliance.protocol.log_service import (
    DUPLICATE,
    FULL,
    GAP,
    NEW,
    DedupTable,
    dlsn_runs,
)

__all__ = ["Answer", "LogOwner", "OwnerConfig", "OwnerState"]


class _Request:
    """A write request waiting for positions: ``answers`` per record (a
    position, None: stored and forgotten, or ``Pending``) and ``open``, the
    batches of its ``Pending`` records not acknowledged yet."""

    __slots__ = ("token", "producer_id", "answers", "open", "answered")

    def __init__(self, token, producer_id: bytes):
        self.token, self.producer_id = token, producer_id
        self.answers: list = []
        self.open = 0  # batches it waits for
        self.answered = False


class LogOwner:
    """See the module docstring.  ``handle(event)`` returns the actions;
    ``next_due_ms()`` when to send ``Tick`` next (``math.inf``: no timer)."""

    def __init__(self, name: str, config: OwnerConfig | None = None,
                 table: DedupTable | None = None):
        self.name = name
        self.config = config or OwnerConfig()
        c = self.config
        self.table = table if table is not None else DedupTable(
            c.producers_max, c.recent_max, c.producer_idle_ms)
        self.commit = GroupCommit(c)
        self.state = OwnerState.OPENING
        self.epoch = 0
        self.stats = {"requests": 0, "records": 0, "duplicates": 0, "busy": 0, "entries": 0,
                      "control_entries": 0, "takeovers": 0, "failed": 0}
        self._control_due_ms: float | None = None
        self._send_due_ms = math.inf
        self._close_wanted = False
        self._writer_closing = False
        self._sent_high: dict[bytes, int] = {}  # since the log was last idle
        self._out: list = []

    # -- driving ------------------------------------------------------------------------------
    def handle(self, event) -> list:
        _HANDLERS[type(event)](self, event)
        out, self._out = self._out, []
        return out

    def next_due_ms(self) -> float:
        due = self._send_due_ms if self.commit.waiting else math.inf
        if self._control_due_ms is not None:
            due = min(due, self._control_due_ms)
        return due

    # -- open ----------------------------------------------------------------------------------
    def _on_opened(self, e: Opened) -> None:
        invariant(self.state is OwnerState.OPENING, "log %s opened twice", self.name)
        for producer_id, seq, position in e.learnt:
            self.table.learn(producer_id, seq, tuple(position), e.now_ms)
        self.state, self.epoch = OwnerState.OPEN, e.epoch
        self.stats["takeovers"] += 1
        if self._close_wanted:
            self._on_close(Close(e.now_ms))

    def _on_open_failed(self, e: OpenFailed) -> None:
        invariant(self.state is OwnerState.OPENING, "log %s: open failed when not opening",
                  self.name)
        self.state = OwnerState.FAILED
        self._out.append(ReleaseLease())  # no writer to close

    # -- requests ------------------------------------------------------------------------------
    def _on_hello(self, e: Hello) -> None:
        if self.state is not OwnerState.OPEN:
            self._refuse(e.token, Answer.RETRY, f"log {self.name} is {self.state.value}")
            return
        self._out.append(Reply(e.token, Answer.HELLO, next_seq=self.table.next_seq(
            e.producer_id)))

    def _on_write(self, e: Write) -> None:
        self.stats["requests"] += 1
        if self.state is not OwnerState.OPEN:
            self._refuse(e.token, Answer.RETRY, f"log {self.name} is {self.state.value}")
            return
        self.commit.gate.arrived(e.producer_id)
        sizes = [len(p) for p in e.payloads]
        if max(sizes) > self.config.record_bytes_max:
            self._refuse(e.token, Answer.BAD, f"log {self.name}: a record of {max(sizes)} "
                         f"bytes (at most {self.config.record_bytes_max})")
            return
        if not self.commit.has_room(sizes):
            self.stats["busy"] += 1
            self._refuse(e.token, Answer.RETRY, f"log {self.name}: its ledger has as many "
                         "adds in flight as it may take ([client] inflight_adds_max, "
                         "inflight_bytes_max); retry")
            return
        request = _Request(e.token, e.producer_id)
        if self.table.admit_run(e.producer_id, e.seq, len(e.payloads), e.now_ms):
            request.answers = self._store_new(e.producer_id, e.seq, e.payloads, e.now_ms)
            self.table.store_many(e.producer_id, e.seq, request.answers)
        elif not self._judge(e, request):
            return
        self._wait_or_reply(request, e.now_ms)
        # held until the next Tick, due now: a driver that serves many requests
        # in one turn ticks once after them, so the records of a turn share an
        # entry even when none is in flight
        self._send_due_ms = min(self._send_due_ms, e.now_ms)

    def _judge(self, e: Write, request: _Request) -> bool:
        """The records one by one (``DedupTable.admit``); False if the request
        was refused as a whole (a gap or no room at its first record)."""
        answers = request.answers
        for i, payload in enumerate(e.payloads):
            seq = e.seq + i
            verdict = self.table.admit(e.producer_id, seq, e.now_ms, e.oldest)
            if verdict.kind == NEW:
                (pending,) = self._store_new(e.producer_id, seq, (payload,), e.now_ms)
                self.table.store(e.producer_id, seq, pending)
                answers.append(pending)
            elif verdict.kind == DUPLICATE:
                self.stats["duplicates"] += 1
                position = verdict.position
                if type(position) is Pending:  # stored by now: its position, else wait
                    position = position.position() or position
                answers.append(position)
            elif verdict.kind in (GAP, FULL) and i == 0:
                self._refuse(e.token, Answer(verdict.kind), _refusal(self, verdict),
                             expected=verdict.expected)
                return False
            elif verdict.kind in (GAP, FULL):
                break  # answer the records before it; the producer resends the rest
            else:  # OLD: stored long ago, its position forgotten
                answers.append(None)
        return True

    def _store_new(self, producer_id: bytes, seq: int, payloads, now_ms: float) -> list:
        """New records ``seq, seq + 1, ...`` of a producer into the group
        commit; their places (``Pending``)."""
        invariant(seq > self._sent_high.get(producer_id, 0),
                  "log %s: seq %d of producer %s sent again while its "
                  "first copy is held or in flight", self.name, seq, producer_id.hex(),
                  rule="stored-once")
        self._sent_high[producer_id] = seq + len(payloads) - 1
        self.stats["records"] += len(payloads)
        return self.commit.add_run(producer_id, seq, payloads, now_ms)

    def _wait_or_reply(self, request: _Request, now_ms: float) -> None:
        waited = []
        for answer in request.answers:
            if type(answer) is Pending and (not waited or waited[-1] is not answer.batch):
                waited.append(answer.batch)
        for batch in dict.fromkeys(waited):
            if batch.runs is None:
                request.open += 1
                batch.waiters.append(request)
        if not request.open:
            self._reply_written(request, now_ms)

    def _reply_written(self, request: _Request, now_ms: float) -> None:
        invariant(not request.answered, "log %s: a request answered twice", self.name)
        invariant(request.open == 0, "log %s: a request answered before its records had "
                  "positions", self.name)
        request.answered = True
        # answered first: a producer answered is awaited by the gather rule
        self.commit.gate.answered(request.producer_id, now_ms / 1000)
        self._out.append(Reply(request.token, Answer.WRITTEN, runs=_runs(request.answers)))

    def _refuse(self, token, answer: Answer, message: str, expected: int = 0) -> None:
        self._out.append(Reply(token, answer, expected=expected, message=message))

    # -- entries -------------------------------------------------------------------------------
    def _pump(self, now_ms: float) -> None:
        """Send what is due (``GroupCommit.due_to_send``) and the control
        entry once it is due."""
        if self.state not in (OwnerState.OPEN, OwnerState.CLOSING):
            return
        due = self._control_due_ms
        if due is not None and now_ms >= due and self.commit.idle() and \
                self.state is OwnerState.OPEN:
            self._control_due_ms = None
            self.commit.add_control(now_ms)
        while True:
            batch, wait = self.commit.due_to_send(now_ms, self.state is OwnerState.CLOSING)
            if batch is None:
                self._send_due_ms = wait
                return
            entry_no = self.commit.send(batch)
            self._control_due_ms = None
            if batch.control:
                self.stats["control_entries"] += 1
                self._out.append(SendControl(entry_no))
            else:
                self.stats["entries"] += 1
                self._out.append(SendEntry(entry_no, batch.payloads, batch.tags))

    def _on_acked(self, e: EntryAcked) -> None:
        inflight = self.commit.inflight
        if self.state is OwnerState.FAILED or self.state is OwnerState.CLOSED:
            return  # dropped: its requests were answered RETRY
        invariant(inflight and inflight[0].entry_no == e.entry_no,
                  "log %s: entry %d acknowledged out of order", self.name, e.entry_no)
        batch = self.commit.acked()
        if not batch.control:
            self._settle(batch, [list(run) for run in e.runs], e.now_ms)
        if self.commit.idle():
            self._sent_high.clear()
            if not batch.control and self.config.control_interval_ms and \
                    self.state is OwnerState.OPEN:
                self._control_due_ms = e.now_ms + self.config.control_interval_ms
        self._pump(e.now_ms)
        self._close_if_drained()

    def _settle(self, batch: Batch, runs: list, now_ms: float) -> None:
        invariant(sum(r[3] for r in runs) == len(batch.tags), "log %s: entry %d "
                  "acknowledged with positions for %d records of %d", self.name,
                  batch.entry_no, sum(r[3] for r in runs), len(batch.tags))
        batch.runs = runs  # the filter's and the requests' Pending resolve to them
        batch.payloads = batch.tags = None  # sent and stored: only the positions stay
        for request in batch.waiters:
            request.open -= 1
            if not request.open and not request.answered:
                self._reply_written(request, now_ms)
        batch.waiters = []  # all answered: the filter keeps the batch, not its requests

    def _on_failed(self, e: EntryFailed) -> None:
        if self.state in (OwnerState.OPEN, OwnerState.CLOSING):
            self._drop(f"log {self.name}: an entry failed ({e.reason}); retry")

    def _drop(self, message: str) -> None:
        """The filter cannot tell what is stored any more: answer every waiting
        request RETRY and close the writer (then the lease goes)."""
        self.state = OwnerState.FAILED
        self.stats["failed"] += 1
        self._control_due_ms = None
        for batch in self.commit.drain():
            for request in batch.waiters:
                if not request.answered:
                    request.answered = True
                    self._refuse(request.token, Answer.RETRY, message)
        self._close_writer()

    # -- close -------------------------------------------------------------------------------
    def _on_close(self, e: Close) -> None:
        if self.state is OwnerState.OPENING:
            self._close_wanted = True  # once the open is done
            return
        if self.state is not OwnerState.OPEN:
            return  # closing, failed or closed already
        self.state = OwnerState.CLOSING
        self._control_due_ms = None
        self._pump(e.now_ms)
        self._close_if_drained()

    def _close_if_drained(self) -> None:
        if self.state is OwnerState.CLOSING and self.commit.idle():
            self._close_writer()

    def _close_writer(self) -> None:
        if not self._writer_closing:
            self._writer_closing = True
            self._out.append(CloseWriter())

    def _on_writer_closed(self, e: WriterClosed) -> None:
        invariant(self._writer_closing, "log %s: a writer closed unasked", self.name)
        self._out.append(ReleaseLease())

    def _on_lease_released(self, e: LeaseReleased) -> None:
        self.state = OwnerState.CLOSED

    def _on_tick(self, e: Tick) -> None:
        self._pump(e.now_ms)


def _runs(answers: list) -> list[list]:
    """A request's answers (positions, None, or Pending of acknowledged
    batches) as runs ``[seg, entry, first slot, n]`` (``dlsn_runs``'), a
    run of one batch's records sliced from its runs in one step."""
    runs: list[list] = []
    i, n = 0, len(answers)
    while i < n:
        answer = answers[i]
        if type(answer) is not Pending:
            j = i + 1
            while j < n and type(answers[j]) is not Pending:
                j += 1
            parts = dlsn_runs(answers[i:j])
        else:
            batch, start, j = answer.batch, answer.index, i + 1
            while j < n and type(answers[j]) is Pending and answers[j].batch is batch and \
                    answers[j].index == start + j - i:
                j += 1
            invariant(batch.runs is not None, "a reply before its entry was acknowledged")
            parts = slice_runs(batch.runs, start, j - i)
        for part in parts:  # joined to the previous run where they follow on
            last = runs[-1] if runs else None
            if last is not None and last[0] is not None and last[:2] == part[:2] and \
                    last[2] + last[3] == part[2]:
                last[3] += part[3]
            else:
                runs.append(part)
        i = j
    return runs


def _refusal(owner: LogOwner, verdict) -> str:
    if verdict.kind == GAP:
        return f"log {owner.name}: sequence gap, next expected {verdict.expected}"
    return (f"log {owner.name}: {owner.config.producers_max} producers wrote within "
            f"{owner.config.producer_idle_ms} ms; no room for another")


_HANDLERS = {
    Opened: LogOwner._on_opened,
    OpenFailed: LogOwner._on_open_failed,
    Hello: LogOwner._on_hello,
    Write: LogOwner._on_write,
    EntryAcked: LogOwner._on_acked,
    EntryFailed: LogOwner._on_failed,
    Tick: LogOwner._on_tick,
    Close: LogOwner._on_close,
    WriterClosed: LogOwner._on_writer_closed,
    LeaseReleased: LogOwner._on_lease_released,
}
