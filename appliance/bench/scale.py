"""``bkctl bench scale``: how cost grows when the work grows.

Each sweep measures one cost at several sizes and returns one row per size,
plus the growth between the smallest and the largest size as a log-log slope
(``growth_exponent``: ~0 constant, ~1 linear, between them sub-linear such
as log; docs/PERFORMANCE.md "Scale" says what the design predicts for each):

* ``ledgers``: adds/s (closed loop) and p99 (open loop at ``rate``, latency
  from the scheduled send time) against the number of ledgers one client
  writes at once, round robin, on one temporary appliance (four bookies).
* ``stored``: a bookie's boot-to-serving time and resident memory against
  the number of ledgers it stores (one small entry each, written through
  the storage engine and checkpointed: a clean boot loads the index
  snapshot, the journal holds nothing to replay).
* ``journal``: boot-to-serving time against the unflushed journal at a
  kill -9 (``appliance.bench.repair.run_boot_bench``).
* ``metadata``: create, open (read) and list times against the number of
  ledgers in the store, on SQLite and on a temporary ZooKeeper.
* ``handles``: the client's resident memory against its open write
  handles; the slope is the memory per handle.

Every process and temporary folder a sweep starts is stopped and removed at
its end, also on failure.

Each sweep imports what it runs inside its own function: the ``handles``
sweep measures the memory of client processes that import this module, so
every import at the top would be counted in the memory per handle, and the
other sweeps' launchers, the storage engine and kazoo have no place there.
"""

from __future__ import annotations

import math
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

import psutil

from storage.snapshot import SNAPSHOT_NAME

KEY = b"\x5a" * 32  # the master key of the stored-ledgers sweep's ledgers
STORE_BATCH = 4096  # ledgers written per storage add_entries call
OPEN_SAMPLES = 200  # reads timed per metadata point
STORE_GC_OFF_MS = 86_400_000  # the stored ledgers are in no metadata: keep GC away


def growth_exponent(rows: list[dict], x: str, y: str) -> float | None:
    """The log-log slope of ``y`` against ``x`` between the first and last
    rows with positive values (None when it cannot be computed)."""
    pts = [(r[x], r[y]) for r in rows if r.get(x) and r.get(y) and r[x] > 0 and r[y] > 0]
    if len(pts) < 2 or pts[0][0] == pts[-1][0]:
        return None
    (x0, y0), (x1, y1) = pts[0], pts[-1]
    return round(math.log(y1 / y0) / math.log(x1 / x0), 3)


def _check_points(points: list[int]) -> list[int]:
    if not points or any(p < 1 for p in points):
        raise ValueError(f"points must be positive integers, got {points}")
    return sorted(set(points))


# -- ledgers written at once -------------------------------------------------------------
def ledgers_curve(points: list[int], entries: int = 50_000, size: int = 1024,
                  rate: float = 10_000.0, duration_s: float = 10.0,
                  workdir: str | None = None, progress=print,
                  gc_threshold: int = 0, switch_interval_us: int = 0,
                  add_messages_inflight: int | None = None) -> list[dict]:
    # on use: measured processes import this module (module docstring)
    from appliance.bench.launcher import temporary_appliance
    from appliance.bench.ledgers import BenchOptions, run_bench

    rows = []
    with temporary_appliance(4, workdir, client={"inflight_adds_max": 10_000}) as (config, _):
        for n in _check_points(points):
            base = dict(size=size, ledgers=n, baseline_s=0.0, entries=max(entries, n),
                        gc_threshold=gc_threshold, switch_interval_us=switch_interval_us,
                        add_messages_inflight=add_messages_inflight)
            closed = run_bench("write", BenchOptions(**base), str(config))
            opened = run_bench("write", BenchOptions(**{**base, "entries": int(rate * duration_s)},
                                                     rate=rate, duration_s=duration_s),
                               str(config))
            row = {"ledgers": n, "adds_per_s": round(closed["adds_per_s"]),
                   "closed_p99_ms": closed["p99_ms"], "rate": rate,
                   "open_adds_per_s": round(opened["adds_per_s"]),
                   "open_p50_ms": opened["p50_ms"], "open_p99_ms": opened["p99_ms"],
                   "client_cpu_s_per_1000": closed["client_cpu_s_per_1000_entries"],
                   "bookie_cpu_s_per_1000": closed["bookie_cpu_s_per_1000_entries"],
                   "client_gc_threshold0": closed["client_gc_threshold0"],
                   "client_switch_interval_us": closed["client_switch_interval_us"],
                   "client_add_messages_inflight": closed["client_add_messages_inflight"]}
            progress(f"  {n:>6} ledgers: {row['adds_per_s']:>8,} adds/s closed loop; "
                     f"p99 {row['open_p99_ms']:.1f} ms at {rate:,.0f}/s")
            rows.append(row)
    return rows


# -- ledgers stored on one bookie ----------------------------------------------------------
def _fill_storage(config, bookie_id: str, ledgers: int) -> float:
    """``ledgers`` ledgers of one 100-byte entry each, durable and
    checkpointed; returns the seconds it took."""
    # on use: measured processes import this module (module docstring)
    from storage import LedgerStorage

    spec = config.bookie(bookie_id)
    options = config.storage.to_options()
    LedgerStorage.format(bookie_id, spec.journal_dir, spec.ledger_dir, options)
    started = time.monotonic()
    st = LedgerStorage.open(bookie_id, spec.journal_dir, spec.ledger_dir, options)
    try:
        data = os.urandom(100)
        for first in range(1, ledgers + 1, STORE_BATCH):
            ids = range(first, min(first + STORE_BATCH, ledgers + 1))
            for ledger_id in ids:
                st.set_master_key(ledger_id, KEY)
            ticket = st.add_entries(list(ids), [0] * len(ids), [data] * len(ids))
        if not st.wait_durable(ticket, timeout_s=600.0):
            raise TimeoutError(f"{ledgers} ledgers were not durable within 600 s")
        st.checkpoint()
    finally:
        st.close()
    return time.monotonic() - started


def _rss_mb(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 1e6


def stored_curve(points: list[int], workdir: str | None = None, progress=print) -> list[dict]:
    # on use: measured processes import this module (module docstring)
    from appliance.bench.repair import SESSION_TIMEOUT_MS, _Bookies

    rows = []
    for n in _check_points(points):
        root = Path(tempfile.mkdtemp(prefix="bkscale", dir=workdir))
        bookies = _Bookies(root, 1, metadata={"session_timeout_ms": SESSION_TIMEOUT_MS},
                           client={"ensemble": 1, "write_quorum": 1, "ack_quorum": 1},
                           server={"gc_interval_ms": STORE_GC_OFF_MS,
                                   "overreplicated_grace_ms": 0})
        try:
            bookie_id = bookies.config.bookies[0].id
            fill_s = _fill_storage(bookies.config, bookie_id, n)
            snapshot = sum(f.stat().st_size for f in
                           Path(bookies.config.bookie(bookie_id).ledger_dir).rglob(SNAPSHOT_NAME))
            boot_s = bookies.start(bookie_id)
            info = bookies.info(bookie_id)
            stored = (info.get("storage") or {}).get("ledgers")
            row = {"ledgers": n, "boot_to_serving_s": round(boot_s, 3),
                   "storage_open_s": (info.get("storage") or {}).get("open_s"),
                   "rss_mb": round(_rss_mb(bookies.procs[bookie_id].pid), 1),
                   "index_snapshot_bytes": snapshot, "fill_s": round(fill_s, 1),
                   "ledgers_reported": stored}
            progress(f"  {n:>9,} ledgers: boot {row['boot_to_serving_s']:.2f} s, "
                     f"RSS {row['rss_mb']:.0f} MB, snapshot {snapshot / 1e6:.1f} MB")
            rows.append(row)
        finally:
            bookies.stop()
            shutil.rmtree(root, ignore_errors=True)
    return rows


# -- the unflushed journal at a crash -----------------------------------------------------
def journal_curve(points_mb: list[int], entry_bytes: int = 65536, workdir: str | None = None,
                  progress=print) -> list[dict]:
    # on use: measured processes import this module (module docstring)
    from appliance.bench.repair import run_boot_bench

    rows = []
    for mb in _check_points(points_mb):
        row = run_boot_bench([mb * 1024 * 1024], entry_bytes, workdir)[0]
        row["journal_mb"] = round(row["journal_bytes"] / 1e6)
        progress(f"  {row['journal_mb']:>6} MB unflushed: serving after "
                 f"{row['boot_to_serving_s']:.2f} s")
        rows.append(row)
    return rows


# -- metadata ---------------------------------------------------------------------------------
def _metadata_rows(store, points: list[int], backend: str, progress) -> list[dict]:
    # on use: measured processes import this module (module docstring)
    from appliance.meta.ledgers import LedgerManager

    ledgers = LedgerManager(store)
    ensemble = ["b1", "b2", "b3"]
    rng = random.Random(18)
    ids: list[int] = []
    rows = []
    for n in points:
        todo = n - len(ids)
        started = time.monotonic()
        for _ in range(todo):
            ids.append(ledgers.create_ledger(3, 3, 2, ensemble).ledger_id)
        create_s = time.monotonic() - started
        sample = [rng.choice(ids) for _ in range(OPEN_SAMPLES)]
        started = time.monotonic()
        for ledger_id in sample:
            ledgers.read_ledger(ledger_id)
        open_ms = (time.monotonic() - started) * 1000 / len(sample)
        started = time.monotonic()
        listed = len(ledgers.list_ledgers())
        list_ms = (time.monotonic() - started) * 1000
        if listed != len(ids):
            raise AssertionError(f"{backend}: listed {listed} ledgers, created {len(ids)}")
        row = {"backend": backend, "ledgers": n,
               "create_ms": round(create_s * 1000 / todo, 3) if todo else None,
               "open_ms": round(open_ms, 3), "list_ms": round(list_ms, 2)}
        progress(f"  {backend:>6} {n:>8,} ledgers: create {row['create_ms']} ms, "
                 f"open {row['open_ms']} ms, list {row['list_ms']} ms")
        rows.append(row)
    return rows


def metadata_curve(points: list[int], backends: tuple[str, ...] = ("sqlite", "zk"),
                   workdir: str | None = None, progress=print) -> list[dict]:
    # on use: measured processes import this module (module docstring)
    from storage.metadata import open_store

    points = _check_points(points)
    rows = []
    for backend in backends:
        root = Path(tempfile.mkdtemp(prefix="bkscale-md", dir=workdir))
        try:
            if backend == "sqlite":
                with open_store(f"sqlite:///{root}/meta.db") as store:
                    rows += _metadata_rows(store, points, backend, progress)
            elif backend == "zk":
                # on use: measured processes import this module (module docstring)
                from appliance.bench.zk_server import ZooKeeperServer

                with ZooKeeperServer(root / "zk") as zk, \
                        open_store(zk.uri("/scale")) as store:
                    rows += _metadata_rows(store, points, backend, progress)
            else:
                raise ValueError(f"backend must be sqlite or zk, got {backend!r}")
        finally:
            shutil.rmtree(root, ignore_errors=True)
    return rows


# -- client memory per open handle ------------------------------------------------------------
def handles_curve(points: list[int], workdir: str | None = None, progress=print) -> list[dict]:
    """RSS of a fresh client process as it opens more write handles (one
    ledger each, kept open), measured in that process."""
    import multiprocessing

    # on use: measured processes import this module (module docstring)
    from appliance.bench.launcher import temporary_appliance

    points = _check_points(points)
    ctx = multiprocessing.get_context("spawn")
    with temporary_appliance(3, workdir) as (config, _):
        q = ctx.Queue()
        proc = ctx.Process(target=_handles_main, args=(str(config), points, q))
        proc.start()
        try:
            result = q.get(timeout=60 + points[-1] * 0.05)
        finally:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
                proc.join()
    if isinstance(result, str):
        raise RuntimeError(f"handles sweep failed: {result}")
    base = result[0]["rss_mb"]
    for row in result[1:]:
        row["added_mb"] = round(row["rss_mb"] - base, 3)
        row["kb_per_handle"] = round(row["added_mb"] * 1000 / row["handles"], 2)
        progress(f"  {row['handles']:>7,} open handles: RSS {row['rss_mb']:.1f} MB "
                 f"(+{row['added_mb']:.1f}), {row['kb_per_handle']} KB per handle")
    return result


def _handles_main(config: str, points: list[int], q) -> None:
    try:
        import gc

        # on use: measured processes import this module (module docstring)
        import appliance

        with appliance.connect(config) as bk:
            handles = [bk.create_ledger(3, 3, 2)]  # warm: code paths and caches loaded
            handles.pop().close()
            gc.collect()
            rows = [{"handles": 0, "rss_mb": _rss_mb(os.getpid())}]
            for n in points:
                while len(handles) < n:
                    handles.append(bk.create_ledger(3, 3, 2))
                gc.collect()
                rows.append({"handles": n, "rss_mb": round(_rss_mb(os.getpid()), 2)})
            for h in handles:
                h.close()
        q.put(rows)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        q.put(f"{type(exc).__name__}: {exc}")


# -- plots ----------------------------------------------------------------------------------------
def plot_curve(rows: list[dict], x: str, ys: list[str], path: str, title: str,
               by: str | None = None) -> None:
    """One PNG: each of ``ys`` against ``x`` (log x), one line per ``by``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(ys), figsize=(5 * len(ys), 4), squeeze=False)
    groups = sorted({r[by] for r in rows}) if by else [None]
    for ax, y in zip(axes[0], ys, strict=True):
        for g in groups:
            pts = [(r[x], r[y]) for r in rows if (by is None or r[by] == g) and r.get(y)]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=g or y)
        ax.set(xscale="log", yscale="log", xlabel=x, ylabel=y)
        ax.grid(True, which="both", alpha=0.3)
        if by:
            ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
