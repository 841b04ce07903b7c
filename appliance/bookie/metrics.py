"""Prometheus metrics of one bookie process, with ``prometheus_client``.

``[[bookies]] metrics_address`` (``host:port``; port 0 picks a free one;
empty: off) makes the bookie serve ``/metrics`` over HTTP from its own
registry (never the library's global one).  The bound address is published
in the bookie's registry entry and INFO as ``metrics_url``; ``bkctl status
--json`` shows it.  Names carry the ``bookkeeper_`` prefix and their unit.

Cost on the request path: the wrappers below time each request with two
``perf_counter`` calls and count its entries by result code; everything
else is read from the counters the bookie already keeps, when Prometheus
scrapes (on the HTTP server's thread).

* adds / reads: ``bookkeeper_bookie_add_entries_total{code}`` and
  ``..._read_entries_total{code}`` (entries, by result: ``OK`` or the error
  name), ``bookkeeper_bookie_add_latency_seconds`` /
  ``..._read_latency_seconds`` (histograms with one observation per
  *entry*, of its request's time from arrival to reply: an add's reply
  waits for its journal fsync);
* the journal's group commits (write + fdatasync latency, records and bytes
  per group), entry-log writes, syncs and bytes, checkpoints;
* queue depth (replies waiting for their fsync, WAIT_LAC long polls),
  requests, replies, dropped replies, bad messages, reads refused for their
  key (``bookkeeper_bookie_reads_refused_total``, every read op; a refused
  READ / READ_BATCH / READ_PACKED is also counted in ``..._read_entries_total``
  under ``code="UnauthorizedError"``);
* disk (used share per directory, read-only), limbo ledgers, entry-log
  live and garbage bytes, GC and compaction (bytes given back);
* automatic re-replication, where it runs (every bookie reads the same
  marks from the metadata store): ledgers marked under-replicated, the age
  of the oldest mark, and which bookie is the auditor;
* process CPU and resident memory (``prometheus_client``'s process
  collector, ``bookkeeper_process_*``).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict

import numpy as np
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)

from appliance.config import parse_host_port
from appliance.errors import BKError
from appliance.protocol import limits
from appliance.protocol.errors import all_errors, code_of
from ipc.packed import (
    AddMultiReply,
    AddMultiRequest,
    AddPackedReply,
    AddPackedRequest,
    ReadPackedReply,
    ReadPackedRequest,
)
from ipc.replies import (
    AddBatchReply,
    AddReply,
    ErrorReply,
    ReadBatchReply,
    ReadReply,
)
from ipc.requests import (
    AddBatchRequest,
    AddRequest,
    ReadBatchRequest,
    ReadRequest,
)
from storage.histogram import Histogram

log = logging.getLogger(__name__)

_ADDS = (AddPackedRequest, AddMultiRequest, AddBatchRequest, AddRequest)
_READS = (ReadPackedRequest, ReadBatchRequest, ReadRequest)
_NAMES = {0: "OK", **{code: cls.__name__ for code, cls in all_errors().items()}}


def _entries(req) -> int:
    if isinstance(req, AddPackedRequest | AddMultiRequest):
        return len(req.entry_ids)
    if isinstance(req, AddBatchRequest):
        return len(req.items)
    return 1


def _codes(reply) -> dict[int, int] | None:
    """Entries of a reply by result code (None: not an add or read reply)."""
    if isinstance(reply, AddReply | ReadReply):
        return {0: 1}
    if isinstance(reply, AddPackedReply | AddMultiReply | ReadPackedReply):
        statuses = np.asarray(reply.statuses)
        if len(statuses) and not statuses.any():
            return {0: len(statuses)}
        codes, counts = np.unique(statuses, return_counts=True)
        return dict(zip(codes.tolist(), counts.tolist(), strict=True))
    if isinstance(reply, AddBatchReply | ReadBatchReply):
        out: dict[int, int] = {}
        for row in reply.rows:
            status = row[2] if isinstance(reply, AddBatchReply) else row[1]
            out[status] = out.get(status, 0) + 1
        return out
    return None


class BookieMetrics:
    """Counts and latencies of adds and reads; read by ``BookieCollector``."""

    def __init__(self):
        self.add_entries: dict[int, int] = {}
        self.read_entries: dict[int, int] = {}
        self.add_latency = Histogram()
        self.read_latency = Histogram()
        self._parked: OrderedDict[tuple[bytes, int], tuple[float, bool, int]] = OrderedDict()
        self.parked_dropped = 0

    def done(self, req, reply, error_code: int | None, started: float) -> None:
        is_add = isinstance(req, _ADDS)
        if not is_add and not isinstance(req, _READS):
            return
        self._record(is_add, reply, error_code, _entries(req), time.perf_counter() - started)

    def park(self, peer: bytes, req, started: float) -> None:
        is_add = isinstance(req, _ADDS)
        if not is_add and not isinstance(req, _READS):
            return
        self._parked[(peer, req.request_id)] = (started, is_add, _entries(req))
        if len(self._parked) > limits.BOOKIE_METRICS_PARKED_MAX:
            self._parked.popitem(last=False)
            self.parked_dropped += 1

    def released(self, peer: bytes, reply) -> None:
        parked = self._parked.pop((peer, reply.request_id), None) if self._parked else None
        if parked is not None:
            started, is_add, n = parked
            self._record(is_add, reply, None, n, time.perf_counter() - started)

    def _record(self, is_add: bool, reply, error_code: int | None, n: int,
                elapsed: float) -> None:
        if error_code is None and isinstance(reply, ErrorReply):
            error_code = reply.status
        codes = {error_code: n} if error_code is not None else _codes(reply)
        if not codes:
            return
        counts = self.add_entries if is_add else self.read_entries
        for code, count in codes.items():
            counts[code] = counts.get(code, 0) + count
        (self.add_latency if is_add else self.read_latency).observe(
            elapsed, sum(codes.values()))


class MetricsGate:
    """Wraps the request handler (outermost): times and counts each request."""

    def __init__(self, handler, metrics: BookieMetrics):
        self._handler = handler
        self.metrics = metrics

    def handle(self, peer: bytes, req):
        started = time.perf_counter()
        try:
            reply = self._handler.handle(peer, req)
        except BKError as exc:
            self.metrics.done(req, None, code_of(exc), started)
            raise
        if reply is None:
            self.metrics.park(peer, req, started)
        else:
            self.metrics.done(req, reply, None, started)
        return reply

    def __getattr__(self, name):
        return getattr(self._handler, name)


class ReplyObserver:
    """Stands for the server in the handler (``handler.attach``): replies
    sent later (once durable) end their request's timing."""

    def __init__(self, server, metrics: BookieMetrics):
        self._server = server
        self._metrics = metrics

    def send_reply(self, peer: bytes, reply) -> bool:
        self._metrics.released(peer, reply)
        return self._server.send_reply(peer, reply)

    def __getattr__(self, name):
        return getattr(self._server, name)


class BookieCollector:
    """Everything else, read when Prometheus scrapes."""

    def __init__(self, bookie_id: str, metrics: BookieMetrics, storage, handler, server,
                 monitor, gc_stats, autorecovery=lambda: None):
        self.bookie_id, self.metrics, self.storage = bookie_id, metrics, storage
        self.handler, self.server, self.monitor, self.gc_stats = handler, server, monitor, gc_stats
        self.autorecovery = autorecovery  # () -> AutoRecovery.observed, None when it is off

    def collect(self):
        """Every family, in the order /metrics lists them."""
        yield from self._entry_families()
        yield from self._latency_histograms()
        st = self.storage.stats()
        yield from self._journal_histograms()
        counters = self._storage_counters(st, self.gc_stats()) + self._server_counters()
        yield from _single_values(CounterMetricFamily, counters)
        yield from _single_values(GaugeMetricFamily, self._gauges(st))
        yield self._disk_used()
        yield from _single_values(GaugeMetricFamily, _autorecovery_gauges(self.autorecovery()))

    def _entry_families(self):
        """Entries added and read, by result code."""
        m = self.metrics
        for name, counts, what in (("add", m.add_entries, "Entries added"),
                                   ("read", m.read_entries, "Entries read")):
            fam = CounterMetricFamily(f"bookkeeper_bookie_{name}_entries", f"{what}, by "
                                      f"result code (OK or the error's name)", labels=["code"])
            for code, count in sorted(counts.items()):
                fam.add_metric([_NAMES.get(code, str(code))], count)
            yield fam

    def _latency_histograms(self):
        m = self.metrics
        yield _histogram("bookkeeper_bookie_add_latency_seconds", "Time from an add request's "
                         "arrival to its reply (after the fsync), one sample per entry",
                         m.add_latency)
        yield _histogram("bookkeeper_bookie_read_latency_seconds", "Time from a read request's "
                         "arrival to its reply, one sample per entry", m.read_latency)

    def _journal_histograms(self):
        journal = self.storage._journal
        yield _histogram("bookkeeper_journal_sync_latency_seconds", "Journal group commit: "
                         "write and fdatasync time", journal.sync_latency)
        yield _histogram("bookkeeper_journal_group_records", "Journal records per group "
                         "commit", journal.group_records)
        yield _histogram("bookkeeper_journal_group_bytes", "Journal bytes per group commit",
                         journal.group_bytes)

    @staticmethod
    def _storage_counters(st: dict, gc: dict) -> list[tuple]:
        """(name, doc, value) of the journal, entry logs, checkpoints,
        compaction and garbage collection counters."""
        return [
            ("bookkeeper_journal_syncs", "Journal group commits", st.get("journal_syncs")),
            ("bookkeeper_journal_written_bytes", "Bytes written to the journal",
             st.get("journal_bytes")),
            ("bookkeeper_entrylog_writes", "Entry-log buffer writes", st.get("entry_log_writes")),
            ("bookkeeper_entrylog_written_bytes", "Bytes written to entry logs",
             st.get("entry_log_bytes")),
            ("bookkeeper_entrylog_syncs", "Entry-log syncs (flushes)", st.get("entry_log_syncs")),
            ("bookkeeper_entrylog_created", "Entry logs created", st.get("entry_logs_created")),
            ("bookkeeper_checkpoints", "Index checkpoints", st.get("checkpoints")),
            ("bookkeeper_checkpoint_seconds", "Time spent in checkpoints",
             st.get("checkpoint_s_total")),
            ("bookkeeper_compaction_reclaimed_bytes", "Entry-log bytes given back by compaction",
             (st.get("compaction") or {}).get("bytes_reclaimed_total")),
            ("bookkeeper_compaction_runs", "Compaction runs", (st.get("compaction") or {})
             .get("runs")),
            ("bookkeeper_compaction_throttled_seconds", "Time compaction waited for "
             "storage.compaction_rate_bytes_per_s", (st.get("compaction") or {})
             .get("throttled_s_total")),
            ("bookkeeper_gc_reclaimed_bytes", "Entry-log bytes given back by garbage "
             "collection (bytes on record)", gc.get("bytes_freed")),
            ("bookkeeper_gc_ledgers_deleted", "Ledgers deleted locally by garbage collection",
             gc.get("ledgers_deleted")),
        ]

    def _server_counters(self) -> list[tuple]:
        """(name, doc, value) of the server loop's counters and refused reads."""
        server = self.server.counters if self.server is not None else {}
        counters = [(f"bookkeeper_bookie_{key}", f"Server loop: {key.replace('_', ' ')}",
                     server.get(key)) for key in ("requests", "replies", "replies_dropped",
                                                  "bad_messages", "handler_failures")]
        counters.append(("bookkeeper_bookie_reads_refused", "Reads refused for their key "
                         "(wrong, or none while server.reads_need_key), every read op",
                         self.handler.counters.get("reads_refused")))
        return counters

    def _gauges(self, st: dict) -> list[tuple]:
        """(name, doc, value) of the queues, read-only flag, ledgers and entry logs."""
        disk = st.get("disk") or {}
        return [
            ("bookkeeper_bookie_pending_replies", "Replies waiting for their fsync",
             len(self.handler._pending)),
            ("bookkeeper_bookie_long_polls", "WAIT_LAC long polls waiting",
             self.handler._long_polls),
            ("bookkeeper_bookie_read_only", "1 while the bookie refuses adds (disk full)",
             int(bool(self.monitor.read_only))),
            ("bookkeeper_bookie_limbo_ledgers", "Ledgers in BP-46 limbo",
             st.get("limbo_ledgers")),
            ("bookkeeper_compaction_suspended", "1 while automatic compaction is suspended "
             "(bkctl bookie compact --suspend)",
             _flag((st.get("compaction") or {}).get("suspended"))),
            ("bookkeeper_bookie_ledgers", "Ledgers stored", st.get("ledgers")),
            ("bookkeeper_entrylog_files", "Entry-log files", disk.get("entry_logs")),
            ("bookkeeper_entrylog_open", "Entry logs open for writing", disk.get("open_logs")),
            ("bookkeeper_entrylog_live_bytes", "Bytes of entries the index points at",
             disk.get("live_bytes")),
            ("bookkeeper_entrylog_garbage_bytes", "Entry-log bytes compaction or GC can give "
             "back", disk.get("garbage_bytes")),
        ]

    def _disk_used(self):
        used = GaugeMetricFamily("bookkeeper_disk_used_ratio", "Used share of the file "
                                 "system holding each directory", labels=["dir"])
        for directory, share in sorted(self.monitor.last_usage.items()):
            used.add_metric([directory], share)
        return used


def _autorecovery_gauges(seen: dict | None) -> list[tuple]:
    """(name, doc, value) of automatic re-replication; none when it is off."""
    if seen is None:
        return []
    since_ms = seen["oldest_since_ms"]
    oldest = 0.0 if since_ms is None else max(0.0, time.time() - since_ms / 1000.0)
    return [
        ("bookkeeper_autorecovery_underreplicated_ledgers", "Ledgers marked under-replicated "
         "in the metadata store", seen["underreplicated"]),
        ("bookkeeper_autorecovery_underreplicated_oldest_seconds", "Age of the oldest "
         "under-replication mark (0: none)", oldest),
        ("bookkeeper_autorecovery_auditor", "1 on the bookie that is the auditor now",
         int(seen["auditor"])),
    ]


def _flag(value):
    return None if value is None else int(bool(value))


def _single_values(family, rows):
    """One unlabelled family a (name, doc, value) row; rows without a value are left out."""
    for name, doc, value in rows:
        if value is not None:
            fam = family(name, doc)
            fam.add_metric([], value)
            yield fam


def _histogram(name: str, doc: str, hist: Histogram):
    buckets, total, _count = hist.snapshot()
    fam = HistogramMetricFamily(name, doc)
    fam.add_metric([], [("+Inf" if b == float("inf") else repr(float(b)), n)
                        for b, n in buckets], total)
    return fam


def start_metrics_server(address: str, collector) -> tuple[object, str]:
    """Serve ``collector`` (and the process collector) on ``address``;
    returns (the HTTP server, its URL).  ``server.shutdown()`` stops it."""
    from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server

    host, port = parse_host_port(address)
    registry = CollectorRegistry()
    registry.register(collector)
    ProcessCollector(namespace="bookkeeper", registry=registry)
    httpd, _thread = start_http_server(port, host, registry=registry)
    bound = httpd.server_address[1]
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{bound}/metrics"
    log.info("metrics on %s", url)
    return httpd, url
