"""Readable scenario traces: data-driven files that tell a scenario step by
step and hold, under every step, what the real protocol cores did.

In the spirit of etcd-io/raft's ``testdata/`` (its ``datadriven`` format).
A trace file is a list of blocks separated by blank lines::

    # a comment: what the reader should notice
    add 3
    ----
    writer->bookie-1 SendAdd rq=1 entries=0-2
    bookie-1->writer AddResponse rq=1 entry=0 OK
    ...

The line before ``----`` is a command (``create``, ``add``, ``run``, ``drop``,
``crash``, ``recover``, ``read``... see ``Interpreter``); the lines after it
are what happened while it ran, one event per line.  ``tests/sim/test_traces.py``
runs every file against the scripted simulation (``tests/sim/script.py``:
the real ``LedgerWriter``, ``LedgerRecovery``, ``LedgerReader`` and
``BookieCore``, the invariant checker on) and compares.

What it guarantees: the output depends only on the file (one seed, no wall
clock, no addresses, no set or hash order), so a run is byte-for-byte
repeatable and ``UPDATE_TRACES=1`` rewrites the expected output in place,
keeping the comments and commands.  Observing changes nothing: the recorder
only wraps instance hooks (the world's log calls, the metadata store's apply
step, each client's result callback, the rules it installs) and draws
nothing from the RNG.  A violation the checker reports fails the run
unless an ``expect-violation NAME`` command names it.
"""

from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass, field

from appliance.errors import OK, error_class
from appliance.protocol import events as ev
from appliance.protocol.metadata import CLOSED
from tests.sim.script import Script, message

SEPARATOR = "----"


class TraceError(Exception):
    """A trace file is malformed, names an unknown command, or breaks an expectation."""


# -- the file format -------------------------------------------------------------------------
@dataclass
class Block:
    command: str
    line_no: int
    expected: list[str] = field(default_factory=list)


def parse(text: str) -> list[str | Block]:
    """Comments and blank lines stay ``str`` (kept as written); a command
    with its expected output becomes a ``Block``."""
    items: list[str | Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip() or line.startswith("#"):
            items.append(line)
            i += 1
            continue
        if i + 1 >= len(lines) or lines[i + 1] != SEPARATOR:
            raise TraceError(f"line {i + 1}: {line!r} must be followed by a {SEPARATOR!r} line")
        block = Block(line, i + 1)
        i += 2
        while i < len(lines) and lines[i].strip():
            block.expected.append(lines[i])
            i += 1
        items.append(block)
    return items


def render(items: list[str | Block], outputs: list[list[str]]) -> str:
    """The file again, with each block's output replaced by ``outputs`` in order."""
    out, blocks = [], iter(outputs)
    for item in items:
        if isinstance(item, str):
            out.append(item)
        else:
            out += [item.command, SEPARATOR, *next(blocks)]
    return "\n".join(out) + "\n"


# -- what happened, one line per event ---------------------------------------------------------
def fmt_metadata(md) -> str:
    end = f" last={md.last_entry_id}" if md.state == CLOSED else ""
    fragments = " ".join(f"[{first}: {' '.join(bookies)}]" for first, bookies in md.ensembles)
    return f"{md.state}{end} fragments {fragments}"


def fmt_ids(ids) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2,5``; empty -> ``none``."""
    runs: list[list[int]] = []
    for i in sorted(ids):
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs) or "none"


def code_name(code: int) -> str:
    return "OK" if code == OK else error_class(code).__name__.removesuffix("Error")


# fields a reader of the trace does not need (one ledger; keys, bytes, clocks)
_HIDDEN = frozenset(("bookie_id", "ledger_id", "master_key", "datas", "data", "now_ms",
                     "metadata", "read_id"))


def fmt_event(obj) -> str:
    """One protocol message or result as ``Kind field=value ...``, fields in
    declaration order: ``SendAdd rq=1 entries=0-2``, ``AddResponse rq=1
    entry=0 OK``, ``CompleteAdds entries=0-2 LAC=2``."""
    values = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    parts = []
    if "first_entry_id" in values:
        first = values.pop("first_entry_id")
        count = len(values.pop("payloads", ()))
        last = values.pop("last_entry_id", first + count - 1)
        parts.append(f"entries={fmt_ids(range(first, last + 1))}")
    for name, value in values.items():
        if name in _HIDDEN or value is None or value is False or value == "":
            continue
        if value is True:
            parts.append(name)
        elif name == "request_id":
            parts.append(f"rq={value}")
        elif name == "entry_ids":
            parts.append(f"entries={fmt_ids(value)}")
        elif name in ("code", "codes"):
            codes = value if name == "codes" else (value,)
            parts.append("OK" if not any(codes) else "/".join(map(code_name, codes)))
        else:
            parts.append(f"{name.removesuffix('_id')}={value}")
    if isinstance(obj, ev.CompleteAdds):
        parts.append(f"LAC={obj.last_entry_id}")
    return " ".join([type(obj).__name__, *parts])


class Recorder:
    """Collects the events of one scripted run as lines.  It hooks instance
    attributes only (nothing in the classes changes, nothing draws from the
    RNG): ``world.log`` (crashes, restarts), ``world.log_msg`` (each
    delivered message), the metadata store's ``_apply`` (each CAS, who made
    it, what it wrote), each client host's ``on_result`` (acknowledgements,
    failures, opens, closes, reads) and the hold/drop rules it installs."""

    def __init__(self, script: Script):
        self.lines: list[str] = []
        self.hosts: set[str] = set()
        world, meta = script.world, script.cluster.meta
        self.world = world
        log, log_msg, apply = world.log, world.log_msg, meta._apply

        def on_log(text: str) -> None:
            log(text)
            if not self._told_by_us(text):
                self.lines.append(text)

        def on_msg(src: str, dst: str, msg) -> None:
            log_msg(src, dst, msg)
            self.lines.append(f"{src}->{dst} {fmt_event(msg)}{self._fate(dst)}")

        def on_apply(host, action) -> None:
            before = meta.records[action.ledger_id][1]
            try:
                apply(host, action)
            finally:
                self.lines.append(self._meta_line(meta, host.name, action, before))

        world.log, world.log_msg, meta._apply = on_log, on_msg, on_apply

    def _told_by_us(self, text: str) -> bool:
        """The store's CAS lines, the checker's, the network's hold/drop lines
        and the hosts' result lines are written here in the trace's own form."""
        if text.startswith(("meta ", "VIOLATION", "hold ", "drop(rule) ")):
            return True
        return text.split(": ", 1)[0] in self.hosts

    def watch(self, host) -> None:
        """Record what ``host``'s cores report to their user."""
        self.hosts.add(host.name)
        on_result = host.on_result

        def record(core, action) -> None:
            self.lines.append(f"{host.name}: {fmt_event(action)}")
            on_result(core, action)
        host.on_result = record

    def rule(self, verdict: str, predicate):
        """``predicate``, logging each message it catches."""
        def match(src: str, dst: str, msg) -> bool:
            if not predicate(src, dst, msg):
                return False
            self.lines.append(f"{verdict} {src}->{dst} {fmt_event(msg)}")
            return True
        return match

    def _fate(self, dst: str) -> str:
        node = self.world.nodes.get(dst)
        if getattr(node, "up", True) is False:
            return "  (down: lost)"
        if getattr(node, "dead", False):
            return "  (dead: lost)"
        if self.world.now_ms < getattr(node, "paused_until", 0):
            return "  (stalled: handled when it wakes)"
        return ""

    @staticmethod
    def _meta_line(meta, who: str, action, before: int) -> str:
        md, version = meta.records[action.ledger_id]
        if not isinstance(action, ev.WriteMetadata):
            return f"{who} reads metadata v{version}: {fmt_metadata(md)}"
        if version == before:
            return (f"{who}->metadata CAS refused: expected v{action.expected_version}, "
                    f"store at v{version}")
        return f"{who}->metadata CAS v{before}->v{version}: {fmt_metadata(md)}"

    def take(self) -> list[str]:
        lines, self.lines = self.lines, []
        return lines


# -- the commands ---------------------------------------------------------------------------
def _split(command: str) -> tuple[str, list[str], dict[str, str]]:
    words = shlex.split(command)
    args = [w for w in words[1:] if "=" not in w]
    kwargs = dict(w.split("=", 1) for w in words[1:] if "=" in w)
    return words[0], args, kwargs


def _int(kwargs: dict, key: str, default: int | None = None) -> int | None:
    return int(kwargs[key]) if key in kwargs else default


def _predicate(args: list[str], kwargs: dict):
    """``SendAdd dst=bookie-1 entry=0 fence=true`` -> a message predicate;
    ``*`` (or no kind) matches every kind."""
    name = args[0] if args else "*"
    kind = object if name == "*" else getattr(ev, name, None)
    if not isinstance(kind, type):
        raise TraceError(f"no message kind {name!r} in appliance.protocol.events")
    fences = {"true": True, "false": False, None: None}
    if kwargs.get("fence") not in fences:
        raise TraceError(f"fence={kwargs['fence']}: say true or false")
    fence = fences[kwargs.get("fence")]
    return message(kind, src=kwargs.get("src"), dst=kwargs.get("dst"),
                   entry=_int(kwargs, "entry"), fence=fence)


class Interpreter:
    """Runs trace commands against a ``Script``; each returns its output lines.

    ``create E=3 Qw=3 Qa=2 [bookies=N] [timeout_ms=N] [journal=off]
    [positive_min=N] [disable=p1,p2]``: a new cluster and ledger 1 on
    bookie-1..E (the rest are spares).  ``add N``, ``close``,
    ``stall-writer MS``, ``kill-writer``: the writer.  ``run MS``: let
    simulated time pass; everything that happens is printed.
    ``drop|hold [Kind] [src=] [dst=] [entry=] [fence=]``: a network rule
    from now on; ``release [same]``: deliver held messages; ``clear-rules``.
    ``crash B [keep=N]``, ``restart B``, ``sync B``: a bookie.
    ``recover [name=] [attempts=] [password=] [window=]``: open with
    recovery (``window``: entries read ahead at once, 16 unless told).
    ``read [name=]``: open without recovery and read the closed ledger whole.
    ``metadata``, ``bookies``, ``writer``: print the state.
    ``expect-violation NAME``: the checker has reported NAME (and that is
    the point of the scenario)."""

    def __init__(self):
        self.script: Script | None = None
        self.recorder: Recorder | None = None
        self.violation_expected = False
        self.violation_reported = False
        self.problems: list[str] = []

    def execute(self, command: str) -> list[str]:
        name, args, kwargs = _split(command)
        method = getattr(self, "cmd_" + name.replace("-", "_"), None)
        if method is None:
            raise TraceError(f"unknown command {name!r}")
        if name != "create" and self.script is None:
            raise TraceError(f"{name!r} before any 'create'")
        lines = (method(args, kwargs) or []) + (self.recorder.take() if self.recorder else [])
        return lines + self._new_violation() or ["ok"]

    def _new_violation(self) -> list[str]:
        found = self.script.violation if self.script else None
        if found is None or self.violation_reported:
            return []
        self.violation_reported = True
        return [f"VIOLATION {found.name}: {found.detail}"]

    def finish(self) -> None:
        """At the end of a scenario (and before the next ``create``): note a
        violation the file did not expect in ``problems``."""
        if self.script is not None and self.script.violation is not None \
                and not self.violation_expected:
            v = self.script.violation
            self.problems.append(f"the checker reported {v.name}: {v.detail} (add "
                                 f"'expect-violation {v.name}' if that is the point)")

    # -- setting up ---------------------------------------------------------------------
    def cmd_create(self, args, kwargs) -> list[str]:
        self.finish()
        disabled = tuple(p for p in kwargs.get("disable", "").split(",") if p)
        e, qw, qa = _int(kwargs, "E"), _int(kwargs, "Qw"), _int(kwargs, "Qa")
        if None in (e, qw, qa):
            raise TraceError("create needs E=, Qw= and Qa=")
        journal = kwargs.get("journal", "on") == "on"
        self.script = Script(e, qw, qa, bookies=_int(kwargs, "bookies", 0), journal=journal,
                             disabled=disabled, positive_min=_int(kwargs, "positive_min"),
                             timeout_ms=_int(kwargs, "timeout_ms", 10_000))
        self.recorder = Recorder(self.script)
        self.recorder.watch(self.script.writer.host)
        self.violation_expected = self.violation_reported = False
        md = self.script.metadata()
        spares = sorted(set(self.script.cluster.bookies) - md.bookies(), key=_bookie_order)
        return [f"ledger 1: E={e} Qw={qw} Qa={qa} on {' '.join(md.last_fragment[1])}; "
                f"spares: {' '.join(spares) or 'none'}",
                f"journal {'on' if journal else 'off (BP-46 mode)'}; protections off: "
                f"{', '.join(disabled) or 'none'}"]

    # -- the writer ---------------------------------------------------------------------
    def cmd_add(self, args, kwargs) -> list[str]:
        ids = self.script.add(int(args[0]) if args else 1)
        return [f"writer adds entries {fmt_ids(ids)}"]

    def cmd_close(self, args, kwargs) -> list[str]:
        self.script.close()
        return []

    def cmd_stall_writer(self, args, kwargs) -> list[str]:
        self.script.stall_writer(int(args[0]))
        return [f"writer stalls for {args[0]} ms (its messages and timers wait)"]

    def cmd_kill_writer(self, args, kwargs) -> list[str]:
        self.script.kill_writer()
        return ["writer dies"]

    # -- time and the network -------------------------------------------------------------
    def cmd_run(self, args, kwargs) -> list[str]:
        self.script.run(int(args[0]) if args else 100)
        return []

    def cmd_drop(self, args, kwargs) -> list[str]:
        self.script.drop(self.recorder.rule("drop", _predicate(args, kwargs)))
        return []

    def cmd_hold(self, args, kwargs) -> list[str]:
        self.script.hold(self.recorder.rule("hold", _predicate(args, kwargs)))
        return []

    def cmd_release(self, args, kwargs) -> list[str]:
        count = self.script.release(_predicate(args, kwargs))
        return [f"released {count} held message{'s' if count != 1 else ''}"]

    def cmd_clear_rules(self, args, kwargs) -> list[str]:
        self.script.clear_rules()
        return []

    # -- bookies ------------------------------------------------------------------------
    def cmd_crash(self, args, kwargs) -> list[str]:
        self.script.crash(args[0], keep_ops=_int(kwargs, "keep", 0))
        return []

    def cmd_restart(self, args, kwargs) -> list[str]:
        self.script.restart(args[0])
        return []

    def cmd_sync(self, args, kwargs) -> list[str]:
        self.script.sync(args[0])
        return [f"{args[0]} flushes its storage"]

    # -- other clients ------------------------------------------------------------------
    def cmd_recover(self, args, kwargs) -> list[str]:
        password = kwargs.get("password")
        app = self.script.recover(kwargs.get("name", "recovery"), _int(kwargs, "attempts", 1),
                                  password.encode() if password is not None else None)
        if "window" in kwargs:  # entries read ahead at once (default 16)
            app.window_entries = int(kwargs["window"])
        self.recorder.watch(app.host)
        return []

    def cmd_read(self, args, kwargs) -> list[str]:
        name = kwargs.get("name", "reader")
        reader = self.script.read_all(name)
        self.recorder.watch(reader.host)
        self.script.run_until(lambda: reader.done, _int(kwargs, "ms", 1_000))
        lines = self.recorder.take()
        if not reader.done:
            return lines + [f"{name} not done"]
        if reader.failed_code != OK:
            return lines + [f"{name} failed: {code_name(reader.failed_code)}"]
        n = reader.next_entry
        if n == 0:
            return lines + [f"{name} read nothing: the ledger is empty"]
        return lines + [f"{name} read {n} entr{'y' if n == 1 else 'ies'} ({fmt_ids(range(n))}), "
                        f"each as the writer wrote it"]

    # -- state --------------------------------------------------------------------------
    def cmd_metadata(self, args, kwargs) -> list[str]:
        md, version = self.script.cluster.meta.get(self.script.cluster.ledger_id)
        return [f"v{version}: {fmt_metadata(md)}"]

    def cmd_writer(self, args, kwargs) -> list[str]:
        core = self.script.writer.core
        return [f"writer: {core.state}, LAC={core.last_add_confirmed}, "
                f"pushed up to {core.last_add_pushed}, pending {core.pending_count}"]

    def cmd_bookies(self, args, kwargs) -> list[str]:
        bookies = self.script.cluster.bookies
        return [_bookie_line(name, bookies[name], self.script.cluster.ledger_id)
                for name in sorted(bookies, key=_bookie_order)]

    def cmd_expect_violation(self, args, kwargs) -> list[str]:
        found = self.script.violation
        if found is None or found.name != args[0]:
            raise TraceError(f"expected violation {args[0]}, the checker reported "
                             f"{found.name if found else 'none'}")
        self.violation_expected = True
        return [f"as expected: {found.name}"]


def _bookie_order(name: str) -> int:
    return int(name.rsplit("-", 1)[1])


def _bookie_line(name: str, bookie, ledger_id: int) -> str:
    storage = bookie.storage
    state = "up" if bookie.up else "down"
    if not storage.ledger_exists(ledger_id):
        return f"{name}: {state}, no ledger {ledger_id}"
    stored = [e for e in range(storage.last_entry_id(ledger_id) + 1)
              if storage.has(ledger_id, e)]
    unflushed = [e for e in stored if not storage.durable_has(ledger_id, e)]
    flags = [f for f, on in (("fenced", storage.is_fenced(ledger_id)),
                             ("limbo", storage.is_limbo(ledger_id))) if on]
    return (f"{name}: {state}, entries {fmt_ids(stored)}"
            + (f" (not yet durable: {fmt_ids(unflushed)})" if unflushed else "")
            + "".join(f", {f}" for f in flags))


def run_trace(text: str) -> tuple[list[str | Block], list[list[str]], list[str]]:
    """Run every command of a trace file.  Returns the parsed file, the
    actual output of each block, and the problems found (violations the file
    does not expect); raises ``TraceError`` on a malformed file."""
    items = parse(text)
    interpreter = Interpreter()
    outputs = []
    for item in items:
        if isinstance(item, Block):
            try:
                outputs.append(interpreter.execute(item.command))
            except TraceError as exc:
                raise TraceError(f"line {item.line_no}: {item.command}: {exc}") from None
    interpreter.finish()
    return items, outputs, interpreter.problems
