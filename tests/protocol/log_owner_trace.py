"""Trace files for the log owner core (``tests/protocol/testdata/log_owner_*.txt``):
a command, ``----``, then the actions it caused, one a line.  Read by
``test_log_owner_traces.py``; ``python -m tests.protocol.log_owner_trace FILE``
prints a file's actual output (to write a new one).

Commands (``now=`` in ms, default 0; producers are one letter, A to Z):

    config linger_ms=2 gather_ms=0 ...     a new core with these OwnerConfig fields
    open [A:1@seg.entry.slot ...]           Opened, with the tags learnt
    write TOKEN A SEQ [n=1] [oldest=SEQ]    a request of n records (then a Tick:
                                            alone in its turn of the loop)
    hello TOKEN A                           the next seq expected
    ack ENTRY_NO [seg.entry.slot.n ...]     EntryAcked with its runs
    fail ENTRY_NO                           EntryFailed
    tick | close | writer-closed | lease-released
    state                                   prints the core's state
"""

from __future__ import annotations

import sys
from pathlib import Path

from appliance.protocol.log_owner import LogOwner, OwnerConfig
from appliance.protocol.log_owner_events import (
    Close,
    CloseWriter,
    EntryAcked,
    EntryFailed,
    Hello,
    LeaseReleased,
    Opened,
    ReleaseLease,
    Reply,
    SendControl,
    SendEntry,
    Tick,
    Write,
    WriterClosed,
)


def _pid(letter: str) -> bytes:
    return letter.encode() * 16


def _numbers(text: str) -> list[int]:
    return [int(x) for x in text.split(".")]


def _show(action) -> str:
    if isinstance(action, Reply):
        text = f"reply {action.token} {action.answer.value}"
        if action.runs is not None:
            text += " " + " ".join("forgotten" if r[0] is None else ".".join(map(str, r))
                                   for r in action.runs)
        if action.next_seq is not None or action.answer.value == "hello":
            text += f" next={action.next_seq}"
        if action.expected:
            text += f" expected={action.expected}"
        return text
    if isinstance(action, SendEntry):
        return f"send entry {action.entry_no}: " + " ".join(
            f"{pid[:1].decode()}{seq}" for pid, seq in action.tags)
    if isinstance(action, SendControl):
        return f"send control {action.entry_no}"
    if isinstance(action, CloseWriter):
        return "close writer"
    if isinstance(action, ReleaseLease):
        return "release lease"
    return repr(action)


class Trace:
    def __init__(self):
        self.owner: LogOwner | None = None

    def run(self, line: str) -> list[str]:
        words = line.split()
        opts = dict(w.split("=", 1) for w in words[1:] if "=" in w)
        args = [w for w in words[1:] if "=" not in w]
        now = float(opts.pop("now", 0))
        cmd = words[0]
        if cmd == "config":
            self.owner = LogOwner("orders", OwnerConfig(**{k: float(v) if "." in v else int(v)
                                                           for k, v in opts.items()}))
            return []
        if cmd == "state":
            return [self.owner.state.value]
        out = self.owner.handle(self._event(cmd, args, opts, now))
        if cmd == "write":  # alone in its turn of the driver's loop: then a Tick
            out += self.owner.handle(Tick(now))
        return [_show(a) for a in out]

    def _event(self, cmd: str, args: list, opts: dict, now: float):
        if cmd == "open":
            learnt = []
            for arg in args:
                tag, at = arg.split("@")
                letter, seq = tag.split(":")
                learnt.append((_pid(letter), int(seq), tuple(_numbers(at))))
            return Opened(now, tuple(learnt))
        if cmd == "write":
            token, letter, seq = args[0], args[1], int(args[2])
            n = int(opts.get("n", 1))
            return Write(token, _pid(letter), seq, int(opts.get("oldest", seq)),
                         [b"r%d" % s for s in range(seq, seq + n)], now)
        if cmd == "hello":
            return Hello(args[0], _pid(args[1]), now)
        if cmd == "ack":
            return EntryAcked(int(args[0]), [_numbers(r) for r in args[1:]], now)
        if cmd == "fail":
            return EntryFailed(int(args[0]), "fenced", now)
        simple = {"tick": Tick, "close": Close, "writer-closed": WriterClosed,
                  "lease-released": LeaseReleased}
        return simple[cmd](now)


def parse(text: str) -> list[tuple[str, list[str]]]:
    """(command, expected lines) of each block of a trace file."""
    blocks, lines = [], [ln for ln in text.splitlines() if not ln.startswith("#")]
    i = 0
    while i < len(lines):
        if not lines[i].strip():
            i += 1
            continue
        command = lines[i].strip()
        if lines[i + 1].strip() != "----":
            raise ValueError(f"no ---- after {command!r}")
        i += 2
        expected = []
        while i < len(lines) and lines[i].strip():
            expected.append(lines[i].strip())
            i += 1
        blocks.append((command, expected))
    return blocks


def actual(text: str) -> str:
    trace, out = Trace(), []
    for command, _ in parse(text):
        out.append(command + "\n----\n" + "\n".join(trace.run(command)))
    return "\n\n".join(out) + "\n"


if __name__ == "__main__":
    print(actual(Path(sys.argv[1]).read_text()))
