"""Prometheus metrics of one log server, with ``prometheus_client``.

``[log] metrics_address`` (``host:port``; port 0 picks a free one; empty:
off) makes each log server serve ``/metrics`` over HTTP from its own
registry.  The bound URL is in the server's registration, its PING answer
and ``bkctl status --json`` (``metrics_url``).

Everything is copied on the server's loop thread, which alone writes the
counters, the owned logs and the histogram, when Prometheus scrapes: the
HTTP server's thread asks for a snapshot (``LogServer.metrics_snapshot``)
and waits for it:

* ``bookkeeper_logserver_requests_total`` (every request),
  ``..._redirects_total`` (answered "not owner"),
  ``..._records_total`` (records written), ``..._duplicates_total``
  (retried records answered from the duplicate filter), ``..._entries_total``
  (ledger entries the owned logs' writers sent: a group commit each),
  ``..._takeovers_total`` (logs taken over), ``..._control_entries_total``
  (control entries sent), ``..._busy_total`` (write
  requests answered "retry": their log's ledger had no room);
* ``bookkeeper_logserver_owned_logs`` and ``..._producers`` (producers the
  owned logs' filters track), gauges;
* ``bookkeeper_logserver_write_latency_seconds``: one observation per write
  request, from its arrival to its answer (its records durable), observed
  on the loop thread (``Latency``, no lock: prometheus_client's
  ``Histogram`` took two per observation);
* process CPU and memory (``bookkeeper_process_*``).
"""

from __future__ import annotations

import bisect
import logging

from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from appliance.config import parse_host_port
from appliance.logservice.readcache import read_metrics

log = logging.getLogger("appliance.logservice")

COUNTERS = {"requests": "Requests received.", "redirects": "Requests answered 'not owner'.",
            "records": "Records written.", "duplicates": "Retried records answered from the "
            "duplicate filter, not written again.", "entries": "Ledger entries sent by the "
            "owned logs' writers (one group commit each).", "takeovers": "Logs taken over.",
            "control_entries": "Control entries sent (a log idle after an acknowledged "
            "entry: readers of the bookies learn its last records).",
            "mux_requests": "Multi-log messages received (their sections count in requests).",
            "mux_sections": "Requests received as sections of multi-log messages.",
            "mux_replies": "Multi-log reply messages sent.",
            "busy": "Write requests answered 'retry' because their log's ledger had as many "
            "adds in flight as it may take (back-pressure; the producer resends)."}


LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Latency:
    """The write latency histogram: ``observe(seconds)`` is a bisect and two
    additions (no lock: see the module docstring)."""

    def __init__(self, buckets=LATENCY_BUCKETS):
        self.bounds = tuple(buckets)
        self.counts = [0] * (len(self.bounds) + 1)  # the last: above every bound
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, seconds)] += 1
        self.sum += seconds

    def family(self, name: str, text: str, copied: tuple) -> HistogramMetricFamily:
        """The histogram of ``copied`` (counts, sum: copied on the thread
        that observes)."""
        counts, total = copied
        cumulative, running = [], 0
        for bound, count in zip((*map(str, self.bounds), "+Inf"), counts, strict=True):
            running += count
            cumulative.append((bound, running))
        return HistogramMetricFamily(name, text, buckets=cumulative, sum_value=total)


class LogServerCollector:
    def __init__(self, server, latency: Latency):
        self.server = server
        self.latency = latency

    def collect(self):
        snap = self.server.metrics_snapshot()
        if snap is None:  # the loop did not answer (stopping): nothing to tell
            return
        totals = snap["totals"]
        for name, text in COUNTERS.items():
            yield CounterMetricFamily(f"bookkeeper_logserver_{name}", text,
                                      value=totals.get(name, 0))
        yield GaugeMetricFamily("bookkeeper_logserver_owned_logs", "Logs this server owns.",
                                value=snap["owned_logs"])
        yield GaugeMetricFamily("bookkeeper_logserver_producers",
                                "Producers the owned logs' duplicate filters track.",
                                value=snap["producers"])
        if snap["latency"] is not None:
            yield self.latency.family("bookkeeper_logserver_write_latency_seconds",
                                      "A write request's time from arrival to answer.",
                                      snap["latency"])
        yield from read_metrics(self.server.reads)


def start_metrics(address: str, server) -> tuple[object, str, Latency]:
    """Serve the server's metrics on ``address``: (HTTP server, URL, the
    write latency histogram to observe)."""
    host, port = parse_host_port(address)
    registry = CollectorRegistry()
    latency = Latency()
    registry.register(LogServerCollector(server, latency))
    ProcessCollector(namespace="bookkeeper", registry=registry)
    httpd, _thread = start_http_server(port, host, registry=registry)
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{httpd.server_address[1]}/metrics"
    log.info("metrics on %s", url)
    return httpd, url, latency
