"""Latency histograms cheap enough for hot paths, and their Prometheus exposition.

A :class:`LatencyHistogram` is a list of bucket counts and a sum, updated by one writer (the
bookie's event loop, the journal thread, the client's loop) without a lock, and read by the
scraper at scrape time: a scrape that reads it mid-update is off by one observation at most,
which Prometheus rates absorb. ``observe`` is one ``bisect`` in C and two additions, a fraction
of what ``prometheus_client.Histogram.observe`` (a lock per call) costs; callers still observe
once per request or batch, never per entry.

Every histogram is exposed twice by :func:`histogram_families`:

- under ledgerstore's name as a Prometheus histogram in seconds (``<name>_bucket``, ``_sum``,
  ``_count``), for ``histogram_quantile()``;
- under Apache BookKeeper's name the way BookKeeper's Prometheus provider exposes an
  OpStatsLogger: a summary in milliseconds with a ``success`` label and ``quantile`` samples
  (0.5 .. 1.0, estimated from the buckets over the last minute or so), ``_count`` and ``_sum``,
  so dashboards written for BookKeeper work unchanged.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.metrics_core import Metric

#: upper bounds of latency buckets in seconds: 0.1 ms .. 10 s
LATENCY_BUCKETS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)
#: the quantiles BookKeeper's Prometheus provider reports for an OpStatsLogger
BOOKKEEPER_QUANTILES: tuple[float, ...] = (0.5, 0.75, 0.95, 0.99, 0.999, 0.9999, 1.0)
#: the window BookKeeper-style quantiles are computed over starts again after this long
QUANTILE_WINDOW_S = 60.0


class LatencyHistogram:
    """Cumulative buckets (latency in seconds by default; any bounds, e.g. records per journal
    group) with one writer thread and lock-free reads."""

    __slots__ = ("bounds", "counts", "sum", "_window_counts", "_window_start")

    def __init__(self, bounds: Sequence[float] = LATENCY_BUCKETS) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last slot is +Inf
        self.sum = 0.0
        self._window_counts = list(self.counts)
        self._window_start = time.monotonic()

    def observe(self, seconds: float) -> None:
        """Count one observation."""
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.sum += seconds

    @property
    def count(self) -> int:
        """Observations so far."""
        return sum(self.counts)

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative ``(le, count)`` pairs as the exposition format wants them."""
        out: list[tuple[str, float]] = []
        running = 0
        counts = list(self.counts)  # one copy: the writer may add meanwhile
        for bound, n in zip(self.bounds, counts, strict=False):
            running += n
            out.append((repr(bound), running))
        out.append(("+Inf", running + counts[-1]))
        return out

    def recent_quantiles(self, qs: Sequence[float]) -> list[float]:
        """Estimated quantiles (seconds) of the observations of the current window (the last
        ``QUANTILE_WINDOW_S`` or so, like BookKeeper's rotating sketches); NaN when it is empty."""
        counts = list(self.counts)
        now = time.monotonic()
        delta = [c - w for c, w in zip(counts, self._window_counts, strict=True)]
        if now - self._window_start >= QUANTILE_WINDOW_S:
            self._window_counts, self._window_start = counts, now
        total = sum(delta)
        if total <= 0:
            return [math.nan] * len(qs)
        return [_quantile(q, self.bounds, delta, total) for q in qs]


def _quantile(q: float, bounds: tuple[float, ...], counts: list[int], total: int) -> float:
    """Linear interpolation inside the bucket holding rank ``q * total`` (as histogram_quantile)."""
    rank = q * total
    running = 0
    for i, n in enumerate(counts):
        if n and running + n >= rank:
            if i == len(bounds):  # the +Inf bucket: the highest finite bound is all we know
                return bounds[-1]
            lower = bounds[i - 1] if i else 0.0
            return lower + (bounds[i] - lower) * max(0.0, rank - running) / n
        running += n
    return bounds[-1]


def histogram_families(name: str, doc: str, h: LatencyHistogram, bookkeeper_names: Sequence[str] = ()
                       ) -> Iterator[Metric]:
    """``name`` as a histogram in seconds, then each of ``bookkeeper_names`` as BookKeeper exposes
    an OpStatsLogger (a summary in milliseconds, ``success="true"``)."""
    yield HistogramMetricFamily(name, doc, buckets=h.buckets(), sum_value=h.sum)
    if not bookkeeper_names:
        return
    count, total = h.count, h.sum
    quantiles = h.recent_quantiles(BOOKKEEPER_QUANTILES)
    for bk in bookkeeper_names:
        yield bookkeeper_summary(bk, f"{doc} (BookKeeper's name; milliseconds)", count, total * 1000.0,
                                 [(q, v * 1000.0) for q, v in zip(BOOKKEEPER_QUANTILES, quantiles, strict=True)])


def bookkeeper_distribution(name: str, doc: str, h: LatencyHistogram) -> Metric:
    """A histogram of counts or sizes (not times) as BookKeeper exposes such an OpStatsLogger:
    a summary of the values themselves, unscaled, ``success="true"``."""
    quantiles = h.recent_quantiles(BOOKKEEPER_QUANTILES)
    return bookkeeper_summary(name, f"{doc} (BookKeeper's name)", h.count, h.sum,
                              list(zip(BOOKKEEPER_QUANTILES, quantiles, strict=True)))


def bookkeeper_summary(name: str, doc: str, count: float, sum_ms: float,
                       quantiles: Sequence[tuple[float, float]]) -> Metric:
    """A summary shaped like one of BookKeeper's OpStatsLoggers."""
    m = Metric(name, doc, "summary")
    labels = {"success": "true"}
    for q, v in quantiles:
        m.add_sample(name, {**labels, "quantile": str(q)}, v)
    m.add_sample(name + "_count", labels, count)
    m.add_sample(name + "_sum", labels, sum_ms)
    return m


def bookkeeper_counter(name: str, doc: str, value: float) -> Metric:
    """A counter under BookKeeper's exact name (no ``_total`` suffix, as its provider exposes them)."""
    m = Metric(name, doc, "counter")
    m.add_sample(name, {}, value)
    return m


def bookkeeper_gauge(name: str, doc: str, value: float) -> Metric:
    """A gauge under BookKeeper's name."""
    m = Metric(name, doc, "gauge")
    m.add_sample(name, {}, value)
    return m
