"""The re-replication throttle (entries/s and bytes/s per worker, BookKeeper's
``replicationRateByBytes``) and its settings: a rate of 0 or below is a one-line configuration
error, never "unthrottled"; the pacing is checked on the simulation's virtual clock, so it is
exact and takes no wall-clock time."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest

from ledgerstore.cli.shell_recover import _recovery_settings
from ledgerstore.config import AutoRecoveryConfig, load_bookie_config
from ledgerstore.errors import ConfigError
from ledgerstore.recovery.worker import Throttle
from ledgerstore.sim.loop import VirtualTimeLoop


def paced(throttle: Throttle, batches: list[tuple[int, int]]) -> list[float]:
    """The virtual times at which each ``(entries, bytes)`` batch was let through."""
    loop = VirtualTimeLoop()
    times: list[float] = []

    async def main() -> None:
        for entries, nbytes in batches:
            await throttle.take(entries, nbytes)
            times.append(loop.time())

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    return times


def test_batches_are_paced_by_the_entry_rate() -> None:
    assert paced(Throttle(entries_per_s=1000), [(100, 0)] * 4) == pytest.approx([0.0, 0.1, 0.2, 0.3])


def test_batches_are_paced_by_the_byte_rate() -> None:
    assert paced(Throttle(bytes_per_s=1_000_000), [(1, 500_000)] * 3) == pytest.approx([0.0, 0.5, 1.0])


def test_both_rates_add_up_per_batch() -> None:
    # 100 entries at 1,000/s (0.1 s) and 100 KB at 1 MB/s (0.1 s): each batch costs 0.2 s
    throttle = Throttle(entries_per_s=1000, bytes_per_s=1_000_000)
    assert paced(throttle, [(100, 100_000)] * 3) == pytest.approx([0.0, 0.2, 0.4])


def test_without_rates_nothing_waits() -> None:
    assert paced(Throttle(), [(10_000, 10**9)] * 3) == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("name", ["rereplication_entries_per_s", "replication_rate_by_bytes"])
@pytest.mark.parametrize("rate", [0.0, -5.0, math.nan])
def test_a_rate_of_zero_or_below_is_a_config_error(name: str, rate: float) -> None:
    problems = AutoRecoveryConfig(**{name: rate}).validate()  # type: ignore[arg-type]
    assert problems == [f"'autorecovery.{name}' = {rate} must be a positive rate (omit it for no throttle)"]


@pytest.mark.parametrize("size", [0, -1, 65537])
def test_a_batch_size_outside_1_to_65536_is_a_config_error(size: int) -> None:
    problems = AutoRecoveryConfig(rereplication_entry_batch_size=size).validate()
    assert problems == [f"'autorecovery.rereplication_entry_batch_size' = {size} must be between 1 and 65536"]


def test_the_defaults_are_unthrottled_batches_of_100() -> None:
    cfg = AutoRecoveryConfig()
    assert cfg.validate() == []
    assert (cfg.rereplication_entries_per_s, cfg.replication_rate_by_bytes) == (math.inf, math.inf)
    assert cfg.rereplication_entry_batch_size == 100


def test_a_zero_throttle_in_a_bookie_file_is_refused_naming_the_key(tmp_path: Path) -> None:
    path = tmp_path / "bookie.toml"
    path.write_text('[bookie]\nmetadata = "sqlite:///x.db"\n[bookie.autorecovery]\nreplication_rate_by_bytes = 0\n')
    with pytest.raises(ConfigError) as err:
        load_bookie_config(path)
    assert str(err.value).endswith("'autorecovery.replication_rate_by_bytes' = 0.0 must be a positive rate "
                                  "(omit it for no throttle)")
    assert "\n" not in str(err.value)  # one line


def test_the_shells_entries_per_second_of_zero_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError) as err:
        _recovery_settings(30.0, 0.0)
    assert str(err.value) == "--entries-per-second = 0.0 must be a positive rate (omit the option for no throttle)"
    assert _recovery_settings(30.0, None).rereplication_entries_per_s == math.inf


def test_a_throttle_is_built_from_both_settings() -> None:
    throttle = Throttle(250.0, 4e6)
    assert (throttle.entries_per_s, throttle.bytes_per_s) == (250.0, 4e6)
    asyncio.run(throttle.take(0, 0))  # nothing to pace: returns at once
