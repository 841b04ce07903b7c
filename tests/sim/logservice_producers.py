"""The producer processes of the log service's simulation
(``tests/sim/logservicesim``): the real producer core
(``appliance.protocol.log_producer.ProducerCore``) for every producer,
driven as the product's producer loop drives it
(``appliance.logs.producer_loop`` with ``appliance.logs.producer_io``):

* an application per producer writes its records 1..``records`` through
  ``core.write``, at most ``window`` unsettled at a time (it waits on its
  writes' futures), then closes the producer (``core.close``);
* every core is ticked each ``POLL_MS`` (its request timeout and its
  deadline), pumped after writes and at the ``WakeAt`` it asked for;
* ``FindOwner`` is answered at once (``OwnerFound``) by the simulated
  metadata: the lease holder, else the hashing over live servers
  (``appliance.logs.producer.Producer._find_owner``);
* ``Send`` actions go to one channel per (process, log server endpoint):
  what a process's cores queue for one endpoint in one turn leaves as one
  message, a single request alone only for the channel's ``plain``
  producer (the first that sent alone), else a multi-log message; a
  channel no producer writes through any more is closed, and a reply that
  reaches a closed channel is lost with it;
* ``ServerGone``: the server watch of each channel (the process's, at the
  moment the server crashed, or its session expired during a pause) tells
  the process at once, late, or never (the seed's ``gone``); every core
  writing there is told and the channel closed;
* ``Settle`` / ``Fail`` are recorded for the checker (DLSN per write).

Fault switch (``--break-oldest``): ``WrongOldestCore`` sends each write
request with ``oldest`` = its first number, not the producer's oldest
unacknowledged write (an owner that does not know the producer then
starts it there).  Single-threaded: everything here belongs to the
simulation's one thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from appliance.logs.producer_loop import POLL_MS
from appliance.protocol import limits
from appliance.protocol import log_producer as lp
from appliance.protocol.invariant import InvariantViolation
from appliance.protocol.log_service import (
    MUX_REPLY_KIND,
    decode_mux_reply,
    encode_mux,
    mux_groups,
)

_OLDEST = slice(13, 21)  # a WRITE frame's oldest (after kind, gen, seq: "!BIQQ...")
_SEQ = slice(5, 13)


class WrongOldestCore(lp.ProducerCore):
    """The ``--break-oldest`` fault, injected here (never in the product):
    every write request names its own first number as the oldest
    unacknowledged write."""

    def take_actions(self) -> list:
        actions = super().take_actions()
        for action in actions:
            if type(action) is lp.Send and action.frame[:1] == b"\x01":
                frame = bytearray(action.frame)
                if frame[_OLDEST] != frame[_SEQ]:
                    self.stats["oldest_rewritten"] = self.stats.get("oldest_rewritten", 0) + 1
                frame[_OLDEST] = frame[_SEQ]
                action.frame = bytes(frame)
        return actions


@dataclass(eq=False)
class SimProducer:
    """One producer: its real core, and what its application saw."""
    core: lp.ProducerCore
    pid: bytes
    name: str
    log: str
    written: int = 0  # writes handed to the core (numbered 1, 2, ... as they enter)
    settled: dict = field(default_factory=dict)  # seq -> DLSN (None: forgotten)
    failed: dict = field(default_factory=dict)  # seq -> the error
    let_go: bool = False

    def unsettled(self) -> int:
        return self.written - len(self.settled) - len(self.failed)


@dataclass(eq=False)
class SimChannel:
    """One process's connection to one log server endpoint."""
    endpoint: str
    members: set = field(default_factory=set)
    plain: SimProducer | None = None
    outbox: list = field(default_factory=list)  # (producer, frame), this turn's
    open: bool = True


class ProducerProcess:
    """One producer process: its producers and channels (see the module
    docstring); ``world`` gives the clock, the network and the metadata."""

    def __init__(self, world, k: int, producers: list[SimProducer]):
        self.world, self.k = world, k
        self.producers = producers
        self.routes = {(p.log.encode(), p.pid): p for p in producers}
        self.channels: dict[str, SimChannel] = {}
        self.joined: dict[SimProducer, SimChannel] = {}
        self.dirty: list[SimChannel] = []

    # -- the application ---------------------------------------------------------------
    def start(self) -> None:
        for p in self.producers:
            self.world.at(0, self.app_write, p)
        self.world.at(POLL_MS, self.tick)

    def app_write(self, p: SimProducer) -> None:
        """Writes enter while fewer than ``window`` are unsettled; the
        producer is closed after its last."""
        if p.let_go or p.core.error is not None:
            return
        records, window, now = self.world.cfg.records, self.world.cfg.window, self.world.now
        while p.written < records and p.unsettled() < window:
            p.written += 1
            p.core.write(b"%d" % p.written, p.written, None, now)
        if p.written >= records:
            p.core.close()
        self.carry_out(p, p.core.pump(now))

    def finished(self) -> bool:
        return all(p.let_go or p.core.error is not None for p in self.producers)

    # -- the loop ----------------------------------------------------------------------
    def tick(self) -> None:
        if self.finished():
            return
        for p in self.producers:
            if not p.let_go:
                self.step(p, lp.Tick(self.world.now))
        self.world.at(POLL_MS, self.tick)

    def wake(self, p: SimProducer) -> None:
        if not p.let_go:
            self.carry_out(p, p.core.pump(self.world.now))

    def step(self, p: SimProducer, event) -> None:
        try:
            actions = p.core.handle(event)
        except InvariantViolation as exc:
            self.world.broken(exc)
            return
        self.carry_out(p, actions)

    def carry_out(self, p: SimProducer, actions: list) -> None:
        world = self.world
        for action in actions:
            kind = type(action)
            if kind is lp.Send:
                self.channel(p, action.endpoint).outbox.append((p, action.frame))
            elif kind is lp.Settle:
                self._settled(p, action.done)
            elif kind is lp.Fail:
                for _, seq in action.done:
                    p.failed[seq] = action.error
            elif kind is lp.WakeAt:
                world.at(action.at_ms - world.now, self.wake, p)
            elif kind is lp.FindOwner:
                self.carry_out(p, p.core.handle(lp.OwnerFound(world.find_owner(p.log),
                                                              world.now)))
        if p.core.done() and not p.let_go:
            self.let_go(p)

    def _settled(self, p: SimProducer, done: list) -> None:
        for dlsn, seq in done:
            if seq in p.settled or seq in p.failed:
                self.world.broken_rule("settled-once", f"{p.name} write {seq} settled twice")
            p.settled[seq] = dlsn
            self.world.acknowledged(p, seq, dlsn)
        self.world.at(0, self.app_write, p)  # its application writes on

    def let_go(self, p: SimProducer) -> None:
        p.let_go = True
        channel = self.joined.pop(p, None)
        if channel is not None:
            self._leave(p, channel)

    # -- channels (appliance.logs.producer_io.Channel) ---------------------------------
    def channel(self, p: SimProducer, endpoint: str) -> SimChannel:
        channel = self.channels.get(endpoint)
        if channel is None:
            channel = self.channels[endpoint] = SimChannel(endpoint)
        old = self.joined.get(p)
        if old is not channel:
            if old is not None:
                self._leave(p, old)
            channel.members.add(p)
            self.joined[p] = channel
        if not channel.outbox:
            self._dirty(channel)
        return channel

    def _leave(self, p: SimProducer, channel: SimChannel) -> None:
        channel.members.discard(p)
        if not channel.members:
            self._dirty(channel)  # closed once its last requests left

    def _dirty(self, channel: SimChannel) -> None:
        if not self.dirty:
            self.world.at(0, self.flush)  # the end of this turn
        self.dirty.append(channel)

    def flush(self) -> None:
        """This turn's requests: one message per channel (more past the
        bounds); then the channels nobody uses are closed."""
        dirty, self.dirty = self.dirty, []
        for channel in dirty:
            if channel.outbox and not channel.open:  # closed this turn (server gone)
                self.world.stats["queued_on_closed"] += 1
                channel.outbox = []
            if channel.outbox:
                self._send(channel)
            if not channel.members and channel.open and \
                    self.channels.get(channel.endpoint) is channel:
                self._close(channel)

    def _send(self, channel: SimChannel) -> None:
        out, channel.outbox = channel.outbox, []
        world = self.world
        if len(out) == 1 and channel.plain in (None, out[0][0]):
            channel.plain = out[0][0]
            world.send(world.server_receive, channel.endpoint, self, channel, out[0][1])
            return
        for group in mux_groups([frame for _, frame in out],
                                limits.LOG_SERVICE_MUX_SECTIONS_MAX,
                                limits.LOG_SERVICE_MUX_BYTES_MAX // 2):
            world.stats["mux_messages"] += 1
            world.stats["mux_sections"] += len(group)
            world.send(world.server_receive, channel.endpoint, self, channel, encode_mux(group))

    def _close(self, channel: SimChannel) -> None:
        channel.open = False
        del self.channels[channel.endpoint]

    def receive(self, channel: SimChannel, frame: bytes) -> None:
        """A reply message reached ``channel`` (lost if it was closed)."""
        if not channel.open:
            self.world.stats["replies_to_closed"] += 1
            return
        if frame[:1] != bytes([MUX_REPLY_KIND]):
            routed = [(channel.plain, frame)]
        else:
            answers = decode_mux_reply(frame, limits.LOG_SERVICE_MUX_SECTIONS_MAX,
                                       limits.LOG_SERVICE_MUX_BYTES_MAX)
            routed = [(self.routes.get((name, pid)), reply) for name, pid, reply in answers]
        for p, reply in routed:
            if p is not None and not p.let_go:
                self.step(p, lp.Reply(reply, self.world.now))

    def server_gone(self, endpoint: str, channel: SimChannel) -> None:
        """The server watch of ``channel``: its server's registration went."""
        if self.channels.get(endpoint) is not channel:
            return  # that channel was closed meanwhile (its watch with it)
        self.world.stats["servers_gone"] += 1
        for p in list(channel.members):
            self.joined.pop(p, None)
        channel.members.clear()
        self._close(channel)  # first: what the cores resend takes a new channel
        for p in self.producers:
            if not p.let_go and p.core.endpoint == endpoint:
                self.step(p, lp.ServerGone(endpoint, self.world.now))
