"""Latency recording in an HDR histogram (microsecond resolution, 3 significant digits)."""

from __future__ import annotations

from array import array
from collections.abc import Iterable

from hdrh.histogram import HdrHistogram

#: the percentiles every report carries, by name
PERCENTILES: dict[str, float] = {"p50": 50.0, "p95": 95.0, "p99": 99.0, "p99.9": 99.9}
_LOWEST_US, _HIGHEST_US = 1, 600_000_000  # 1 µs .. 10 min: any add that completes at all


class LatencyRecorder:
    """Records latencies given in seconds; reports them in milliseconds."""

    #: latencies kept raw before they are folded into the histogram (8 bytes each)
    BUFFER = 20_000_000

    def __init__(self) -> None:
        self._hist = HdrHistogram(_LOWEST_US, _HIGHEST_US, 3)
        # The histogram is pure Python: recording into it per add would cost the measured client
        # more than the add itself. Latencies are buffered and folded in when a figure is asked for.
        self._raw = array("d")

    def record(self, seconds: float) -> None:
        """Count one latency of ``seconds`` (clamped into the histogram's range)."""
        self._raw.append(seconds)
        if len(self._raw) >= self.BUFFER:
            self._fold()

    def record_many(self, seconds: Iterable[float]) -> None:
        """Count each latency of ``seconds``."""
        self._raw.extend(seconds)
        if len(self._raw) >= self.BUFFER:
            self._fold()

    def _fold(self) -> None:
        rec = self._hist.record_value
        for seconds in self._raw:
            rec(min(max(int(seconds * 1_000_000), _LOWEST_US), _HIGHEST_US))
        self._raw = array("d")

    @property
    def hist(self) -> HdrHistogram:
        self._fold()
        return self._hist

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
