"""Latency recording in an HDR histogram (microsecond resolution, 3 significant digits)."""

from __future__ import annotations

from hdrh.histogram import HdrHistogram

#: the percentiles every report carries, by name
PERCENTILES: dict[str, float] = {"p50": 50.0, "p95": 95.0, "p99": 99.0, "p99.9": 99.9}
_LOWEST_US, _HIGHEST_US = 1, 600_000_000  # 1 µs .. 10 min: any add that completes at all


class LatencyRecorder:
    """Records latencies given in seconds; reports them in milliseconds."""

    def __init__(self) -> None:
        self.hist = HdrHistogram(_LOWEST_US, _HIGHEST_US, 3)

    def record(self, seconds: float) -> None:
        """Count one latency of ``seconds`` (clamped into the histogram's range)."""
        us = int(seconds * 1_000_000)
        self.hist.record_value(min(max(us, _LOWEST_US), _HIGHEST_US))

    @property
    def count(self) -> int:
        return int(self.hist.get_total_count())

    def summary_ms(self) -> dict[str, float]:
        """min, mean, p50, p95, p99, p99.9 and max in milliseconds (zeros when empty)."""
        h = self.hist
        if self.count == 0:
            return {k: 0.0 for k in ("min", "mean", *PERCENTILES, "max")}
        out = {"min": h.get_min_value() / 1000.0, "mean": round(h.get_mean_value() / 1000.0, 3)}
        for name, p in PERCENTILES.items():
            out[name] = h.get_value_at_percentile(p) / 1000.0
        out["max"] = h.get_max_value() / 1000.0
        return out

    def distribution_ms(self, ticks_per_half_distance: int = 5) -> list[tuple[float, float]]:
        """(percentile, latency ms) points of the whole distribution, for plots."""
        if self.count == 0:
            return []
        return [(it.percentile_level_iterated_to, it.value_iterated_to / 1000.0)
                for it in self.hist.get_percentile_iterator(ticks_per_half_distance)]
