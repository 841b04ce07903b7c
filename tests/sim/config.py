"""One simulation run's configuration, drawn from its seed.

Quorums range from E/Qw/Qa 1/1/1 to 5/3/2 with 0-3 spare bookies, spread
round-robin over three hosts (two racks) for placement.  Faults:
message loss, duplication and delay (a share of messages is *slow*, which is
what reorders a fence behind an add), partitions between a client and a
bookie, bookie crashes (torn unsynced tails) and restarts, writer pauses
(a GC-like stall: the classic "zombie writer") and writer death, and 1-3
recoveries plus 0-2 tailing readers racing the writer.

Seeds without a spare bookie often cut the writer off from one bookie of
its ensemble for several add timeouts (``_draw_lagging``: the delayed
ensemble change and its healing).

Journal-less bookies (BP-46) are drawn only when Qa >= 2, and then at most
Qa - 1 crashes lose data: with more, an acknowledged entry may have no copy
left anywhere, which no protocol can survive.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class SimConfig:
    seed: int
    ensemble: int
    write_quorum: int
    ack_quorum: int
    bookies: int
    journal: bool
    digest: str
    positive_min: int | None  # recovery rule: None = Qa, or 1
    entries: int  # adds the writer attempts
    batch_max: int
    add_interval_ms: tuple[int, int]
    add_timeout_ms: int
    explicit_lac_ms: int
    drop_p: float
    dup_p: float
    slow_p: float  # share of messages delayed by slow_ms
    delay_ms: tuple[int, int]
    slow_ms: tuple[int, int]
    sync_interval_ms: int
    flush_interval_ms: int
    heal_at_ms: int
    writer_close_at_ms: int | None
    writer_dies_at_ms: int | None
    writer_pauses: list[tuple[int, int]] = field(default_factory=list)  # (start, length)
    crashes: list[tuple[int, str, int]] = field(default_factory=list)  # (at, bookie, down)
    partitions: list[tuple[int, str, str, int]] = field(default_factory=list)  # at, a, b, len
    recoveries: list[int] = field(default_factory=list)  # start times
    readers: list[int] = field(default_factory=list)  # start times
    profile: str = "busy"
    # nemeses aimed at the dangerous moments (drawn per seed, see _draw_nemeses)
    crash_trigger_p: float = 0.0  # per request a bookie serves: crash it soon after
    crash_delay_max_ms: int = 10
    crash_budget: int = 0  # triggered crashes per run
    crash_after_fence_p: float = 0.0  # after serving a fencing request: crash soon after
    crash_after_close_p: float = 0.0  # when the ledger gets closed: crash an ensemble bookie
    pause_trigger_p: float = 0.0  # per add batch: the writer stalls (a zombie writer)
    zombie_recovery_p: float = 0.0  # a stalled writer makes someone start a recovery
    recovery_cut_loss: float = 0.0  # that recovery's link to one ensemble bookie loses this
    stall_ms: tuple[int, int] = (30, 600)  # how long a triggered writer stall lasts
    zombie_start_ms: tuple[int, int] = (1, 200)  # stall -> failure detector starts recovery
    recovery_timeout_ms: int | None = None  # None: the writer's add_timeout_ms
    stall_when_idle: bool = False  # stall only with no add in flight
    stall_after_lone_send: bool = False  # stall right after a send that had nothing before it
    stalls_max: int = 10**9  # triggered stalls per run
    stall_at_entry: int | None = None  # stall_when_idle: not before this many entries
    crash_down_ms: tuple[int, int] = (5, 300)  # how long a triggered crash keeps a bookie down
    flaky_links: list[tuple[int, str, str, int, float]] = field(default_factory=list)
    # (at, bookie, length): the bookie refuses every add (read-only disk) for a while
    read_only: list[tuple[int, str, int]] = field(default_factory=list)
    # batch reads (E == Qw only): entries per reader request, and the bookies'
    # limits, which cut replies by the product's rule (appliance.protocol.read_batch)
    read_batch_entries: int = 1
    bookie_batch_entries_max: int = 64
    bookie_batch_bytes_max: int = 1 << 20
    # re-replication of a sealed fragment while the writer writes (tests/sim/rerep.py):
    # start times (journal seeds only: a journal-less crash may leave no copy to take)
    rereplications: list[int] = field(default_factory=list)
    rereplicate_broken: bool = False  # re-point before copying (must be caught)
    # placement labels: bookie-i is on host-((i-1) % hosts + 1); the last host
    # has a rack of its own.  0: unlabelled (each bookie its own host: scripts)
    hosts: int = 0
    placement: str = "host"  # the cores' placement mode ("rack" on some seeds)
    # (at, bookie, length): the bookie is stopped (SIGSTOP): it takes nothing
    # in until the end, then serves what queued up, in order
    bookie_stalls: list[tuple[int, str, int]] = field(default_factory=list)
    # read your writes (a log's owner tells a reader how far its writer's
    # entries are acknowledged, ``LedgerReader.learn_lac``): the share of a
    # tailing reader's waits at its LAC where it asks the writer, whose
    # answer arrives a network delay later; broken: the answer claims one
    # entry more than the writer has acknowledged (must be caught)
    told_lac_p: float = 0.0
    told_lac_broken: bool = False

    @property
    def lossy_crashes_max(self) -> int:
        """Crashes that may lose acknowledged data: none with a journal (it
        never loses an ack), else Qa - 1 (one more could take every copy)."""
        return 10**9 if self.journal else self.ack_quorum - 1

    def summary(self) -> str:
        mode = "journal" if self.journal else "journal-less"
        return (f"{self.profile}: E/Qw/Qa={self.ensemble}/{self.write_quorum}/{self.ack_quorum} "
                f"bookies={self.bookies} {mode} digest={self.digest} "
                f"positive_min={self.positive_min or 'Qa'} entries={self.entries} "
                f"drop={self.drop_p:.2f} dup={self.dup_p:.2f} slow={self.slow_p:.2f} "
                f"crashes={len(self.crashes)} partitions={len(self.partitions)} "
                f"pauses={len(self.writer_pauses)} recoveries={len(self.recoveries)} "
                f"readers={len(self.readers)} flaky={len(self.flaky_links)} "
                f"read_only={len(self.read_only)} stalls={len(self.bookie_stalls)} "
                f"crash_trigger={self.crash_trigger_p}/{self.crash_after_fence_p}/"
                f"{self.crash_after_close_p}/"
                f"{self.crash_budget} "
                f"pause_trigger={self.pause_trigger_p} zombie={self.zombie_recovery_p} "
                f"recovery_cut={self.recovery_cut_loss}")


def random_config(seed: int) -> SimConfig:
    rng = random.Random(seed * 7919 + 17)
    ensemble = rng.randint(1, 5)
    write_quorum = rng.randint(1, min(ensemble, 3))
    ack_quorum = rng.randint(1, min(write_quorum, 2))
    bookies = ensemble + rng.choice((0, 1, 1, 2, 3))
    journal = ack_quorum < 2 or rng.random() < 0.5
    heal_at_ms = rng.randint(600, 2_000)
    profile = rng.choices(("calm", "busy", "zombie"), weights=(1, 4, 5))[0]
    busy = profile != "calm"
    cfg = SimConfig(
        seed=seed, ensemble=ensemble, write_quorum=write_quorum, ack_quorum=ack_quorum,
        bookies=bookies, journal=journal, digest=rng.choice(("crc32c", "hmac-sha256")),
        positive_min=rng.choice((None, 1)), entries=rng.randint(1, 60),
        batch_max=rng.choice((1, 1, 3, 6)), add_interval_ms=(1, rng.choice((3, 10, 30))),
        add_timeout_ms=rng.choice((60, 150, 400)),
        explicit_lac_ms=rng.choice((0, 0, 50)),
        drop_p=rng.choice((0.0, 0.01, 0.05, 0.15)) if busy else 0.0,
        dup_p=rng.choice((0.0, 0.02, 0.1)) if busy else 0.0,
        slow_p=rng.choice((0.0, 0.05, 0.2)) if busy else 0.0,
        delay_ms=(1, rng.choice((2, 5, 15))), slow_ms=(20, rng.choice((80, 300))),
        sync_interval_ms=rng.randint(1, 4), flush_interval_ms=rng.choice((5, 20, 80)),
        heal_at_ms=heal_at_ms,
        writer_close_at_ms=rng.randint(50, heal_at_ms) if rng.random() < 0.4 else None,
        writer_dies_at_ms=rng.randint(20, heal_at_ms) if rng.random() < 0.3 else None,
    )
    cfg.profile = profile
    _draw_faults(cfg, rng, busy)
    if profile == "busy":
        _draw_nemeses(cfg, rng)
    elif profile == "zombie":
        _draw_zombie(cfg, rng)
    _draw_batch_reads(cfg, random.Random(seed * 7919 + 29))  # leaves the draws above as they were
    _draw_rereplications(cfg, random.Random(seed * 7919 + 31))
    _draw_read_only(cfg, random.Random(seed * 7919 + 37))
    _draw_bookie_stalls(cfg, random.Random(seed * 7919 + 41))
    _draw_lagging(cfg, random.Random(seed * 7919 + 41))
    cfg.told_lac_p = random.Random(seed * 7919 + 43).choice((0.0, 0.0, 0.3, 0.8))
    cfg.hosts, cfg.placement = 3, "rack" if seed % 4 == 3 else "host"  # no draw: seeds keep
    return cfg


def _draw_bookie_stalls(cfg: SimConfig, rng: random.Random) -> None:
    """Half the seeds: one or two bookies stop answering for a while (a
    SIGSTOP, a long GC pause, a hung disk) while readers, the writer and
    recoveries go on: speculative reads, quarantine and recovery's timeouts
    must read and recover around them."""
    if rng.random() < 0.5:
        cfg.bookie_stalls = sorted((rng.randint(0, cfg.heal_at_ms),
                                    f"bookie-{rng.randint(1, cfg.bookies)}",
                                    rng.randint(30, 800)) for _ in range(rng.randint(1, 2)))


def _draw_read_only(cfg: SimConfig, rng: random.Random) -> None:
    """Some seeds: a bookie turns read-only for a while before the heal (its
    own random stream: the other draws stay as they were)."""
    if rng.random() < 0.3:
        cfg.read_only = sorted((rng.randint(5, cfg.heal_at_ms),
                                f"bookie-{rng.randint(1, cfg.bookies)}", rng.randint(20, 400))
                               for _ in range(rng.randint(1, 2)))


def _draw_lagging(cfg: SimConfig, rng: random.Random) -> None:
    """Half the seeds without a spare bookie whose ack quorum survives one
    bookie (Qw > Qa): the writer is cut off from a bookie of its ensemble
    for 2-6 add timeouts (the delayed ensemble change, then its healing)."""
    if cfg.bookies == cfg.ensemble and cfg.write_quorum > cfg.ack_quorum \
            and rng.random() < 0.5:
        length = rng.randint(2 * cfg.add_timeout_ms, 6 * cfg.add_timeout_ms)
        at = rng.randint(5, max(6, cfg.heal_at_ms - length // 2))
        cfg.partitions.append((at, "writer", f"bookie-{rng.randint(1, cfg.bookies)}", length))
        cfg.partitions.sort()


def sim_locations(bookies: int, hosts: int) -> dict:
    """``SimConfig.hosts`` as ``placement.Location`` by bookie name."""
    from appliance.protocol.placement import Location

    if hosts <= 0:
        return {}
    out = {}
    for i in range(1, bookies + 1):
        host = (i - 1) % hosts + 1
        out[f"bookie-{i}"] = Location(f"host-{host}", "rack-2" if host == hosts else "rack-1")
    return out


def _draw_rereplications(cfg: SimConfig, rng: random.Random) -> None:
    """On about half of the journal seeds with a spare bookie, one or two
    re-replications of a sealed fragment start while the writer is writing
    (each first crashes a bookie of the last fragment if there is no sealed
    fragment yet, so the writer changes its ensemble)."""
    if cfg.journal and cfg.bookies > cfg.ensemble and cfg.write_quorum >= 2 \
            and rng.random() < 0.6:
        cfg.rereplications = sorted(rng.randint(10, 250)
                                    for _ in range(rng.randint(1, 2)))
        cfg.entries = max(cfg.entries, 400)  # a writer still writing when it happens
        later = cfg.rereplications[-1] + 300  # closes and recoveries come after it
        cfg.recoveries = sorted(max(at, later) for at in cfg.recoveries)
        if cfg.writer_close_at_ms is not None:
            cfg.writer_close_at_ms = max(cfg.writer_close_at_ms, later)
        if cfg.writer_dies_at_ms is not None:
            cfg.writer_dies_at_ms = max(cfg.writer_dies_at_ms, later)
        cfg.pause_trigger_p = cfg.zombie_recovery_p = 0.0  # no early zombie recovery
        cfg.writer_pauses = [(max(at, later), length) for at, length in cfg.writer_pauses]


def _draw_batch_reads(cfg: SimConfig, rng: random.Random) -> None:
    """Readers ask for batches on about half the seeds; bookies' limits are
    small enough on some to cut replies by entries or by bytes (a record here
    is a ~40-byte header plus a short payload)."""
    cfg.read_batch_entries = rng.choice((1, 4, 16))
    cfg.bookie_batch_entries_max = rng.choice((64, 3))
    cfg.bookie_batch_bytes_max = rng.choice((1 << 20, 200, 1))


def _draw_faults(cfg: SimConfig, rng: random.Random, busy: bool) -> None:
    names = [f"bookie-{i}" for i in range(1, cfg.bookies + 1)]
    horizon = cfg.heal_at_ms
    for _ in range(rng.randint(0, 4) if busy else rng.randint(0, 1)):
        cfg.crashes.append((rng.randint(5, horizon), rng.choice(names), rng.randint(5, 400)))
    cfg.crashes.sort()
    clients = ["writer"] + [f"recovery-{i}" for i in range(1, 4)]
    for _ in range(rng.randint(0, 3) if busy else 0):
        cfg.partitions.append((rng.randint(5, horizon), rng.choice(clients), rng.choice(names),
                               rng.randint(10, 500)))
    for _ in range(rng.randint(0, 2)):
        cfg.writer_pauses.append((rng.randint(5, horizon), rng.randint(20, 600)))
    cfg.recoveries = sorted(rng.randint(10, horizon) for _ in range(rng.randint(1, 3)))
    cfg.readers = sorted(rng.randint(0, horizon // 2) for _ in range(rng.randint(0, 2)))


def _draw_nemeses(cfg: SimConfig, rng: random.Random) -> None:
    """Faults timed by what the system is doing, not by the clock alone: a
    bookie crashing just after it fenced or acknowledged something (inside
    its flush window), a writer stalling with adds in flight while a failure
    detector starts a recovery, links that lose half their messages."""
    if rng.random() < 0.6:
        cfg.crash_trigger_p = rng.choice((0.005, 0.02, 0.05))
        cfg.crash_budget = rng.randint(1, 3)
        cfg.crash_delay_max_ms = rng.choice((2, 10, 40))
    if rng.random() < 0.5:
        cfg.pause_trigger_p = rng.choice((0.05, 0.2))
        cfg.zombie_recovery_p = rng.choice((0.5, 1.0))
    names = [f"bookie-{i}" for i in range(1, cfg.bookies + 1)]
    clients = ["writer", "recovery-1", "recovery-2", "recovery-3", "zombie-recovery-1"]
    for _ in range(rng.randint(0, 2)):
        cfg.flaky_links.append((rng.randint(0, cfg.heal_at_ms), rng.choice(clients),
                                rng.choice(names), rng.randint(50, 800), rng.choice((0.3, 0.6))))


def _draw_zombie(cfg: SimConfig, rng: random.Random) -> None:
    """The zombie-writer family: the writer stalls right after sending adds,
    a failure detector starts a recovery, then the writer wakes up and
    carries on as if nothing happened.  One of three shapes (every parameter
    still random), after the counterexamples BookKeeper's TLA+ model found:

    * ``fence-race``: adds still in flight, slow links, the recovery loses its
      messages to one bookie (a lost fence) -- BookKeeper 2614;
    * ``crash-after-close``: the recovery cannot reach one bookie, and a bookie
      it fenced crashes just after the close, before its fence was flushed --
      BP-46 scenario 1;
    * ``lossy-ack``: a bookie crashes right after acknowledging an add, before
      flushing it, while another copy is slow -- BP-46 scenario 2."""
    shape = rng.choices(("fence-race", "crash-after-close", "lossy-ack"), weights=(2, 3, 2))[0]
    cfg.profile = f"zombie/{shape}"
    cfg.writer_dies_at_ms = None
    cfg.writer_close_at_ms = None
    cfg.writer_pauses = []
    cfg.heal_at_ms = rng.randint(1_500, 3_000)
    cfg.recoveries = []  # recovery starts only when the writer looks dead
    cfg.crashes = []  # crashes come from the shape's trigger, not the clock
    cfg.partitions = [p for p in cfg.partitions if p[1] == "writer"]
    cfg.bookies = max(cfg.bookies, cfg.ensemble + 1)  # a spare, so the writer survives
    cfg.entries = rng.randint(3, 40)
    cfg.add_timeout_ms = rng.choice((150, 400, 1_000))
    cfg.pause_trigger_p = rng.choice((0.1, 0.3))
    cfg.zombie_recovery_p = 1.0
    cfg.slow_p = rng.choice((0.1, 0.3, 0.5))
    cfg.slow_ms = (20, rng.choice((100, 300)))
    cfg.drop_p = rng.choice((0.0, 0.02, 0.1))
    cfg.crash_budget = rng.randint(1, 2)
    cfg.crash_delay_max_ms = rng.choice((2, 10))
    cfg.crash_down_ms = (5, rng.choice((50, 200)))
    if shape == "fence-race":
        _shape_fence_race(cfg, rng)
        return
    if shape == "crash-after-close":  # BP-46 scenario 1 needs Qa >= 2 and no journal
        cfg.ensemble = max(cfg.ensemble, 2)
        cfg.write_quorum = max(cfg.write_quorum, 2)
        cfg.ack_quorum = 2
        cfg.bookies = max(cfg.bookies, cfg.ensemble + 1)
        cfg.journal = False
    if cfg.ack_quorum >= 2 and rng.random() < 0.8:
        cfg.journal = False  # BP-46: crashes lose acknowledged data and fence flags
    cfg.flush_interval_ms = rng.choice((20, 80, 200))
    if shape == "crash-after-close":
        _shape_crash_after_close(cfg, rng)
    else:  # lossy-ack
        cfg.zombie_start_ms = (20, 200)
        cfg.stall_ms = (rng.choice((30, 200)), rng.choice((400, 900)))
        cfg.crash_trigger_p = rng.choice((0.05, 0.2))


def _shape_fence_race(cfg: SimConfig, rng: random.Random) -> None:
    """One entry in flight when the writer stalls; slow and lost messages
    may let it reach an unfenced bookie after non-fencing reads said no."""
    if rng.random() < 0.6:  # where the race is cheapest: Qw = Qa = 2 (QC = 1)
        cfg.ensemble = max(cfg.ensemble, 2)
        cfg.write_quorum = cfg.ack_quorum = 2
        cfg.bookies = max(cfg.bookies, cfg.ensemble + 1)
    if rng.random() < 0.6:
        cfg.positive_min = None  # the BP-46 rule: one positive does not save the entry
    cfg.slow_p = 0.5
    cfg.slow_ms = (20, 300)
    cfg.drop_p = rng.choice((0.02, 0.1))  # a lost fence, as in the TLA+ trace
    cfg.batch_max = 1
    cfg.stall_after_lone_send = True
    cfg.pause_trigger_p = 1.0
    cfg.stalls_max = rng.choice((1, 2))
    cfg.stall_at_entry = rng.randint(0, cfg.entries - 1)
    cfg.add_interval_ms = (5, 30)
    cfg.zombie_start_ms = (1, 30)
    cfg.stall_ms = (rng.choice((100, 500)), rng.choice((1_500, 2_500)))
    cfg.heal_at_ms = rng.randint(3_000, 5_000)
    cfg.add_timeout_ms = rng.choice((400, 2_000, 3_000))  # mostly: no timeout in the stall
    cfg.recovery_timeout_ms = rng.choice((400, 800))  # above the slowest delivery
    cfg.recovery_cut_loss = rng.choice((0.0, 0.0, 0.5))  # a full cut leaves Qw=Qa stuck


def _shape_crash_after_close(cfg: SimConfig, rng: random.Random) -> None:
    """An idle writer (LAC published) stalls; a recovery that cannot reach one
    bookie closes the ledger; a fenced bookie crashes before flushing."""
    cfg.zombie_start_ms = (1, 200)
    cfg.stall_when_idle = True
    cfg.stalls_max = 1
    cfg.pause_trigger_p = 1.0
    cfg.stall_at_entry = rng.randint(0, cfg.entries - 1)
    cfg.explicit_lac_ms = rng.choice((10, 50))  # an idle writer publishes its LAC
    cfg.stall_ms = (400, 900)
    cfg.crash_down_ms = (5, 100)
    cfg.add_interval_ms = (10, 40)  # often idle: a stall finds nothing in flight
    cfg.batch_max = rng.choice((1, 3))
    cfg.flush_interval_ms = rng.choice((500, 1_000, 2_000))  # fences stay unflushed a while
    cfg.recovery_cut_loss = 1.0
    cfg.crash_after_close_p = 1.0
