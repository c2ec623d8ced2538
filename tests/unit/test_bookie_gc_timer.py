"""The garbage collector's timer: the jitter that keeps bookies started together from compacting
in the same seconds, and its configuration."""

from __future__ import annotations

import random
from typing import Any

import pytest

from ledgerstore.bookie.gc import GarbageCollector
from ledgerstore.config import BookieConfig


def collector(**settings: Any) -> GarbageCollector:
    config = BookieConfig(metadata="memory://x", **settings)
    assert config.validate() == []
    # the timer reads nothing but the configuration
    return GarbageCollector(config, None, None, None, None)  # type: ignore[arg-type]


def test_without_jitter_every_wait_is_the_interval() -> None:
    gc = collector(gc_wait_time_ms=10_000, gc_wait_time_jitter=0)
    assert {gc.wait_s(first) for first in (True, False, False)} == {10.0}


def test_waits_stay_within_the_jitter_and_the_first_spreads_over_a_whole_interval() -> None:
    random.seed(7)
    gc = collector(gc_wait_time_ms=10_000, gc_wait_time_jitter=0.1)
    later = [gc.wait_s(False) for _ in range(2000)]
    first = [gc.wait_s(True) for _ in range(2000)]
    assert 9.0 <= min(later) and max(later) <= 11.0
    assert 5.0 <= min(first) and max(first) <= 15.0
    # spread, not a constant: three bookies started together would each draw their own phase
    assert max(later) - min(later) > 1.8 and max(first) - min(first) > 9.0


def test_bookies_started_together_drift_apart() -> None:
    """Three bookies' first pass after a common start: with the jitter, no two in the same second
    for most draws; without it, all three at once every time."""
    random.seed(11)
    jittered, exact = collector(gc_wait_time_ms=10_000), collector(gc_wait_time_ms=10_000, gc_wait_time_jitter=0)
    apart = 0
    for _ in range(1000):
        starts = sorted(jittered.wait_s(True) for _ in range(3))
        apart += min(b - a for a, b in zip(starts, starts[1:], strict=False)) >= 1.0
        assert len({exact.wait_s(True) for _ in range(3)}) == 1
    assert apart > 400  # about half the draws: (1 - 2 x 1 s / 10 s)^3 = 0.51


@pytest.mark.parametrize("jitter", [-0.1, 1.0, 2.5])
def test_a_jitter_out_of_range_is_a_config_error(jitter: float) -> None:
    problems = BookieConfig(metadata="memory://x", gc_wait_time_jitter=jitter).validate()
    assert problems == [f"'gc_wait_time_jitter' = {jitter} must be at least 0 and below 1 (a fraction of gc_wait_time_ms)"]
