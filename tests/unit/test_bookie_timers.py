"""The bookie's periodic timers (checkpoint, garbage collection): the jitter that keeps bookies
started together from flushing and compacting in the same seconds, and its configuration."""

from __future__ import annotations

import itertools
import random

import pytest

from ledgerstore.bookie.timers import jittered
from ledgerstore.config import BookieConfig


def waits(interval_s: float, jitter: float, n: int) -> list[float]:
    return list(itertools.islice(jittered(interval_s, jitter), n))


def test_without_jitter_every_wait_is_the_interval() -> None:
    assert set(waits(10.0, 0.0, 5)) == {10.0}


def test_waits_stay_within_the_jitter_and_the_first_spreads_over_a_whole_interval() -> None:
    random.seed(7)
    later = waits(10.0, 0.1, 2001)[1:]
    first = [waits(10.0, 0.1, 1)[0] for _ in range(2000)]
    assert 9.0 <= min(later) and max(later) <= 11.0
    assert 5.0 <= min(first) and max(first) <= 15.0
    # spread, not a constant: three bookies started together each draw a phase of their own
    assert max(later) - min(later) > 1.8 and max(first) - min(first) > 9.0


def test_bookies_started_together_drift_apart() -> None:
    """Three bookies' first timer after a common start: with the jitter, no two within a second
    of each other in about half the draws; without it, all three at once every time."""
    random.seed(11)
    apart = 0
    for _ in range(1000):
        starts = sorted(next(jittered(10.0, 0.1)) for _ in range(3))
        apart += min(b - a for a, b in itertools.pairwise(starts)) >= 1.0
        assert len({next(jittered(10.0, 0.0)) for _ in range(3)}) == 1
    assert apart > 400  # (1 - 2 x 1 s / 10 s)^3 = 0.51


def test_the_default_configuration_jitters_and_zero_turns_it_off() -> None:
    assert BookieConfig(metadata="memory://x").background_timer_jitter == 0.1
    assert BookieConfig(metadata="memory://x", background_timer_jitter=0).validate() == []


@pytest.mark.parametrize("jitter", [-0.1, 1.0, 2.5])
def test_a_jitter_out_of_range_is_a_config_error(jitter: float) -> None:
    problems = BookieConfig(metadata="memory://x", background_timer_jitter=jitter).validate()
    assert problems == [f"'background_timer_jitter' = {jitter} must be at least 0 and below 1 (a fraction of the interval)"]
