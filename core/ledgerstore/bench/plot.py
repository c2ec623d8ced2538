"""PNG charts of a benchmark run: throughput per second and the latency distribution."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ledgerstore.errors import ConfigError


def plot_result(result: Any, path: str | Path, title: str) -> Path:
    """Draw ``result`` (a ``WriteResult`` or ``ReadResult``) into the PNG file ``path``.

    Left: measured entries per second over time (one bar per second). Right: latency against
    percentile on a "nines" axis (50%, 90%, 99%, 99.9%, ...), as HdrHistogram plots show it.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: never needs a display
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--plot needs matplotlib: install ledgerstore with its 'bench' extra "
                          "(docs/install.md)") from None

    out = Path(path)
    per_second = list(result.per_second)
    dist = result.latency.distribution_ms()
    what = "add latency" if hasattr(result, "latency_ms") else "batch read latency"

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    fig.suptitle(title)
    ax1.bar(range(len(per_second)), per_second, width=1.0, align="edge", color="#4878a8")
    ax1.axhline(result.entries_per_s, color="#c44e52", linestyle="--", linewidth=1,
                label=f"mean {result.entries_per_s:,.0f}/s")
    ax1.set_xlabel("second")
    ax1.set_ylabel("entries acknowledged / s" if what == "add latency" else "entries read / s")
    ax1.set_title("throughput")
    ax1.legend(loc="lower right")

    if dist:
        # x = 1 / (1 - p): each decade is one more nine, so the tail gets its own room
        # the 100th percentile would sit at infinity: put it one step past the histogram's resolution
        cap = max(2.0, float(result.latency.count))
        xs = [min(cap, 1.0 / max(1e-9, 1.0 - p / 100.0)) for p, _ in dist]
        ys = [ms for _, ms in dist]
        ax2.plot(xs, ys, color="#4878a8")
        ax2.set_xscale("log")
        ticks = [t for t in (2, 10, 100, 1000, 10_000, 100_000) if t <= max(xs) * 1.01]
        labels = {2: "50%", 10: "90%", 100: "99%", 1000: "99.9%", 10_000: "99.99%", 100_000: "99.999%"}
        ax2.set_xticks(ticks, [labels[t] for t in ticks])
    ax2.set_xlabel("percentile")
    ax2.set_ylabel("milliseconds")
    ax2.set_title(what)
    ax2.grid(True, which="major", alpha=0.3)

    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
