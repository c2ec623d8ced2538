"""A writer's pending adds and the loop that acknowledges them in order: the per-entry part of
:class:`ledgerstore.client.ledger.LedgerHandle`.

``_adds.pyx`` (Cython, built by ``scripts/setup.sh``) is the compiled twin of this module: the
same attributes and results at a fraction of the interpreter's cost per add. A handle takes
:func:`implementation` when it is created: the compiled one when it is built and the codec's hot
path is compiled too (``ledgerstore.proto.speedups``: ``LEDGERSTORE_PURE_PYTHON=1`` turns both
off), else the pure-Python one below. The tests run the writer against both.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from time import perf_counter
from types import ModuleType
from typing import Any

from ledgerstore.latency import LatencyHistogram
from ledgerstore.proto import speedups


class PendingAdd:
    """One add until it is acknowledged. ``item`` is the signed entry as an ADD_BATCH item
    (entry id and length first), ready for any frame. ``acked`` and ``failed`` are bit sets of
    ensemble indexes (per-entry answers; group-wide ones are in ``group.acked``); ``ensemble`` is
    the bookie list the entry was last sent to (None: not sent yet). ``started`` is the
    ``perf_counter()`` of the append whose future this add carries (the add latency metric)."""

    __slots__ = ("entry_id", "item", "future", "group", "wsmask", "acked", "failed", "ensemble", "done", "started")

    def __init__(self, entry_id: int, item: bytes, future: asyncio.Future[int] | None, wsmask: int,
                 started: float = 0.0) -> None:
        self.entry_id = entry_id
        self.item = item
        self.future = future
        self.group: Any = None  # an add_batch.AddGroup
        self.wsmask = wsmask
        self.acked = 0
        self.failed = 0
        self.ensemble: list[str] | None = None
        self.done = False
        self.started = started


def pop_acknowledged(q: collections.deque[PendingAdd], ack_quorum: int, hist: LatencyHistogram) -> int:
    """Pop, in entry order, every leading add of ``q`` that has ``ack_quorum`` acknowledgements
    (its own, or its group's within its write set), mark it done and resolve its future with its
    entry id, observing the add's latency in ``hist``. Returns the last entry id popped, or -1
    when the first add is still short of its quorum."""
    last = -1
    now = 0.0
    popleft = q.popleft
    while q:
        pa = q[0]
        g = pa.group
        if ((pa.acked | g.acked) & pa.wsmask if g is not None else pa.acked).bit_count() < ack_quorum:
            break
        popleft()
        pa.done = True
        last = pa.entry_id
        fut = pa.future
        if fut is not None and not fut.done():
            fut.set_result(last)
            if not now:
                now = perf_counter()
            hist.observe(now - pa.started)
    return last


AddFactory = Callable[..., PendingAdd]
PopAcknowledged = Callable[[collections.deque[PendingAdd], int, LatencyHistogram], int]


def _load() -> ModuleType | None:
    if speedups.forced_pure():
        return None
    try:
        from ledgerstore.client import _adds  # absent when it was not built: the fallback
    except ImportError:
        return None
    return _adds


_compiled = _load()


def implementation() -> tuple[AddFactory, PopAcknowledged]:
    """The pending-add class and acknowledgement loop a new handle uses: compiled when built and
    the codec's hot path is compiled too, else pure Python."""
    if _compiled is not None and speedups.compiled is not None:
        return _compiled.PendingAdd, _compiled.pop_acknowledged
    return PendingAdd, pop_acknowledged


def compiled() -> ModuleType | None:
    """The compiled twin (``_adds``), or None when it was not built or the environment turned
    it off; for tests that compare the two."""
    return _compiled


def compiled_available() -> bool:
    """Whether the compiled twin was built (and not turned off by the environment)."""
    return _compiled is not None
