"""One client process of ``bkctl bench write|read`` (``client_main``) and
its loops: connect, create the ledgers, warm up, wait for the parent's
``go``, then add (closed or open loop, one add or a batch per call) or
read back, and send the raw timings to the parent.  How the figures are
counted: ``appliance.bench.ledgers``.

Imports stay light: every client process imports this module, and its heap
is part of what the bench measures (each full garbage collection scans it).

Bounds: the handle's ``inflight_adds_max`` adds in flight, latency arrays
that grow in chunks, one result message per process, and a timeout on
every wait (``CLIENT_TIMEOUT_S``, ``START_TIMEOUT_S``).  Payloads read back
are checked; a failed add fails the run through the last future.
"""

from __future__ import annotations

import dataclasses
import gc
import sys
import threading
import time

import numpy as np

import appliance
from appliance.bench.launcher import START_TIMEOUT_S
from appliance.client.client import raise_process_settings

CLIENT_TIMEOUT_S = 3600.0  # the longest a client may take (a bound, not a target)
WARMUP_ADDS = 2000  # untimed adds per client before the measured phase
OPEN_LOOP_WAKE_S = 200e-6  # the open loop sleeps at least this long; then sends what is due
PASSWORD = b"bench"
CHUNK_BITS = 16  # latency arrays grow in chunks of 65,536 entries


def client_main(kind: str, config: str, options, index: int, ready, done, go) -> None:
    """Body of one client process: connect, prepare, wait for ``go``, run.
    ``options``: the run's ``ledgers.BenchOptions``."""
    try:
        with appliance.connect(config) as bk:
            raise_process_settings(options.gc_threshold, options.switch_interval_us)
            if options.add_messages_inflight is not None:  # the driver reads it each turn
                bk.driver.call(setattr, bk.driver.outbound, "add_messages_inflight",
                               options.add_messages_inflight).result(START_TIMEOUT_S)
            inflight = max(1, options.inflight // options.ledgers)  # shared by the ledgers
            bk.config = dataclasses.replace(bk.config, inflight_adds_max=inflight)
            payloads = _payloads(options.size, index)
            handles = [bk.create_ledger(options.ensemble, options.write_quorum,
                                        options.ack_quorum, password=PASSWORD)
                       for _ in range(options.ledgers)]
            lh = handles[0] if len(handles) == 1 else RoundRobin(handles)
            try:
                result = _prepare_and_run(kind, bk, lh, options, payloads, ready, go, index)
                result["add_messages_inflight"] = bk.driver.outbound.add_messages_inflight
                ready.put(("looped", index, None))  # the bookies' CPU stops counting here
            finally:
                for handle in handles:
                    _cleanup(bk, handle)
        done.put(("done", index, result))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which fails the run
        done.put(("error", index, f"{type(exc).__name__}: {exc}"))
        ready.put(("error", index, f"{type(exc).__name__}: {exc}"))


def _prepare_and_run(kind, bk, lh, options, payloads, ready, go, index) -> dict:
    warmup = min(WARMUP_ADDS, options.entries)
    if kind == "write":
        write_loop(lh, payloads, warmup, 0.0, None)  # untimed
        ready.put(("ready", index, None))
        _wait_go(go)
        rate = options.rate / options.clients
        if options.add_batch > 1:
            return write_batches_loop(lh, payloads, options.entries, options.add_batch,
                                      options.duration_s, options.sample_every)
        return write_loop(lh, payloads, options.entries, rate, options.duration_s,
                          options.sample_every)
    write_loop(lh, payloads, options.entries, 0.0, None, sample_every=1024)
    lh.close()
    rh = bk.open_ledger(lh.id, password=PASSWORD)
    ready.put(("ready", index, None))
    _wait_go(go)
    if options.read_chunks:
        return read_chunks_loop(rh, payloads, options.entries, options.duration_s)
    return read_loop(rh, payloads, options.entries, options.read_batch, options.duration_s)


class RoundRobin:
    """Several write handles as one for the write loops: each add (or
    batch of adds) goes to the next ledger in turn."""

    def __init__(self, handles):
        self.handles, self._next = handles, 0
        self._last: dict[int, object] = {}  # handle index -> its last future

    def _take(self) -> int:
        index = self._next
        self._next = (self._next + 1) % len(self.handles)
        return index

    def add_async(self, payload):
        index = self._take()
        fut = self._last[index] = self.handles[index].add_async(payload)
        return fut

    def add_many_async(self, payloads):
        index = self._take()
        futs = self.handles[index].add_many_async(payloads)
        self._last[index] = futs[-1]
        return futs

    def last_futures(self) -> list:
        """Each ledger's last add: acks are in order per ledger only."""
        return list(self._last.values())


def _wait_go(go) -> None:
    if not go.wait(START_TIMEOUT_S + 60.0):
        raise TimeoutError("the parent never released the clients")


def _cleanup(bk, lh) -> None:
    try:
        lh.close()
        bk.delete_ledger(lh.id)
    except Exception:  # noqa: BLE001 - a failed run already reported its own error
        pass


def _payloads(size: int, salt: int) -> list[bytes]:
    """64 distinct payloads (entry i carries payloads[i % 64]): reads can be
    checked, and nothing is built per add."""
    rng = np.random.default_rng(1000 + salt)
    return [rng.integers(0, 256, size, dtype=np.uint8).tobytes() for _ in range(64)]


class _Times:
    """A float64 array that grows in chunks (its index is the entry number)."""

    def __init__(self):
        self.chunks: list[np.ndarray] = []

    def set(self, i: int, value: float) -> None:
        c = i >> CHUNK_BITS
        while c >= len(self.chunks):
            self.chunks.append(np.full(1 << CHUNK_BITS, np.nan))
        self.chunks[c][i & ((1 << CHUNK_BITS) - 1)] = value

    def array(self, n: int) -> np.ndarray:
        return np.concatenate(self.chunks)[:n] if self.chunks else np.empty(0)


def _wait_all(lh, last) -> None:
    """``_wait_last`` of every ledger the loop wrote (``RoundRobin``)."""
    for fut in (lh.last_futures() if isinstance(lh, RoundRobin) else [last]):
        _wait_last(fut)


def _wait_last(last) -> None:
    """Wait for the last add: acks are in order, so its callbacks run after
    every earlier one's, and it fails if any add failed."""
    if last is None:
        return
    all_done = threading.Event()
    last.add_done_callback(lambda _: all_done.set())
    all_done.wait(CLIENT_TIMEOUT_S)
    error = last.exception()
    if error is not None:
        raise RuntimeError(f"adds failed: {type(error).__name__}: {error}")


def _result(start: float, count: int, size: int, cpu0: float, sent, done) -> dict:
    """One client's raw figures, the loop just ended."""
    return {"start": start, "end": time.perf_counter(), "count": count,
            "bytes": count * size, "cpu_s": time.process_time() - cpu0,
            "sent": np.asarray(sent), "done": np.asarray(done),
            "gc_threshold0": gc.get_threshold()[0],
            "switch_interval_us": round(sys.getswitchinterval() * 1e6)}


def _done_recorder(done: _Times):
    """The one callback every timed add of a loop shares, and the map it
    reads: ``samples[id(future)] = k`` before the callback is attached, and
    the callback records sample ``k``'s completion time.  Nothing is made
    per add (a ``functools.partial`` per timed add was an object in flight
    per add, for the client's collector to promote and scan: timing every
    add made the client's full collections, and the latency spikes they
    cause, several times as frequent as the library alone makes them).  A
    future is alive until its callbacks ran, so its id is not reused before
    its entry is popped.  Failed adds are recorded too; the last future's
    check fails the run."""
    samples: dict[int, int] = {}

    def on_done(fut) -> None:
        done.set(samples.pop(id(fut)), time.perf_counter())

    return on_done, samples


def write_loop(lh, payloads: list[bytes], entries: int, rate: float, duration_s: float | None,
               sample_every: int = 1) -> dict:
    """Adds, at most the handle's ``inflight_adds_max`` in flight (its
    ``add_async`` blocks beyond); open loop at ``rate``/s if > 0.  The
    latency of every ``sample_every``-th add is recorded."""
    sent, done = _Times(), _Times()
    on_done, samples = _done_recorder(done)

    cpu0, start = time.process_time(), time.perf_counter()
    stop_at = start + duration_s if duration_s else float("inf")
    interval = 1.0 / rate if rate > 0 else 0.0
    n = k = 0
    last = None
    while n < entries:
        now = time.perf_counter()
        if now >= stop_at:
            break
        due = start + n * interval
        if due > now:
            time.sleep(max(due - now, OPEN_LOOP_WAKE_S))
        last = lh.add_async(payloads[n & 63])
        if n % sample_every == 0:
            sent.set(k, due if interval else time.perf_counter())
            samples[id(last)] = k
            last.add_done_callback(on_done)
            k += 1
        n += 1
    _wait_all(lh, last)
    return _result(start, n, len(payloads[0]), cpu0, sent.array(k), done.array(k))


def write_batches_loop(lh, payloads: list[bytes], entries: int, batch: int,
                       duration_s: float | None, sample_every: int = 1) -> dict:
    """Closed loop with ``WriteHandle.add_many_async`` calls of ``batch``
    payloads (it blocks while the handle's in-flight limits are reached);
    latency of every ``sample_every``-th add, from the call that queued it."""
    sent, done = _Times(), _Times()
    on_done, samples = _done_recorder(done)

    cpu0, start = time.process_time(), time.perf_counter()
    stop_at = start + duration_s if duration_s else float("inf")
    n = k = 0
    last = None
    while n < entries and time.perf_counter() < stop_at:
        count = min(batch, entries - n)
        t0 = time.perf_counter()
        futs = lh.add_many_async([payloads[(n + i) & 63] for i in range(count)])
        for i in range(-n % sample_every, count, sample_every):
            sent.set(k, t0)
            samples[id(futs[i])] = k
            futs[i].add_done_callback(on_done)
            k += 1
        last = futs[-1]
        n += count
    _wait_all(lh, last)
    return _result(start, n, len(payloads[0]), cpu0, sent.array(k), done.array(k))


def read_loop(rh, payloads: list[bytes], entries: int, batch: int,
              duration_s: float | None) -> dict:
    """Read entries 0..entries-1 back in calls of ``batch``; spot-check them."""
    last_entry = min(entries, rh.last_add_confirmed + 1) - 1
    sent, done = [], []
    cpu0, start = time.process_time(), time.perf_counter()
    stop_at = start + duration_s if duration_s else float("inf")
    count = 0
    for first in range(0, last_entry + 1, batch):
        if time.perf_counter() >= stop_at:
            break
        last = min(first + batch - 1, last_entry)
        t0 = time.perf_counter()
        got = rh.read(first, last)
        done.append(time.perf_counter())
        sent.append(t0)
        _check_read(got, first, last, payloads)
        count += len(got)
    return _result(start, count, len(payloads[0]), cpu0, sent, done)


def read_chunks_loop(rh, payloads: list[bytes], entries: int, duration_s: float | None) -> dict:
    """Read entries 0..entries-1 back with ``ReadHandle.read_chunks`` (one
    call, chunks of one buffer each); latency is per chunk (time since the
    previous one); order, count and sampled bytes are checked."""
    last_entry = min(entries, rh.last_add_confirmed + 1) - 1
    sent, done = [], []
    cpu0, start = time.process_time(), time.perf_counter()
    stop_at = start + duration_s if duration_s else float("inf")
    count, prev = 0, start
    for chunk in rh.read_chunks(0, last_entry):
        now = time.perf_counter()
        sent.append(prev)
        done.append(now)
        prev = now
        if chunk.first_entry_id != count:
            raise RuntimeError(f"chunk starts at {chunk.first_entry_id}, expected {count}")
        data = bytes(chunk.payloads)
        for i in (0, chunk.count // 2, chunk.count - 1):
            entry = chunk.first_entry_id + i
            if data[chunk.offsets[i]:chunk.offsets[i + 1]] != payloads[entry & 63]:
                raise RuntimeError(f"entry {entry} came back with other bytes")
        count += chunk.count
        if now >= stop_at:
            break
    return _result(start, count, len(payloads[0]), cpu0, sent, done)


def _check_read(got, first: int, last: int, payloads: list[bytes]) -> None:
    if len(got) != last - first + 1 or got[0].entry_id != first or got[-1].entry_id != last:
        raise RuntimeError(f"read {first}..{last} returned {len(got)} entries "
                           f"({got[0].entry_id if got else None}..)")
    for e in (got[0], got[len(got) // 2], got[-1]):
        if e.payload != payloads[e.entry_id & 63]:
            raise RuntimeError(f"entry {e.entry_id} came back with other bytes")
