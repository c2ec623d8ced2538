"""Per-second peaks (``ledgerstore.stalls``): what the latency benchmark reads from every process to
say which component took its worst seconds."""

from __future__ import annotations

import asyncio
import gc
import time

from ledgerstore.stalls import PeakWindow, attribute, probe_loop_lag, watch_gc


def test_a_window_keeps_the_longest_duration_of_each_second_by_component() -> None:
    w = PeakWindow(size=10)
    w.observe("journal_fsync", 0.002, began=100.1)
    w.observe("journal_fsync", 0.009, began=100.7)
    w.observe("journal_fsync", 0.004, began=100.9)
    w.observe("journal_fsync", 0.001, began=101.0)
    w.observe("checkpoint", 0.030, began=101.5)
    assert w.snapshot() == {"journal_fsync": {100: 0.009, 101: 0.001}, "checkpoint": {101: 0.030}}
    assert w.snapshot(since=101) == {"journal_fsync": {101: 0.001}, "checkpoint": {101: 0.030}}


def test_a_window_forgets_seconds_older_than_its_size() -> None:
    w = PeakWindow(size=4)
    for sec in range(10):
        w.observe("loop_lag", sec / 1000, began=sec + 0.5)
    assert w.snapshot() == {"loop_lag": {6: 0.006, 7: 0.007, 8: 0.008, 9: 0.009}}


def test_an_observation_without_a_start_counts_in_the_second_it_began() -> None:
    w = PeakWindow()
    before = int(time.time() - 5.0)
    w.observe("checkpoint", 5.0)
    (sec,) = w.snapshot()["checkpoint"]
    assert before <= sec <= int(time.time() - 5.0)


def test_attribution_names_the_components_of_the_worst_seconds_and_the_one_before() -> None:
    windows = {
        "bookie0": {"loop_lag": {1002: 0.040}, "journal_fsync": {1000: 0.001, 1004: 0.002}},
        "client": {"loop_lag": {1001: 0.012}},
    }
    worst = [3.0, 5.0, 41.0, 4.0, 2.5]
    out = attribute(worst, 1000, windows, top=2)
    assert [o["second"] for o in out] == [2, 1]
    assert out[0] == {"second": 2, "worst_add_ms": 41.0, "peaks_ms": {"bookie0.loop_lag": 40.0, "client.loop_lag": 12.0}}
    assert out[1]["peaks_ms"] == {"client.loop_lag": 12.0, "bookie0.journal_fsync": 1.0}


def test_gc_pauses_are_recorded_by_generation() -> None:
    w = PeakWindow()
    stop = watch_gc(w)
    try:
        gc.collect(2)
    finally:
        stop()
    assert "gc_gen2" in w.snapshot()
    assert all(cb.__qualname__ != "watch_gc.<locals>.callback" for cb in gc.callbacks)


def test_the_loop_lag_probe_sees_a_callback_that_blocks_the_loop() -> None:
    w = PeakWindow()

    async def main() -> None:
        probe = asyncio.get_running_loop().create_task(probe_loop_lag(w, interval=0.001))
        await asyncio.sleep(0.01)
        time.sleep(0.05)  # holds the loop
        await asyncio.sleep(0.01)
        probe.cancel()

    asyncio.run(main())
    # the probe's timer was due 1 ms after it was set and fired only after the 50 ms block
    assert max(max(by.values()) for by in w.snapshot().values()) >= 0.04
