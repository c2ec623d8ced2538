"""Prometheus metrics of one bookie, read from its counters at scrape time.

The write path only increments plain integers (``BookieCounters``, the journal's figures); this
module turns them into metric families when ``/metrics`` is scraped, so a bookie nobody scrapes
pays nothing. Each bookie has its own :class:`~prometheus_client.CollectorRegistry`: several
bookies in one process (tests, ``standalone``) never mix their figures.

Names follow Prometheus conventions (``ledgerstore_`` prefix, ``_total`` counters, base units)
and map onto BookKeeper's bookie stats: ``ADD_ENTRY`` → ``ledgerstore_bookie_add_requests_total``,
``JOURNAL_FORCE_WRITE_GROUPING_COUNT`` → ``ledgerstore_journal_group_records``, and so on (see
``docs/admin-http.md``).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
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

log = logging.getLogger(__name__)

#: upper bounds of the journal group-size histogram, in records per fsync
GROUP_SIZE_BUCKETS: tuple[float, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)

_NOT_NAME = re.compile(r"[^a-zA-Z0-9_]")


class FixedHistogram:
    """A cumulative-bucket histogram updated from the event loop and read by the scraper.

    Unlike ``prometheus_client.Histogram`` it takes no lock: it is only ever updated from the
    bookie's event loop thread, and a scrape that reads it mid-update is off by one observation
    at most, which Prometheus rates absorb.
    """

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last slot is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        """Count one observation of ``value``."""
        i = 0
        for b in self.bounds:
            if value <= b:
                break
            i += 1
        self.counts[i] += 1
        self.sum += value

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative ``(le, count)`` pairs as the exposition format wants them."""
        out: list[tuple[str, float]] = []
        running = 0
        counts = list(self.counts)
        for bound, n in zip(self.bounds, counts, strict=False):
            running += n
            out.append((_fmt_bound(bound), running))
        running += counts[-1]
        out.append(("+Inf", running))
        return out


def _fmt_bound(b: float) -> str:
    return str(int(b)) if float(b).is_integer() else repr(b)


class BookieCollector(Collector):
    """Reads one bookie's figures at scrape time and yields metric families."""

    def __init__(self, bookie: Any) -> None:
        self.bookie = bookie
        self.group_records = FixedHistogram(GROUP_SIZE_BUCKETS)

    def observe_group(self, records: int) -> None:
        """The bookie's ``group_observer``: one call per durable journal group."""
        self.group_records.observe(records)

    def collect(self) -> Iterator[Metric]:
        yield from self._bookie_metrics()
        yield from self._journal_metrics()
        yield from self._disk_metrics()
        yield from self._storage_metrics()
        yield from self._transport_metrics()
        yield from under_replication_metrics(self.bookie)

    # --- request counters ------------------------------------------------------------------------

    def _bookie_metrics(self) -> Iterator[Metric]:
        b = self.bookie
        c = b.counters
        info = InfoMetricFamily("ledgerstore_bookie", "Identity of this bookie.")
        info.add_metric([], {
            "bookie_id": b.bookie_id,
            "storage": str(b.config.storage),
            "listen": str(b.config.listen),
            "version": __version__,
        })
        yield info
        yield _counter("ledgerstore_bookie_add_requests", "Add requests received (accepted or not).", c.add_requests)
        yield _counter("ledgerstore_bookie_add_bytes", "Bytes of entries accepted by adds.", c.add_bytes)
        yield _counter("ledgerstore_bookie_read_requests", "Read and read-LAC requests received.", c.read_requests)
        yield _counter("ledgerstore_bookie_bad_requests", "Frames that could not be decoded or held a field out of range.",
                       c.bad_requests)
        yield _counter("ledgerstore_bookie_failed_requests",
                       "Requests whose handling failed unexpectedly (answered IO_ERROR; the connection carried on).",
                       c.failed_requests)
        yield _gauge("ledgerstore_bookie_long_poll_waiters", "Long-poll LAC requests waiting on this bookie.",
                     b.lac_waiter_count)
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
                     b._awaiting_count)
        rejected = CounterMetricFamily(
            "ledgerstore_bookie_rejected_adds", "Adds refused, by status (READ_ONLY, FENCED, UNAUTHORIZED, ...).",
            labels=["reason"],
        )
        # dict() copies under the GIL in one C call: safe against the loop adding a new reason
        for reason, n in sorted(dict(c.rejected_adds).items()):
            rejected.add_metric([reason], n)
        yield rejected
        yield _gauge("ledgerstore_bookie_ledgers", "Ledgers this bookie holds a master key for.", len(b._master_keys))
        yield _gauge("ledgerstore_bookie_read_only", "1 when the bookie refuses adds (disk full or forced).",
                     1 if b.read_only else 0)
        yield _gauge("ledgerstore_bookie_forced_read_only", "1 when read-only was forced by an administrator.",
                     1 if b.forced_read_only else 0)
        yield _gauge("ledgerstore_bookie_registered", "1 while the bookie's registration is live in metadata.",
                     1 if b._registered_event.is_set() else 0)
        if b.started_at:
            yield _gauge("ledgerstore_bookie_start_time_seconds", "Unix time the bookie began serving.", b.started_at)
            yield _gauge("ledgerstore_bookie_uptime_seconds", "Seconds since the bookie began serving.",
                         max(0.0, time.time() - b.started_at))

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
        total, used, free = b._disk_usage()
        yield _gauge("ledgerstore_bookie_disk_total_bytes", "Size of the file systems holding ledger dirs.", total)
        yield _gauge("ledgerstore_bookie_disk_used_bytes", "Bytes used on those file systems.", used)
        yield _gauge("ledgerstore_bookie_disk_free_bytes", "Bytes free on those file systems.", free)
        yield _gauge("ledgerstore_bookie_disk_usage_ratio", "Used / total of those file systems.",
                     used / total if total else 0.0)

    def _storage_metrics(self) -> Iterator[Metric]:
        engine = self.bookie.engine
        if engine is None:
            return
        try:
            st = engine.stats()
        except Exception as exc:  # a scrape must not fail because one engine figure did
            log.warning("storage engine stats failed during a metrics scrape: %s", exc)
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
        server = getattr(self.bookie, "server", None)
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


def under_replication_metrics(bookie: Any) -> Iterable[Metric]:
    """Metrics of the auto-recovery state as seen from this bookie.

    Extension point: once auto-recovery records under-replicated ledgers in metadata, yield
    ``ledgerstore_under_replicated_ledgers`` (a gauge) here. Until then there is nothing to report.
    """
    return ()


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

    def attach(self) -> None:
        """Start observing per-group journal figures on the bookie."""
        self.collector.bookie.group_observer = self.collector.observe_group

    def detach(self) -> None:
        """Stop observing (the bookie keeps running)."""
        if self.collector.bookie.group_observer == self.collector.observe_group:
            self.collector.bookie.group_observer = None

    def render(self) -> bytes:
        """The Prometheus text exposition of every family. May be called from a worker thread."""
        with self._lock:  # two concurrent scrapes would only duplicate work
            return generate_latest(self.registry)
