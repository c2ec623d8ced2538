"""Prometheus metrics of one bookie, read from its counters at scrape time.

The write path only increments plain integers (``BookieCounters``, the journal's figures); this
module turns them into metric families when ``/metrics`` is scraped, so a bookie nobody scrapes
pays nothing. Each bookie has its own :class:`~prometheus_client.CollectorRegistry`: several
bookies in one process (tests, ``standalone``) never mix their figures.

Names follow Prometheus conventions (``ledgerstore_`` prefix, ``_total`` counters, base units)
and map onto BookKeeper's bookie stats: ``ADD_ENTRY`` → ``ledgerstore_bookie_add_requests_total``,
``JOURNAL_FORCE_WRITE_BATCH_ENTRIES`` → ``ledgerstore_journal_group_records``, and so on (see
``docs/admin-http.md``). Latencies are histograms in seconds under our names and, besides, under
BookKeeper's documented names as BookKeeper exposes them (``bookkeeper_server_ADD_ENTRY_REQUEST``,
``bookie_journal_JOURNAL_SYNC``, ...: summaries in milliseconds, see :mod:`ledgerstore.latency`),
so a dashboard written for BookKeeper works on a ledgerstore bookie.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    SummaryMetricFamily,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from ledgerstore import __version__
from ledgerstore.api import StorageStats
from ledgerstore.bookie.disks import writable_dirs
from ledgerstore.bookie.journal import FLUSH_EMPTY_QUEUE, FLUSH_MAX_BYTES, FLUSH_MAX_WAIT
from ledgerstore.latency import (
    LatencyHistogram,
    bookkeeper_counter,
    bookkeeper_distribution,
    bookkeeper_gauge,
    histogram_families,
)
from ledgerstore.proto import speedups
from ledgerstore.recovery.stuck import REASONS

log = logging.getLogger(__name__)

#: the event-loop lag probe sleeps this long and counts how late it wakes up
LOOP_LAG_PROBE_S = 0.25
#: upper bounds of the journal group-size histogram, in records per fsync
GROUP_SIZE_BUCKETS: tuple[float, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)

#: refusal statuses of adds exported (at zero) before any happened
_USUAL_REJECTIONS = ("READ_ONLY", "FENCED", "UNAUTHORIZED", "TOO_MANY_REQUESTS", "IO_ERROR", "BAD_REQUEST")
_NOT_NAME = re.compile(r"[^a-zA-Z0-9_]")


class BookieCollector(Collector):
    """Reads one bookie's figures at scrape time and yields metric families."""

    def __init__(self, bookie: Any) -> None:
        self.bookie = bookie
        self.group_records = LatencyHistogram(GROUP_SIZE_BUCKETS)
        #: how late the loop ran a timer (see :meth:`BookieMetrics.attach`)
        self.loop_lag = LatencyHistogram()

    def observe_group(self, records: int) -> None:
        """The bookie's ``group_observer``: one call per durable journal group."""
        self.group_records.observe(records)

    def collect(self) -> Iterator[Metric]:
        stats = self._engine_stats()
        yield from self._bookie_metrics()
        yield from self._journal_metrics()
        yield from self._disk_metrics()
        yield from self._storage_metrics(stats)
        yield from self._transport_metrics()
        yield from self._latency_metrics()
        yield from self._bookkeeper_metrics(stats)
        yield from under_replication_metrics(self.bookie)

    # --- request counters ------------------------------------------------------------------------

    def _bookie_metrics(self) -> Iterator[Metric]:
        b = self.bookie
        c = b.counters
        st = b.status()
        info = InfoMetricFamily("ledgerstore_bookie", "Identity of this bookie.")
        info.add_metric([], {
            "bookie_id": b.bookie_id,
            "storage": str(b.config.storage),
            "listen": str(b.config.listen),
            "version": __version__,
        })
        yield info
        hot_path = GaugeMetricFamily("ledgerstore_hot_path_compiled",
                                     "1 when the compiled hot path runs, 0 on the pure-Python one (reason says why).",
                                     labels=["reason"])
        hot_path.add_metric([speedups.state.reason], 1 if speedups.state.compiled else 0)
        yield hot_path
        yield _counter("ledgerstore_bookie_add_requests", "Add requests received (accepted or not).", c.add_requests)
        yield _counter("ledgerstore_bookie_add_bytes", "Bytes of entries accepted by adds.", c.add_bytes)
        yield _counter("ledgerstore_bookie_read_requests", "Read and read-LAC requests received.", c.read_requests)
        yield _counter("ledgerstore_bookie_bad_requests", "Frames that could not be decoded or held a field out of range.",
                       c.bad_requests)
        yield _counter("ledgerstore_bookie_failed_requests",
                       "Requests whose handling failed unexpectedly (answered IO_ERROR; the connection carried on).",
                       c.failed_requests)
        yield _gauge("ledgerstore_bookie_long_poll_waiters", "Long-poll LAC requests waiting on this bookie.",
                     st.lac_waiters)
        yield _counter("ledgerstore_bookie_refused_long_polls",
                       "Long-poll LAC requests refused because a waiter limit was reached.", c.refused_long_polls)
        yield _counter("ledgerstore_bookie_ledger_lookups",
                       "Metadata look-ups of ledgers new to this bookie, before accepting their first master key.",
                       c.ledger_lookups)
        yield _counter("ledgerstore_bookie_unknown_ledger_claims",
                       "Ledgers new to this bookie that requests named but the metadata store does not hold.",
                       c.unknown_ledger_claims)
        yield _gauge("ledgerstore_bookie_requests_awaiting_metadata",
                     "Adds and fences waiting for the metadata look-up of a ledger new to this bookie.",
                     st.requests_awaiting_metadata)
        yield _gauge("ledgerstore_bookie_ledgers_in_limbo",
                     "Ledgers in limbo: this bookie lost data it may have held of them (reads it lacks answer UNKNOWN) "
                     "and has not repaired them from their other replicas yet.", st.ledgers_in_limbo)
        yield _counter("ledgerstore_bookie_limbo_ledgers_repaired",
                       "Limbo ledgers repaired from their other replicas and taken out of limbo since the bookie started.",
                       b.limbo.repaired_total)
        yield _counter("ledgerstore_bookie_limbo_entries_copied",
                       "Entries copied to this bookie from other replicas while repairing its limbo ledgers.",
                       b.repair.entries_copied)
        yield _counter("ledgerstore_bookie_limbo_repair_failures",
                       "Attempts at repairing a limbo ledger that failed (retried).", b.repair.failures)
        rejected = CounterMetricFamily(
            "ledgerstore_bookie_rejected_adds", "Adds refused, by status (READ_ONLY, FENCED, UNAUTHORIZED, ...).",
            labels=["reason"],
        )
        # dict() copies under the GIL in one C call: safe against the loop adding a new reason;
        # the usual reasons are exported at zero so that rate() over them works from the start
        for reason, n in sorted({**dict.fromkeys(_USUAL_REJECTIONS, 0), **dict(c.rejected_adds)}.items()):
            rejected.add_metric([reason], n)
        yield rejected
        yield _gauge("ledgerstore_bookie_ledgers", "Ledgers this bookie holds a master key for.", st.ledgers)
        yield _gauge("ledgerstore_bookie_read_only", "1 when the bookie refuses adds (disk full or forced).",
                     1 if st.read_only else 0)
        yield _gauge("ledgerstore_bookie_forced_read_only", "1 when read-only was forced by an administrator.",
                     1 if st.forced_read_only else 0)
        yield _gauge("ledgerstore_bookie_registered", "1 while the bookie's registration is live in metadata.",
                     1 if st.registered else 0)
        if st.started_at:
            yield _gauge("ledgerstore_bookie_start_time_seconds", "Unix time the bookie began serving.", st.started_at)
            yield _gauge("ledgerstore_bookie_uptime_seconds", "Seconds since the bookie began serving.",
                         max(0.0, time.time() - st.started_at))

    # --- journal ---------------------------------------------------------------------------------

    def _journal_metrics(self) -> Iterator[Metric]:
        j = self.bookie.journal
        if j is None:
            return
        yield _counter("ledgerstore_journal_groups", "Journal groups written (one write + fsync each).", j.groups)
        yield _counter("ledgerstore_journal_records", "Journal records written.", j.records)
        yield _counter("ledgerstore_journal_written_bytes", "Bytes written to the journal.", j.bytes_written)
        fsync = SummaryMetricFamily(
            "ledgerstore_journal_fsync_seconds",
            "Time spent in fdatasync of journal groups (count = fsyncs, sum = seconds).",
            count_value=j.groups if j.sync else 0, sum_value=j.fsync_seconds,
        )
        yield fsync
        yield _gauge("ledgerstore_journal_last_group_records", "Records in the most recent journal group.",
                     j.last_group_size)
        h = self.group_records
        yield HistogramMetricFamily(
            "ledgerstore_journal_group_records", "Records per durable journal group (group-commit batching).",
            buckets=h.buckets(), sum_value=h.sum,
        )
        yield _gauge("ledgerstore_journal_failed", "1 once a journal write failed (adds then get IO errors).",
                     1 if j.failed is not None else 0)
        mark = j.durable_mark()
        yield _gauge("ledgerstore_journal_durable_file_id", "Journal file holding the durable mark.", mark.file_id)
        yield _gauge("ledgerstore_journal_durable_offset_bytes", "Offset of the durable mark in its file.", mark.offset)

    # --- disks and storage -----------------------------------------------------------------------

    def _disk_metrics(self) -> Iterator[Metric]:
        b = self.bookie
        total, used, free = b.disk_usage()
        yield _gauge("ledgerstore_bookie_disk_total_bytes", "Size of the file systems holding ledger dirs.", total)
        yield _gauge("ledgerstore_bookie_disk_used_bytes", "Bytes used on those file systems.", used)
        yield _gauge("ledgerstore_bookie_disk_free_bytes", "Bytes free on those file systems.", free)
        yield _gauge("ledgerstore_bookie_disk_usage_ratio", "Used / total of those file systems.",
                     used / total if total else 0.0)

    def _engine_stats(self) -> StorageStats | None:
        """The engine's figures for this scrape (None without an engine, or when they failed)."""
        try:
            st: StorageStats = self.bookie.engine.stats()
        except Exception as exc:  # a scrape must not fail because one engine figure did
            log.warning("storage engine stats failed during a metrics scrape: %s", exc)
            return None
        return st

    def _storage_metrics(self, st: StorageStats | None) -> Iterator[Metric]:
        engine = self.bookie.engine
        if st is None:
            yield _gauge("ledgerstore_storage_stats_error", "1 when the engine's stats() failed on this scrape.", 1)
            return
        yield _gauge("ledgerstore_storage_ledgers", "Ledgers the storage engine holds.", st.ledgers)
        yield _gauge("ledgerstore_storage_disk_bytes", "Bytes the storage engine occupies on disk.", st.bytes_on_disk)
        yield _counter("ledgerstore_storage_entries_written", "Entries the engine stored.", st.entries_written)
        yield _counter("ledgerstore_storage_gc_runs", "Garbage-collection runs of the engine.", st.gc_runs)
        yield _counter("ledgerstore_storage_reclaimed_bytes", "Bytes reclaimed by GC and compaction.",
                       st.bytes_reclaimed)
        # Engine-specific figures: their meaning is the engine's, so they are exported as gauges
        # under one family with the figure's name as a label rather than guessed metric types.
        extra = GaugeMetricFamily("ledgerstore_storage_stat", "Engine-specific figures (see the engine's docs).",
                                  labels=["engine", "name"])
        name = str(getattr(engine, "name", "") or self.bookie.config.storage)
        for key, value in sorted(st.extra.items()):
            if isinstance(value, bool):
                value = int(value)
            if isinstance(value, int | float):
                extra.add_metric([name, _NOT_NAME.sub("_", str(key))], value)
        yield extra


    def _transport_metrics(self) -> Iterator[Metric]:
        server = self.bookie.server
        if server is None:
            return
        # The transport's own figures (connections, unfinished-frame bytes, shed and timed-out
        # connections, oversized frames, ...): their meaning is the transport's, as for storage.
        family = GaugeMetricFamily("ledgerstore_transport_stat",
                                   "Figures of the bookie's server transport (see docs/transports.md).",
                                   labels=["name"])
        for key, value in sorted(server.stats().items()):
            if isinstance(value, int | float) and not isinstance(value, bool):
                family.add_metric([_NOT_NAME.sub("_", str(key))], value)
        yield family


    # --- latencies -------------------------------------------------------------------------------

    def _latency_metrics(self) -> Iterator[Metric]:
        b = self.bookie
        c = b.counters
        yield from histogram_families(
            "ledgerstore_bookie_add_request_seconds",
            "Add requests (ADD, ADD_BATCH) from arrival to the answer sent once durable; one per request.",
            b.journal.request_seconds if b.journal is not None else LatencyHistogram(),
            ("bookkeeper_server_ADD_ENTRY_REQUEST", "bookkeeper_server_ADD_ENTRY"))
        yield from histogram_families(
            "ledgerstore_bookie_read_request_seconds",
            "Read requests (READ, READ_MULTI) from arrival to the answer sent; one per request.",
            c.read_request_seconds, ("bookkeeper_server_READ_ENTRY_REQUEST", "bookkeeper_server_READ_ENTRY"))
        j = b.journal
        if j is not None:
            for name, doc, h, bk in (
                    ("queue", "Journal appends from queued to taken by the writer thread.", j.queue_seconds,
                     "JOURNAL_QUEUE_LATENCY"),
                    ("add", "Journal appends from queued to durable (written and fsync'd).", j.add_seconds,
                     "JOURNAL_ADD_ENTRY"),
                    ("sync", "fdatasync of each journal group.", j.sync_seconds, "JOURNAL_SYNC"),
                    ("write", "Writing a journal group to its file, before the fsync.", j.write_seconds,
                     "JOURNAL_FLUSH_LATENCY"),
                    ("creation", "Creating, fsyncing and naming a new journal file.", j.creation_seconds,
                     "JOURNAL_CREATION_LATENCY")):
                yield from histogram_families(f"ledgerstore_journal_{name}_seconds", doc, h, (f"bookie_journal_{bk}",))
            yield bookkeeper_gauge("bookie_journal_JOURNAL_QUEUE_SIZE", "Appends waiting for the journal writer.",
                                   j.queue_size())
        yield from histogram_families(
            "ledgerstore_storage_flush_seconds", "Storage engine flush of each checkpoint (entry logs and index).",
            c.flush_seconds)
        yield from histogram_families(
            "ledgerstore_bookie_checkpoint_seconds", "Whole checkpoints: engine flush and LastLogMark written.",
            c.checkpoint_seconds)
        slowest = c.flush_seconds.recent_quantiles((1.0,))[0]
        yield bookkeeper_gauge("bookie_flush", "Slowest ledger storage flush of the last minute or so, ms "
                               "(BookKeeper's name; NaN without a flush).", slowest * 1000.0)
        yield from histogram_families(
            "ledgerstore_bookie_event_loop_lag_seconds",
            f"How late the bookie's event loop ran a {LOOP_LAG_PROBE_S}s timer: time the loop was busy.",
            self.loop_lag)
        # BookKeeper's server gauges and counters under its names
        st = b.status()
        yield bookkeeper_gauge("bookie_SERVER_STATUS", "1 writable, 0 read-only (BookKeeper's name).",
                               0 if st.read_only else 1)
        yield bookkeeper_counter("bookie_WRITE_BYTES", "Bytes of entries accepted by adds (BookKeeper's name).",
                                 c.add_bytes)
        yield bookkeeper_gauge("bookie_ledgers_count", "Ledgers this bookie holds (BookKeeper's name).",
                               st.ledgers)

    # --- BookKeeper's other names ----------------------------------------------------------------

    def _bookkeeper_metrics(self, st: StorageStats | None) -> Iterator[Metric]:
        """BookKeeper's bookie, journal, ledger-directory and garbage-collection figures under
        its names (``tests/fixtures/bookkeeper_metrics.json`` lists them with their sources).
        Where BookKeeper renamed a figure (``*_COUNT`` to ``*_TOTAL`` in 4.16) both names are
        exported, so dashboards of either release work."""
        b = self.bookie
        yield bookkeeper_counter("bookie_READ_BYTES", "Bytes of entries answered to reads (BookKeeper's name).",
                                 b.counters.read_bytes)
        dirs = list(b.ledger_dirs)
        yield bookkeeper_gauge("bookie_ledger_num_dirs", "Ledger directories configured (BookKeeper's name).", len(dirs))
        yield bookkeeper_gauge(
            "bookie_ledger_writable_dirs",
            "Ledger directories on a file system filled below disk_usage_threshold (BookKeeper's name).",
            writable_dirs(dirs, b.config.disk_usage_threshold))
        c = b.compaction
        for old, new, doc, value in (
                ("MAJOR_COMPACTION_COUNT", "MAJOR_COMPACTION_TOTAL", "Major compactions since start", c.major_count),
                ("MINOR_COMPACTION_COUNT", "MINOR_COMPACTION_TOTAL", "Minor compactions since start", c.minor_count),
                ("DELETED_LEDGER_COUNT", "DELETED_LEDGER_TOTAL", "Ledgers deleted by garbage collection since start",
                 c.deleted_ledgers)):
            for name in (old, new):
                yield bookkeeper_counter(f"bookie_{name}", f"{doc} (BookKeeper's name).", value)
        if st is not None:
            for name in ("ACTIVE_LEDGER_COUNT", "ACTIVE_LEDGER_TOTAL"):
                yield bookkeeper_gauge(f"bookie_{name}", "Ledgers the storage engine holds (BookKeeper's name).",
                                       st.ledgers)
            if st.entries is not None:
                yield bookkeeper_gauge("bookie_entries_count", "Entries the storage engine holds (BookKeeper's name).",
                                       st.entries)
            logs, log_bytes = st.extra.get("entry_logs"), st.extra.get("entry_log_bytes")
            if isinstance(logs, int) and isinstance(log_bytes, int):  # an engine made of entry logs
                for name in ("ACTIVE_ENTRY_LOG_COUNT", "ACTIVE_ENTRY_LOG_TOTAL"):
                    yield bookkeeper_gauge(f"bookie_{name}", "Entry log files (BookKeeper's name).", logs)
                yield bookkeeper_gauge("bookie_ENTRY_LOG_SPACE_BYTES", "Bytes of entry log files (BookKeeper's name).",
                                       log_bytes)
        j = b.journal
        if j is None:
            return
        yield bookkeeper_counter("bookie_journal_JOURNAL_WRITE_BYTES",
                                 "Bytes appended to the journal (BookKeeper's name).", j.bytes_written)
        yield bookkeeper_gauge("bookie_journal_JOURNAL_FORCE_WRITE_QUEUE_SIZE",
                               "Written journal groups waiting for their fsync: 0 or 1, the writer syncs each group "
                               "itself (BookKeeper's name).", j.syncing)
        yield bookkeeper_gauge("bookie_journal_JOURNAL_CB_QUEUE_SIZE",
                               "Durable journal appends not yet answered on the event loop (BookKeeper's name).",
                               j.callback_queue_size())
        for name in ("JOURNAL_FORCE_WRITE_GROUPING_COUNT", "JOURNAL_FORCE_WRITE_GROUPING_TOTAL"):
            yield bookkeeper_distribution(f"bookie_journal_{name}", "Appends (requests) made durable by one fsync",
                                          j.group_appends)
        yield bookkeeper_distribution("bookie_journal_JOURNAL_FORCE_WRITE_BATCH_ENTRIES",
                                      "Records made durable by one fsync", self.group_records)
        yield bookkeeper_distribution("bookie_journal_JOURNAL_FORCE_WRITE_BATCH_BYTES",
                                      "Bytes made durable by one fsync", j.group_bytes)
        for name, reason, doc in (
                ("JOURNAL_NUM_FLUSH_EMPTY_QUEUE", FLUSH_EMPTY_QUEUE, "the journal queue ran empty"),
                ("JOURNAL_NUM_FLUSH_MAX_WAIT", FLUSH_MAX_WAIT, "the group wait (max_group_wait_ms) ran out"),
                ("JOURNAL_NUM_FLUSH_MAX_OUTSTANDING_BYTES", FLUSH_MAX_BYTES, "the group reached max_group_bytes")):
            yield bookkeeper_counter(f"bookie_journal_{name}", f"Journal groups closed because {doc} "
                                     "(BookKeeper's name).", j.flushes[reason])


def under_replication_metrics(bookie: Any) -> Iterable[Metric]:
    """Metrics of auto-recovery in this bookie's process (``[bookie.autorecovery] enabled``).

    The replication worker's counters are always exported (zero without auto-recovery); the
    auditor's gauges only by the bookie currently elected auditor, as in BookKeeper, so that
    ``max()`` over bookies is the cluster's figure.
    """
    service = bookie.recovery
    worker = getattr(service, "worker", None)
    ws: dict[str, Any] = getattr(worker, "stats", None) or {}
    out: list[Metric] = [
        _counter("ledgerstore_replication_entries", "Entries re-replicated by this process's replication worker.",
                 ws.get("entries", 0)),
        _counter("ledgerstore_replication_bytes", "Bytes re-replicated by this process's replication worker.",
                 ws.get("bytes", 0)),
        _counter("ledgerstore_replication_ledgers", "Ledgers (fully or partly) re-replicated by this process.",
                 ws.get("ledgers", 0)),
        _counter("ledgerstore_replication_failures", "Re-replication attempts that failed in this process.",
                 ws.get("failures", 0)),
        bookkeeper_counter("replication_worker_NUM_ENTRIES_WRITTEN",
                           "Entries written by the replicator (BookKeeper's name).", ws.get("entries", 0)),
        bookkeeper_counter("replication_worker_NUM_FULL_OR_PARTIAL_LEDGERS_REPLICATED",
                           "Ledgers re-replicated (BookKeeper's name).", ws.get("ledgers", 0)),
        bookkeeper_counter("replication_worker_NUM_BYTES_WRITTEN",
                           "Bytes written by the replicator (BookKeeper's name).", ws.get("bytes", 0)),
    ]
    stuck = GaugeMetricFamily("ledgerstore_replication_stuck_ledgers", "Ledgers this process's replication worker "
                              "last failed to re-replicate, by reason (see listunderreplicated).", labels=["reason"])
    for reason in REASONS:
        stuck.add_metric([reason], sum(r == reason for r in getattr(worker, "stuck", {}).values()))
    out.append(stuck)
    # the service keeps its last Auditor object after losing an election: ask who is elected now
    auditor = getattr(service, "auditor", None) if getattr(service, "is_auditor", False) else None
    out.append(_gauge("ledgerstore_auditor_elected", "1 while this process runs the elected auditor.",
                      1 if auditor is not None else 0))
    if auditor is not None:
        st = auditor.stats
        under = st.get("under_replicated_ledgers", 0)
        lost = len(auditor.lost_since)
        out += [
            _gauge("ledgerstore_auditor_under_replicated_ledgers",
                   "Ledgers marked under-replicated in metadata, as of the auditor's last pass.", under),
            _gauge("ledgerstore_auditor_lost_bookies", "Bookies the auditor sees gone (marked once overdue).", lost),
            _gauge("ledgerstore_auditor_bookies_repairing_limbo",
                   "Bookies the last replicas check left to repair their limbo ledgers themselves.",
                   st.get("bookies_repairing", 0)),
            _counter("ledgerstore_auditor_ledgers_checked", "Ledgers checked by the auditor.",
                     st.get("ledgers_checked", 0)),
            _counter("ledgerstore_auditor_ledgers_marked", "Ledgers the auditor marked under-replicated.",
                     st.get("ledgers_marked", 0)),
            bookkeeper_gauge("auditor_NUM_UNDER_REPLICATED_LEDGERS",
                             "Under-replicated ledgers as of the auditor's last pass (BookKeeper's name).", under),
            bookkeeper_counter("auditor_NUM_LEDGERS_CHECKED", "Ledgers checked by the auditor (BookKeeper's name).",
                               st.get("ledgers_checked", 0)),
        ]
    return out


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


class BookieMetrics:
    """The per-bookie registry behind ``GET /metrics``."""

    def __init__(self, bookie: Any, *, process: bool = True) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.collector = BookieCollector(bookie)
        self.registry.register(self.collector)
        if process:
            # CPU, RSS, open fds of this process: one bookie per process in production
            ProcessCollector(registry=self.registry)
        self._lock = threading.Lock()
        self._lag_probe: asyncio.Task[None] | None = None

    def attach(self) -> None:
        """Start observing per-group journal figures on the bookie, and (on a running loop)
        probing the event loop's lag."""
        self.collector.bookie.group_observer = self.collector.observe_group
        with contextlib.suppress(RuntimeError):  # no running loop: no lag probe
            if self._lag_probe is None:
                self._lag_probe = asyncio.get_running_loop().create_task(self._probe_loop_lag(), name="loop-lag")

    def detach(self) -> None:
        """Stop observing (the bookie keeps running)."""
        if self.collector.bookie.group_observer == self.collector.observe_group:
            self.collector.bookie.group_observer = None
        if self._lag_probe is not None:
            self._lag_probe.cancel()
            self._lag_probe = None

    async def _probe_loop_lag(self) -> None:
        """A timer every ``LOOP_LAG_PROBE_S``: how much later than asked it fires is how long
        something held the loop (a slow handler, a blocking call)."""
        lag = self.collector.loop_lag
        while True:
            t0 = time.perf_counter()
            await asyncio.sleep(LOOP_LAG_PROBE_S)
            lag.observe(max(0.0, time.perf_counter() - t0 - LOOP_LAG_PROBE_S))

    def render(self) -> bytes:
        """The Prometheus text exposition of every family. May be called from a worker thread."""
        with self._lock:  # two concurrent scrapes would only duplicate work
            return generate_latest(self.registry)
