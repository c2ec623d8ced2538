"""A writer's pending adds and their in-order acknowledgement (``ledgerstore.client.adds``): the
compiled twin gives the same results as the pure-Python code, for any mix of per-entry and
group answers, for ensembles wider than 64 bookies, and with the add latency metric."""

from __future__ import annotations

import asyncio
import collections
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledgerstore.client import adds
from ledgerstore.latency import LatencyHistogram
from ledgerstore.proto import speedups


def _compiled_module() -> ModuleType:
    module = adds.compiled()
    if module is None:
        pytest.skip("the compiled hot path is not built (scripts/setup.sh builds it) or "
                    f"{speedups.PURE_PYTHON_ENV} is set")
    return module


IMPLEMENTATIONS = ["pure", "compiled"]


def _impl(name: str) -> tuple[Any, Any]:
    if name == "pure":
        return adds.PendingAdd, adds.pop_acknowledged
    mod = _compiled_module()
    return mod.PendingAdd, mod.pop_acknowledged


class _Group:
    def __init__(self, acked: int) -> None:
        self.acked = acked


def _run(impl: str, spec: list[tuple[int, int, int | None, bool]], aq: int) -> tuple[list[Any], int, list[int],
                                                                                      list[int], int]:
    """Queue adds described by ``spec`` ((wsmask, acked, group acked or None, has a future)),
    pop what is acknowledged; returns results, the last entry popped, which adds are done,
    the histogram's counts and how many adds are left."""
    new, pop = _impl(impl)
    loop = asyncio.new_event_loop()
    try:
        q: collections.deque[Any] = collections.deque()
        futs = []
        for eid, (ws, acked, gacked, has_future) in enumerate(spec):
            fut = loop.create_future() if has_future else None
            pa = new(eid, b"item%d" % eid, fut, ws, 1.0)
            pa.acked = acked
            if gacked is not None:
                pa.group = _Group(gacked)
            q.append(pa)
            futs.append((pa, fut))
        hist = LatencyHistogram()
        last = pop(q, aq, hist)
        results = [f.result() if f is not None and f.done() else None for _, f in futs]
        done = [int(pa.done) for pa, _ in futs]
        return results, last, done, [1 if c else 0 for c in hist.counts], len(q)
    finally:
        loop.close()


masks = st.integers(min_value=0, max_value=(1 << 70) - 1)
adds_spec = st.lists(st.tuples(masks, masks, st.none() | masks, st.booleans()), max_size=40)


@settings(max_examples=300, deadline=None)
@given(spec=adds_spec, aq=st.integers(min_value=1, max_value=5))
def test_the_compiled_acknowledgement_loop_matches_the_pure_one(spec: list[tuple[int, int, int | None, bool]],
                                                               aq: int) -> None:
    _compiled_module()
    assert _run("compiled", spec, aq) == _run("pure", spec, aq)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_adds_are_popped_in_order_up_to_the_first_short_of_its_quorum(impl: str) -> None:
    full, wide = 0b111, 1 << 69 | 1 << 68 | 1  # a 70-bookie ensemble's write set
    spec = [(full, 0b011, None, True), (full, 0, 0b110, False), (wide, wide, None, True),
            (full, 0b001, 0b000, True), (full, 0b111, None, True)]
    results, last, done, _, left = _run(impl, spec, 2)
    assert results == [0, None, 2, None, None]
    assert last == 2
    assert done == [1, 1, 1, 0, 0]
    assert left == 2


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_nothing_acknowledged_pops_nothing_and_observes_nothing(impl: str) -> None:
    results, last, done, counts, left = _run(impl, [(0b11, 0b01, None, True)], 2)
    assert (results, last, done, sum(counts), left) == ([None], -1, [0], 0, 1)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_each_resolved_future_is_observed_once_in_the_add_latency_histogram(impl: str) -> None:
    new, pop = _impl(impl)
    loop = asyncio.new_event_loop()
    try:
        q: collections.deque[Any] = collections.deque()
        for eid in range(5):
            q.append(new(eid, b"", loop.create_future() if eid % 2 == 0 else None, 0b1, 0.0))
            q[-1].acked = 1
        done_early = q[2].future
        done_early.set_result(99)  # already resolved: left alone, not observed
        hist = LatencyHistogram()
        assert pop(q, 1, hist) == 4
        assert hist.count == 2
        assert hist.sum > 0
        assert done_early.result() == 99
    finally:
        loop.close()


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_a_pending_add_keeps_what_the_writer_sets(impl: str) -> None:
    new, _ = _impl(impl)
    pa = new(7, b"item", None, 0b101)
    assert (pa.entry_id, pa.item, pa.future, pa.group, pa.wsmask, pa.acked, pa.failed, pa.ensemble, pa.done,
            pa.started) == (7, b"item", None, None, 0b101, 0, 0, None, False, 0.0)
    pa.acked |= 1 << 80
    pa.failed |= 2
    pa.ensemble = ["a", "b"]
    pa.started = 1.5
    assert (pa.acked, pa.failed, pa.ensemble, pa.started) == (1 << 80, 2, ["a", "b"], 1.5)


def test_a_handle_takes_the_implementation_the_hot_path_selects(hot_path: str) -> None:
    new, pop = adds.implementation()
    module = adds.compiled()
    if hot_path == "compiled" and module is not None:
        assert (new, pop) == (module.PendingAdd, module.pop_acknowledged)
    else:
        assert (new, pop) == (adds.PendingAdd, adds.pop_acknowledged)
