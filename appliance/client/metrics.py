"""The client binding's Prometheus metrics, in the user's process, with the
same library as the bookies (``prometheus_client``).  Registered only when
asked: ``appliance.connect(target, metrics=True)`` (the library's default
registry, served by whatever the application already exposes, e.g.
``prometheus_client.start_http_server``) or ``metrics=<CollectorRegistry>``;
unregistered when the client closes.

* ``bookkeeper_client_add_latency_seconds`` (histogram): each add from
  ``add``/``add_async``/``add_many_async`` until its future completes;
* ``bookkeeper_client_adds_total{result}``: adds completed, ``ok`` or
  ``failed``;
* ``bookkeeper_client_ensemble_changes_total``: bookies replaced in the
  ensembles of this client's writers;
* ``bookkeeper_client_recoveries_total``: ledgers this client fenced and
  recovered (``open_ledger`` of a ledger that was not closed);
* ``bookkeeper_client_inflight_adds`` / ``..._inflight_bytes`` (gauges):
  adds and payload bytes waiting for their acknowledgement;
* ``bookkeeper_client_open_write_handles`` (gauge);
* ``bookkeeper_client_speculative_reads_total``: reads also sent to another
  replica because the first had not answered in
  ``speculative_read_timeout_ms``;
* ``bookkeeper_client_bookie_quarantines_total``: bookies this client put in
  quarantine; ``bookkeeper_client_quarantined_bookies`` (gauge): how many
  are in quarantine now.

Off (the default), the client pays nothing: no timestamp is taken.
"""

from __future__ import annotations

import threading
import time
import weakref

from storage.histogram import Histogram


class ClientMetrics:
    """Counters the handles update; a ``prometheus_client`` collector."""

    def __init__(self, health=None):
        self.health = health  # the client's BookieHealth (None: no read metrics)
        self.add_latency = Histogram()
        self.adds = {"ok": 0, "failed": 0}
        self.recoveries = 0
        self._closed_changes = 0
        self._handles: weakref.WeakSet = weakref.WeakSet()
        self._lock = threading.Lock()
        self.registry = None

    # -- updated by the client ----------------------------------------------------
    def track(self, handle) -> None:
        with self._lock:
            self._handles.add(handle)

    def untrack(self, handle) -> None:
        with self._lock:
            if handle in self._handles:
                self._handles.discard(handle)
                self._closed_changes += handle._writer.ensemble_changes

    def settled(self, futures, failed: bool) -> None:
        """Driver thread: adds completed (``futures`` carry ``t0``)."""
        now = time.perf_counter()
        hist = self.add_latency
        for fut in futures:
            t0 = getattr(fut, "t0", None)
            if t0 is not None:
                hist.observe(now - t0)
        self.adds["failed" if failed else "ok"] += len(futures)

    # -- read by Prometheus ---------------------------------------------------------
    def collect(self):
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        buckets, total, _n = self.add_latency.snapshot()
        hist = HistogramMetricFamily("bookkeeper_client_add_latency_seconds",
                                     "Add latency seen by the writer: from the call to the "
                                     "future's completion")
        hist.add_metric([], [("+Inf" if b == float("inf") else repr(float(b)), n)
                             for b, n in buckets], total)
        yield hist
        adds = CounterMetricFamily("bookkeeper_client_adds", "Adds completed, by result",
                                   labels=["result"])
        for result, count in self.adds.items():
            adds.add_metric([result], count)
        yield adds
        with self._lock:
            handles = list(self._handles)
            changes = self._closed_changes + sum(h._writer.ensemble_changes for h in handles)
        for name, doc, value, family in (
                ("bookkeeper_client_ensemble_changes", "Bookies replaced in the ensembles of "
                 "this client's writers", changes, CounterMetricFamily),
                ("bookkeeper_client_recoveries", "Ledgers fenced and recovered by this client",
                 self.recoveries, CounterMetricFamily),
                ("bookkeeper_client_inflight_adds", "Adds waiting for their acknowledgement",
                 sum(h._inflight for h in handles), GaugeMetricFamily),
                ("bookkeeper_client_inflight_bytes", "Payload bytes waiting for their "
                 "acknowledgement", sum(h._inflight_bytes for h in handles), GaugeMetricFamily),
                ("bookkeeper_client_open_write_handles", "Write handles open",
                 len(handles), GaugeMetricFamily)):
            fam = family(name, doc)
            fam.add_metric([], value)
            yield fam
        yield from self._read_health()

    def _read_health(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        health = self.health
        if health is None:
            return
        now_ms = int(time.monotonic() * 1000)  # the driver's clock
        for name, doc, value, family in (
                ("bookkeeper_client_speculative_reads", "Reads also sent to another replica "
                 "after speculative_read_timeout_ms without an answer",
                 health.speculative_reads, CounterMetricFamily),
                ("bookkeeper_client_bookie_quarantines", "Bookies this client put in "
                 "quarantine", health.quarantines, CounterMetricFamily),
                ("bookkeeper_client_quarantined_bookies", "Bookies in quarantine now",
                 health.quarantined_count(now_ms), GaugeMetricFamily)):
            fam = family(name, doc)
            fam.add_metric([], value)
            yield fam

    def register(self, registry=None) -> None:
        from prometheus_client import REGISTRY

        self.registry = registry if registry is not None else REGISTRY
        self.registry.register(self)

    def unregister(self) -> None:
        if self.registry is not None:
            self.registry.unregister(self)
            self.registry = None
