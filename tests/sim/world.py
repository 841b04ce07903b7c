"""The simulated world: one seeded RNG, a simulated clock, an event queue and
a network that drops, delays, duplicates, reorders and partitions.

Everything random comes from ``World.rng`` and everything happens in the one
event loop, so a seed replays a run exactly.  The trace keeps the last
``trace_max`` lines for the failure report.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from collections.abc import Callable

from appliance.errors import error_class


class Violation(Exception):
    """An invariant failed.  ``name`` says which, ``detail`` how."""

    def __init__(self, name: str, detail: str):
        super().__init__(f"{name}: {detail}")
        self.name, self.detail = name, detail


class World:
    def __init__(self, seed: int, trace_max: int = 400):
        self.seed = seed
        self.rng = random.Random(seed)
        self.now_ms = 0
        self.steps = 0
        self._heap: list = []
        self._seq = 0
        self.nodes: dict[str, object] = {}
        self.trace: deque[tuple] = deque(maxlen=trace_max)  # formatted only on failure
        self.after_step: list[Callable[[], None]] = []
        self.net = Network(self)

    # -- events -------------------------------------------------------------------------------
    def schedule(self, delay_ms: int, fn: Callable, *args) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (self.now_ms + max(0, int(delay_ms)), self._seq, fn, args))

    def at(self, time_ms: int, fn: Callable, *args) -> None:
        self.schedule(max(0, time_ms - self.now_ms), fn, *args)

    def run(self, until_ms: int | None = None, steps_max: int = 2_000_000,
            until: Callable[[], bool] | None = None) -> None:
        """Run events in time order; every step ends with the invariant checks."""
        heap = self._heap
        while heap and self.steps < steps_max:
            if until_ms is not None and heap[0][0] > until_ms:
                self.now_ms = until_ms
                return
            time_ms, _, fn, args = heapq.heappop(heap)
            self.now_ms = time_ms
            self.steps += 1
            fn(*args)
            for check in self.after_step:
                check()
            if until is not None and until():
                return
        if until_ms is not None and not heap:
            self.now_ms = max(self.now_ms, until_ms)

    @property
    def idle(self) -> bool:
        return not self._heap

    def log(self, text: str) -> None:
        self.trace.append((self.now_ms, text))

    def log_msg(self, src: str, dst: str, msg) -> None:
        self.trace.append((self.now_ms, src, dst, msg))

    def trace_lines(self) -> list[str]:
        lines = []
        for item in self.trace:
            text = item[1] if len(item) == 2 else f"{item[1]}->{item[2]} {describe(item[3])}"
            lines.append(f"{item[0]:>7}ms {text}")
        return lines


class Network:
    """Message delivery between named nodes.

    ``drop_p``/``dup_p``: chance to lose / duplicate a message; delays are
    uniform in ``[delay_min_ms, delay_max_ms]`` (so messages reorder).
    ``cut(a, b)`` partitions two nodes until ``heal``.  ``rules`` see every
    message first: ``rule(src, dst, msg)`` returns ``"drop"``, ``"hold"``
    (park until ``release``), ``"taken"`` (the rule scheduled it itself), or
    ``None``."""

    def __init__(self, world: World):
        self.world = world
        self.drop_p = 0.0
        self.dup_p = 0.0
        self.slow_p = 0.0  # share of messages that take slow_ms instead
        self.slow_ms = (20, 100)
        self.delay_min_ms = 1
        self.delay_max_ms = 3
        self.cuts: set[frozenset] = set()
        self.link_loss: dict[frozenset, float] = {}  # flaky links: pair -> loss chance
        self.rules: list[Callable] = []
        self.held: list[tuple[str, str, object]] = []
        self.sent = self.dropped = 0

    def send(self, src: str, dst: str, msg) -> None:
        self.sent += 1
        for rule in self.rules:
            verdict = rule(src, dst, msg)
            if verdict == "drop":
                self._drop(src, dst, msg, "rule")
                return
            if verdict == "hold":
                self.held.append((src, dst, msg))
                self.world.log(f"hold {src}->{dst} {describe(msg)}")
                return
            if verdict == "taken":
                return
        rng = self.world.rng
        loss = self.link_loss.get(frozenset((src, dst)), 0.0) if self.link_loss else 0.0
        if (self.drop_p or loss) and rng.random() < max(self.drop_p, loss):
            self._drop(src, dst, msg, "lost")
            return
        self._schedule(src, dst, msg)
        if self.dup_p and rng.random() < self.dup_p:
            self._schedule(src, dst, msg)

    def _schedule(self, src: str, dst: str, msg) -> None:
        rng = self.world.rng
        if self.slow_p and rng.random() < self.slow_p:
            delay_ms = rng.randint(*self.slow_ms)
        else:
            delay_ms = rng.randint(self.delay_min_ms, self.delay_max_ms)
        self.world.schedule(delay_ms, self._deliver, src, dst, msg)

    def _deliver(self, src: str, dst: str, msg) -> None:
        if frozenset((src, dst)) in self.cuts:
            self._drop(src, dst, msg, "partition")
            return
        node = self.world.nodes.get(dst)
        if node is not None:
            self.world.log_msg(src, dst, msg)
            node.receive(src, msg)

    def _drop(self, src: str, dst: str, msg, why: str) -> None:
        self.dropped += 1
        self.world.log(f"drop({why}) {src}->{dst} {describe(msg)}")

    def release(self, predicate: Callable = lambda src, dst, msg: True) -> int:
        """Deliver held messages matching ``predicate`` (with normal delays)."""
        keep, released = [], 0
        for src, dst, msg in self.held:
            if predicate(src, dst, msg):
                self._schedule(src, dst, msg)
                released += 1
            else:
                keep.append((src, dst, msg))
        self.held = keep
        return released

    def cut(self, a: str, b: str) -> None:
        self.cuts.add(frozenset((a, b)))
        self.world.log(f"partition {a} | {b}")

    def heal(self, a: str | None = None, b: str | None = None) -> None:
        if a is None:
            self.cuts.clear()
            self.link_loss.clear()
        else:
            self.cuts.discard(frozenset((a, b)))
        self.world.log(f"heal {a or 'all'}{'|' + b if b else ''}")


def describe(msg) -> str:
    """A short readable form of a message for the trace."""
    name = type(msg).__name__
    fields = []
    for attr in ("request_id", "entry_id", "entry_ids", "codes", "first_entry_id", "last_entry_id",
                 "fence", "recovery", "code", "lac", "last_add_confirmed", "version"):
        if hasattr(msg, attr):
            value = getattr(msg, attr)
            if attr == "entry_ids":
                value = f"{value[0]}..{value[-1]}" if len(value) > 1 else value[0]
            if attr == "codes":
                value = "OK" if not any(value) else value
            if attr in ("fence", "recovery") and not value:
                continue
            if attr == "code":
                value = "OK" if value == 0 else error_class(value).__name__.replace("Error", "")
            fields.append(f"{attr.replace('_id', '').replace('request', 'rq')}={value}")
    return f"{name}({', '.join(fields)})"
