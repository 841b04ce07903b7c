"""The knobs and limits of a bulk read, in one place.

``BulkReadConfig`` is frozen and checked when built: every limit is an int
of at least 1 (``retry_backoff_ms`` at least 0), so a reader never runs with
an unbounded or nonsensical window, batch, retry count or deadline.  Each
field says what it trades off.
"""

from __future__ import annotations

from dataclasses import dataclass

from appliance.protocol import limits
from ipc.frames import DEFAULT_LIMITS


@dataclass(frozen=True)
class BulkReadConfig:
    """Knobs of a bulk read, each a trade-off."""

    # Deadline of one batched read.  Shorter: a dead bookie is skipped sooner;
    # longer: fewer needless failovers from a merely busy bookie.
    read_timeout_ms: int = 5000
    # Entries asked per read (the bookie also cuts at its own limit).
    # More amortises the per-message cost; fewer bounds one reply's memory.
    batch_entries_max: int = 1024
    # Entry bytes asked per read: bounds one reply's memory.
    batch_bytes_max: int = 16 * 1024 * 1024
    # Requests outstanding per bookie.  More hides round trips; fewer keeps
    # one reader from crowding out other clients of the bookie.
    inflight_per_bookie_max: int = 2
    # Chunks in flight or verified ahead of the one handed out: bounds the
    # memory of out-of-order replies (about this many replies).
    window_chunks_max: int = 12
    # Tries of each replica per entry before the read fails.  More rides out
    # restarts; fewer fails a hopeless read sooner.
    rounds_max: int = 2
    # Pause before a new round over the replicas (a restarting bookie).
    retry_backoff_ms: int = 200
    # A chunk unanswered this long is also asked of another replica with
    # room for a request (once; the first answer wins, the slow bookie is
    # asked last for a while).  0: off.  Shorter: a stalled bookie costs a
    # replay less; longer: fewer duplicate reads of big chunks when every
    # bookie is slow (bounded anyway by inflight_per_bookie_max).
    speculative_read_timeout_ms: int = limits.CLIENT_SPECULATIVE_READ_TIMEOUT_MS
    # Largest entry accepted in a reply (header, digest and payload).
    entry_bytes_max: int = DEFAULT_LIMITS.entry_bytes_max
    # READ_PACKED (a reply's entries in one frame: the per-entry cost of a
    # ZeroMQ frame disappears on both ends) or READ_BATCH (one frame per
    # entry; for bookies that predate READ_PACKED).
    packed_replies: bool = True

    def __post_init__(self) -> None:
        for name in ("read_timeout_ms", "batch_entries_max", "batch_bytes_max",
                     "inflight_per_bookie_max", "window_chunks_max", "rounds_max",
                     "entry_bytes_max"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        for name in ("retry_backoff_ms", "speculative_read_timeout_ms"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
