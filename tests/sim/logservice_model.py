"""The world of the log service's simulation (``tests/sim/logservicesim``):
its configuration drawn from a seed, and the things in it (logs, servers,
the entries on their way; the producers are in ``logservice_producers``),
with the one fault the simulator injects into the owner core
(``ForgetfulTable``, ``--break-dedup``).
Single-threaded: everything here belongs to the simulation's one thread."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from appliance.protocol.log_owner import LogOwner
from appliance.protocol.log_service import DedupTable

RECORD_BYTES = 16  # a simulated record with its overhead (payloads are its seq)
END_MS = 120_000  # simulated time limit
# faults stop here: a write that entered during them still has 20 s of calm
# before its deadline (LOG_PRODUCER_DEADLINE_MS, 60 s), four request timeouts
FAULTS_END_MS = 40_000


@dataclass(frozen=True)
class SimConfig:
    seed: int
    servers: int
    producers: int
    records: int
    window: int
    loss: float
    duplicate: float
    delay_ms: tuple[int, int]
    crash_every_ms: int
    pause_every_ms: int
    session_ms: int
    commit_ms: int
    # how the producers' server watch tells of a crashed server: at once (its
    # supervisor deletes the registration), once its session expired, or never
    gone: str
    check_ms: int
    break_dedup: bool = False
    break_oldest: bool = False
    logs: int = 1
    mux: bool = False
    # commits of one log on their way at most (its ledger's window, [client]
    # inflight_adds_max): a request meeting that many is answered "retry"
    # before any of it is judged (the core's GroupCommit.has_room).  0: no bound.
    ledger_window: int = 0
    # the core's group commit: entries cut at this many records, the linger,
    # the gather rule, and control entries after an idle pause (0: none)
    entry_records: int = 64
    linger_ms: int = 2
    gather_ms: int = 0
    control_ms: int = 0


def random_config(seed: int, break_dedup: bool = False, break_oldest: bool = False,
                  mux: bool | None = None) -> SimConfig:
    """``mux``: the producers of a process share its channels, as in the
    product (multi-log messages), or each is a process of its own (None: as
    the seed draws, most seeds share)."""
    rng = random.Random(seed)
    shape = random.Random(seed * 104_729 + 3)  # its own draws: the others stay as they were
    logs = shape.randint(1, 3)
    mux = shape.random() < 0.75 if mux is None else mux
    window = random.Random(seed * 7_919 + 11).choice((0, 0, 1, 2))  # its own draws too
    core = random.Random(seed * 6_007 + 5)  # and the core's settings
    entry_records = core.choice((1, 2, 64)) if window else core.choice((4, 64))
    return SimConfig(seed=seed, logs=logs, mux=mux, ledger_window=window,
                     entry_records=entry_records, linger_ms=core.choice((0, 2, 20)),
                     gather_ms=core.choice((0, 0, 5)), control_ms=core.choice((0, 100)),
                     servers=rng.randint(1, 3), producers=rng.randint(1, 4),
                     records=rng.randint(10, 60), window=rng.choice((1, 2, 4, 8)),
                     loss=rng.choice((0.0, 0.02, 0.1, 0.2)),
                     duplicate=rng.choice((0.0, 0.05, 0.2)),
                     delay_ms=(1, rng.choice((2, 10, 50))),
                     crash_every_ms=rng.choice((2_000, 5_000, 20_000)),
                     pause_every_ms=rng.choice((0, 5_000, 15_000)),
                     session_ms=rng.choice((500, 2_000)), commit_ms=rng.choice((1, 5, 50)),
                     gone=rng.choice(("prompt", "late", "never")), check_ms=rng.choice((50, 500)),
                     break_dedup=break_dedup, break_oldest=break_oldest)


@dataclass(eq=False)
class Batch:
    """An entry a core sent (``SendEntry`` / ``SendControl``), on its way to
    its log: the ledger acknowledges it ``commit_ms`` later unless a fence
    got there first."""
    owned: Owned
    entry_no: int
    records: list  # (pid, seq)
    control: bool = False
    done: bool = False


@dataclass(eq=False)
class Owned:
    """One log owned by one server process: the real core (``LogOwner``),
    the epoch its writer took, and its entries on their way."""
    sid: str
    incarnation: int  # the server process that owns it
    log: str
    epoch: int
    core: LogOwner
    sent: list = field(default_factory=list)  # Batch, in order
    tick_at: float = -1.0


@dataclass
class LogState:
    """One log: its entries (each a list of (pid, seq)), the entries of
    crashed owners not yet fenced, its epoch, its lease ((server id,
    session) or None), and who wrote each epoch."""
    name: str
    entries: list = field(default_factory=list)
    orphans: list = field(default_factory=list)
    epoch: int = 0
    lease: tuple[str, int] | None = None
    writers: dict = field(default_factory=dict)  # epoch -> the Owned that wrote it
    # entries a reader started now reads from the bookies: those below the
    # last-add-confirmed they know (an entry carries its writer's LAC: the one
    # before it), all of a segment its writer closed or a new owner recovered
    exposed: int = 0

    @property
    def records(self) -> list:
        return [rec for entry in self.entries for rec in entry]


@dataclass
class Server:
    id: str
    session: int
    alive: bool = True
    paused_until: int = 0
    incarnation: int = 0
    owned: dict = field(default_factory=dict)  # log name -> Owned


class ForgetfulTable(DedupTable):
    """The ``--break-dedup`` fault: a duplicate filter that counts every
    record as new (retries are stored again)."""

    def admit(self, producer_id: bytes, seq: int, now_ms: int, oldest: int | None = None):
        super().admit(producer_id, seq, now_ms, oldest)  # known from here on
        producer = self._producers.get(producer_id)
        if producer is not None:
            producer.next_seq = seq
        return super().admit(producer_id, seq, now_ms, oldest)

    def admit_run(self, producer_id: bytes, seq: int, n: int, now_ms: int) -> int:
        return 0  # one by one, through admit
