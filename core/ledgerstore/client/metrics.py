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
and ``bookkeeper_client_NUM_ENSEMBLE_CHANGE``. Ledger operations, one observation each when
they succeed (:func:`timed`): ``ledgerstore_client_{create,open,delete,recover}_seconds``,
BookKeeper's ``bookkeeper_client_LEDGER_CREATE`` / ``_LEDGER_OPEN`` / ``_LEDGER_DELETE`` /
``_LEDGER_RECOVER``; and ``bookkeeper_client_SPECULATIVE_READ_COUNT`` (reads sent to a further
replica because the first was slow). The health check (:mod:`.health`) exposes
``ledgerstore_client_quarantined_bookies`` (gauge: bookies in quarantine now, over every client) and
``ledgerstore_client_bookie_quarantines_total`` with BookKeeper's ``bookkeeper_client_BOOKIE_QUARANTINE``
(counter: quarantines started).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, ParamSpec, TypeVar

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
        #: ledger operations that succeeded, from call to return (BookKeeper's LEDGER_CREATE, ...)
        self.create_seconds = LatencyHistogram()
        self.open_seconds = LatencyHistogram()
        self.delete_seconds = LatencyHistogram()
        #: fence, tail recovery and close of a ledger opened with recovery (LEDGER_RECOVER)
        self.recover_seconds = LatencyHistogram()
        #: read requests sent to a further replica because the earlier ones were slow
        self.speculative_reads = 0

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
        for op, h in (("create", self.create_seconds), ("open", self.open_seconds),
                      ("delete", self.delete_seconds), ("recover", self.recover_seconds)):
            yield from histogram_families(
                f"ledgerstore_client_{op}_seconds", f"Ledger {op} operations that succeeded, call to return.",
                h, (f"bookkeeper_client_LEDGER_{op.upper()}",))
        yield bookkeeper_counter("bookkeeper_client_SPECULATIVE_READ_COUNT",
                                 "Reads sent to a further replica because earlier ones were slow (BookKeeper's name).",
                                 self.speculative_reads)

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

P = ParamSpec("P")
R = TypeVar("R")


def timed(histogram: LatencyHistogram
          ) -> Callable[[Callable[P, Coroutine[Any, Any, R]]], Callable[P, Coroutine[Any, Any, R]]]:
    """Decorate a coroutine function so that each call that returns is observed in
    ``histogram`` (BookKeeper's OpStats count successes; failures are not timed)."""
    def wrap(fn: Callable[P, Coroutine[Any, Any, R]]) -> Callable[P, Coroutine[Any, Any, R]]:
        @functools.wraps(fn)
        async def run(*args: P.args, **kwargs: P.kwargs) -> R:
            started = time.perf_counter()
            result = await fn(*args, **kwargs)
            histogram.observe(time.perf_counter() - started)
            return result
        return run
    return wrap
