"""Prometheus metrics of one log server, with ``prometheus_client``.

``[log] metrics_address`` (``host:port``; port 0 picks a free one; empty:
off) makes each log server serve ``/metrics`` over HTTP from its own
registry.  The bound URL is in the server's registration, its PING answer
and ``bkctl status --json`` (``metrics_url``).

Everything but the latency histogram is read from the counters the server
already keeps, when Prometheus scrapes (on the HTTP server's thread):

* ``bookkeeper_logserver_requests_total`` (every request),
  ``..._redirects_total`` (answered "not owner"),
  ``..._records_total`` (records written), ``..._duplicates_total``
  (retried records answered from the duplicate filter), ``..._entries_total``
  (ledger entries the owned logs' writers sent: a group commit each),
  ``..._takeovers_total`` (logs taken over);
* ``bookkeeper_logserver_owned_logs`` and ``..._producers`` (producers the
  owned logs' filters track), gauges;
* ``bookkeeper_logserver_write_latency_seconds``: one observation per write
  request, from its arrival to its answer (its records durable);
* process CPU and memory (``bookkeeper_process_*``).
"""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, Histogram, ProcessCollector, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from appliance.config import parse_host_port
from appliance.logservice.readcache import read_metrics

log = logging.getLogger("appliance.logservice")

COUNTERS = {"requests": "Requests received.", "redirects": "Requests answered 'not owner'.",
            "records": "Records written.", "duplicates": "Retried records answered from the "
            "duplicate filter, not written again.", "entries": "Ledger entries sent by the "
            "owned logs' writers (one group commit each).", "takeovers": "Logs taken over."}


class LogServerCollector:
    def __init__(self, server):
        self.server = server

    def collect(self):
        server = self.server
        totals = server.totals()
        for name, text in COUNTERS.items():
            yield CounterMetricFamily(f"bookkeeper_logserver_{name}", text,
                                      value=totals.get(name, 0))
        owned = [o for o in list(server.owned.values()) if o.state == "open"]
        yield GaugeMetricFamily("bookkeeper_logserver_owned_logs", "Logs this server owns.",
                                value=len(owned))
        yield GaugeMetricFamily("bookkeeper_logserver_producers",
                                "Producers the owned logs' duplicate filters track.",
                                value=sum(len(o.table) for o in owned))
        yield from read_metrics(server.reads)


def start_metrics(address: str, server) -> tuple[object, str, Histogram]:
    """Serve the server's metrics on ``address``: (HTTP server, URL, the
    write latency histogram to observe)."""
    host, port = parse_host_port(address)
    registry = CollectorRegistry()
    registry.register(LogServerCollector(server))
    ProcessCollector(namespace="bookkeeper", registry=registry)
    latency = Histogram("bookkeeper_logserver_write_latency_seconds",
                        "A write request's time from arrival to answer.", registry=registry,
                        buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25,
                                 0.5, 1.0, 2.5))
    httpd, _thread = start_http_server(port, host, registry=registry)
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{httpd.server_address[1]}/metrics"
    log.info("metrics on %s", url)
    return httpd, url, latency
