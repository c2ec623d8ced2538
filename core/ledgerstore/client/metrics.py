"""Client-side metrics of this process: add and read latency, ensemble changes, bookie quarantines.

Ledger handles update :data:`CLIENT_METRICS` once per acknowledged add future (one per
``append``, one per ``append_many`` batch) and once per batch read, never per entry. Figures are
process-wide, as BookKeeper's client stats are per client's stats provider: an application
exposes them by registering :data:`CLIENT_METRICS` with its Prometheus registry, e.g.::

    from prometheus_client import REGISTRY, start_http_server
    from ledgerstore.client.metrics import CLIENT_METRICS

    CLIENT_METRICS.register(REGISTRY)
    start_http_server(9100)

Names: ``ledgerstore_client_add_seconds`` / ``ledgerstore_client_read_seconds`` (histograms,
seconds) and ``ledgerstore_client_ensemble_changes_total``; and BookKeeper's
``bookkeeper_client_ADD_ENTRY`` / ``bookkeeper_client_READ_ENTRY`` (summaries, milliseconds)
and ``bookkeeper_client_NUM_ENSEMBLE_CHANGE``. The health check (:mod:`.health`) exposes
``ledgerstore_client_quarantined_bookies`` (gauge: bookies in quarantine now, over every client) and
``ledgerstore_client_bookie_quarantines_total`` with BookKeeper's ``bookkeeper_client_BOOKIE_QUARANTINE``
(counter: quarantines started).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from ledgerstore.latency import LatencyHistogram, bookkeeper_counter, histogram_families


class ClientMetrics(Collector):
    """The figures, and a collector that turns them into metric families at scrape time."""

    def __init__(self) -> None:
        #: from ``append``/``append_many`` to the future resolved (Qa acks, in entry order)
        self.add_seconds = LatencyHistogram()
        #: one batch read (``read``, ``iter_entries``): request sent to every entry verified
        self.read_seconds = LatencyHistogram()
        #: ensemble changes committed to metadata by this process's writers
        self.ensemble_changes = 0
        #: quarantines started by the health checks of this process's clients
        self.bookie_quarantines = 0
        #: bookies each client holds in quarantine now, by client (summed when scraped)
        self.quarantined_bookies: dict[int, int] = {}

    def collect(self) -> Iterator[Metric]:
        yield from histogram_families(
            "ledgerstore_client_add_seconds",
            "Client adds from append to acknowledgement; one per append or append_many batch.",
            self.add_seconds, ("bookkeeper_client_ADD_ENTRY",))
        yield from histogram_families(
            "ledgerstore_client_read_seconds", "Client batch reads from request to verified entries.",
            self.read_seconds, ("bookkeeper_client_READ_ENTRY",))
        yield CounterMetricFamily("ledgerstore_client_ensemble_changes",
                                  "Ensemble changes committed by this process's writers.", value=self.ensemble_changes)
        yield bookkeeper_counter("bookkeeper_client_NUM_ENSEMBLE_CHANGE",
                                 "Ensemble changes (BookKeeper's name).", self.ensemble_changes)
        yield GaugeMetricFamily("ledgerstore_client_quarantined_bookies",
                                "Bookies the clients' health checks hold in quarantine now.",
                                value=sum(self.quarantined_bookies.values()))
        yield CounterMetricFamily("ledgerstore_client_bookie_quarantines",
                                  "Bookies quarantined by the clients' health checks.", value=self.bookie_quarantines)
        yield bookkeeper_counter("bookkeeper_client_BOOKIE_QUARANTINE",
                                 "Bookies quarantined (BookKeeper's name).", self.bookie_quarantines)

    def register(self, registry: CollectorRegistry) -> None:
        """Expose these figures through ``registry`` (an application's, or prometheus_client's REGISTRY)."""
        registry.register(self)

    def render(self) -> bytes:
        """The Prometheus text exposition of these figures alone."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        return generate_latest(registry)


#: the figures of every client in this process
CLIENT_METRICS = ClientMetrics()
