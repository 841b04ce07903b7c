"""The results of ``bkctl bench write|read``: the document the parent makes
from its clients' raw timings (``summarise``; the figures are defined in
``appliance.bench.ledgers``) and the optional PNG (``plot``: latency over
time and a latency histogram, at most ``PLOT_POINTS_MAX`` points drawn).
matplotlib is imported only when a plot is asked for (an optional
dependency); ``check_plot_path`` refuses a bad ``--plot`` before the run.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

PLOT_POINTS_MAX = 200_000

RESULT_KEYS = ("mb_per_s", "p50_ms", "p95_ms", "p99_ms", "p999_ms",
               "client_cpu_s_per_1000_entries", "bookie_cpu_s_per_1000_entries",
               "bookie_peak_rss_mb")


def summarise(kind: str, options, results: list[dict], bookie_cpu_s: float,
              peak_rss_mb: float | None) -> dict:
    """The results document from the clients' raw timings (``options``: the
    run's ``ledgers.BenchOptions``)."""
    count = sum(r["count"] for r in results)
    wall_s = max(r["end"] for r in results) - min(r["start"] for r in results)
    latency_ms = np.concatenate([(r["done"] - r["sent"]) * 1000.0 for r in results])
    p50, p95, p99, p999 = (np.percentile(latency_ms, [50, 95, 99, 99.9]).tolist()
                           if len(latency_ms) else [None] * 4)
    per_1000 = 1000.0 / count if count else float("nan")
    rate_key = "adds_per_s" if kind == "write" else "reads_per_s"
    return {
        rate_key: count / wall_s, "mb_per_s": sum(r["bytes"] for r in results) / wall_s / 1e6,
        "p50_ms": p50, "p95_ms": p95, "p99_ms": p99, "p999_ms": p999,
        "client_cpu_s_per_1000_entries": sum(r["cpu_s"] for r in results) * per_1000,
        "bookie_cpu_s_per_1000_entries": bookie_cpu_s * per_1000,
        "bookie_peak_rss_mb": peak_rss_mb,
        # Python's youngest-generation GC threshold in the clients (700 unless raised)
        "client_gc_threshold0": min(r["gc_threshold0"] for r in results),
        # Python's thread switch interval in the clients (5,000 us unless raised)
        "client_switch_interval_us": min(r["switch_interval_us"] for r in results),
        # the client driver's hold of fresh adds per bookie ([client] add_messages_inflight)
        "client_add_messages_inflight": min(r["add_messages_inflight"] for r in results),
        "kind": kind, "entries": count, "wall_s": wall_s, "latency_samples": len(latency_ms),
        "latency_unit": "add" if kind == "write" else (
            "read_chunks() chunk" if options.read_chunks
            else f"read() call of {options.read_batch}"),
        "loop": "open" if options.rate > 0 else "closed",
        **{k: v for k, v in dataclasses.asdict(options).items() if k != "entries"},
    }


def check_plot_path(path: str) -> None:
    if not str(path).lower().endswith(".png"):
        raise ValueError(f"--plot needs a .png file name, got {path!r}")
    parent = Path(path).resolve().parent
    if not parent.is_dir():
        raise ValueError(f"--plot: folder {parent} does not exist")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ValueError("--plot needs matplotlib (pip install -e '.[dev]')") from None


def plot(kind: str, results: list[dict], path: str, doc: dict) -> None:
    """Latency over time and a latency histogram, side by side, in one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = min(r["start"] for r in results)
    when = np.concatenate([r["done"] - t0 for r in results])
    latency_ms = np.concatenate([(r["done"] - r["sent"]) * 1000.0 for r in results])
    step = max(1, len(when) // PLOT_POINTS_MAX)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    left.scatter(when[::step], latency_ms[::step], s=1, alpha=0.4)
    left.set(xlabel="time since start (s)", ylabel="latency (ms)", yscale="log",
             title=f"{kind} latency over time")
    positive = latency_ms[latency_ms > 0]
    if len(positive):
        bins = np.logspace(np.log10(positive.min()), np.log10(positive.max()) + 1e-9, 60)
        right.hist(positive, bins=bins)
    right.set(xscale="log", xlabel="latency (ms)", ylabel="count", title="latency histogram")
    for q in ("p50_ms", "p99_ms", "p999_ms"):
        if doc.get(q):
            right.axvline(doc[q], linestyle="--", color="grey")
            right.text(doc[q], right.get_ylim()[1] * 0.9, q[:-3], rotation=90, fontsize=8)
    rate_key = "adds_per_s" if kind == "write" else "reads_per_s"
    fig.suptitle(f"bkctl bench {kind}: {doc[rate_key]:,.0f}/s, {doc['size']} B, "
                 f"E{doc['ensemble']}/W{doc['write_quorum']}/A{doc['ack_quorum']}, "
                 f"{doc['clients']} client(s), {doc['loop']} loop")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
