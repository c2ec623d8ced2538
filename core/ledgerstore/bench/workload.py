"""The write and read workloads of ``ledgerstore bench``, usable from scripts.

Writes follow BookKeeper's ``BenchThroughputLatency``: one payload of ``entry_size`` random bytes
is appended round-robin to ``ledgers`` ledgers with ``append_async`` (pipelined), never more than
``throttle`` adds outstanding. Each add has its own future, which one task of the application
awaits in issue order (acknowledgements come in entry order); an add's latency runs from just
before ``append_async`` to when that task finds its future done (``time.perf_counter``). With
``batch`` N > 1, N entries go in each ``append_many_async`` call and share one future and one
latency (a callback per call). Adds issued during ``warmup`` seconds are
acknowledged but not measured. Throughput counts measured acknowledgements, per second and overall.

Reads open a closed ledger (the workload writes one first unless given a ledger id) without
recovery, so that reading a ledger still being written never fences its writer, and read it
sequentially in batches.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import os
import time
from collections.abc import Callable
from typing import Any

from ledgerstore.bench.latency import LatencyRecorder
from ledgerstore.errors import InvalidArgumentError, LedgerStoreError, NoSuchEntryError

#: ``on_tick(elapsed_seconds, measured_entries_done)``, called about four times a second
TickCallback = Callable[[float, int], None]
_TICK_S = 0.25
#: yield to the event loop after this many adds so that acks and socket writes keep flowing
_YIELD_EVERY = 1000  # adds issued per event-loop turn: the client sends each turn's adds as one batch


@dataclasses.dataclass
class WriteOptions:
    """What ``run_writes`` does. Give ``count`` or ``duration`` (or both: whichever ends first)."""

    ensemble: int = 3
    write_quorum: int = 2
    ack_quorum: int = 2
    entry_size: int = 1024
    ledgers: int = 1
    #: most adds outstanding at once (BookKeeper's ``-throttle``)
    throttle: int = 10_000
    #: seconds of measured adds (after the warm-up)
    duration: float | None = None
    #: measured adds to issue (after the warm-up)
    count: int | None = None
    warmup: float = 0.0
    digest: str = "crc32c"
    password: bytes = b"ledgerstore-bench"
    #: leave the ledgers in the cluster (closed) instead of deleting them at the end
    keep_ledgers: bool = False
    #: entries per call: 1 appends each entry with ``append_async`` (a future per entry, as
    #: BookKeeper's benchmark does); N > 1 appends N at a time with ``append_many_async`` (one
    #: future per batch; every entry of a batch gets the batch's latency)
    batch: int = 1

    def validate(self) -> None:
        """Raise :class:`InvalidArgumentError` naming the first bad option."""
        if not self.ensemble >= self.write_quorum >= self.ack_quorum >= 1:
            raise InvalidArgumentError(
                f"need ensemble >= write quorum >= ack quorum >= 1, got {self.ensemble}/{self.write_quorum}/{self.ack_quorum}")
        for name in ("entry_size", "ledgers", "throttle", "batch"):
            if getattr(self, name) < 1:
                raise InvalidArgumentError(f"{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if self.count is None and self.duration is None:
            raise InvalidArgumentError("give a duration (seconds) or a count (entries) for the benchmark")
        if self.count is not None and self.count < 1:
            raise InvalidArgumentError(f"count must be at least 1, got {self.count}")
        if self.duration is not None and self.duration <= 0:
            raise InvalidArgumentError(f"duration must be positive, got {self.duration}")
        if self.warmup < 0:
            raise InvalidArgumentError(f"warmup must be >= 0 seconds, got {self.warmup}")


@dataclasses.dataclass
class WriteResult:
    """What ``run_writes`` measured. ``to_dict()`` is the ``--json`` output."""

    entries: int
    bytes: int
    seconds: float
    entries_per_s: float
    mb_per_s: float
    latency_ms: dict[str, float]
    per_second: list[int]
    warmup_entries: int
    errors: int
    first_error: str | None
    ledger_ids: list[int]
    options: dict[str, Any]
    latency: LatencyRecorder = dataclasses.field(repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "latency"}
        d["mode"] = "writes"
        return d


@dataclasses.dataclass
class ReadOptions:
    """What ``run_reads`` does: read ``ledger_id`` (with ``password``), or write ``count`` entries
    of ``entry_size`` bytes to a new ledger first and read that."""

    ledger_id: int | None = None
    password: bytes = b"ledgerstore-bench"
    count: int = 10_000
    entry_size: int = 1024
    ensemble: int = 3
    write_quorum: int = 2
    ack_quorum: int = 2
    #: entries per read request batch
    batch: int = 1000
    #: batches read at once: the next ones are on their way while one is counted (1: one at a time)
    window: int = 2
    keep_ledgers: bool = False

    def validate(self) -> None:
        if self.batch < 1:
            raise InvalidArgumentError(f"batch must be at least 1, got {self.batch}")
        if self.window < 1:
            raise InvalidArgumentError(f"window must be at least 1, got {self.window}")
        if self.ledger_id is None and self.count < 1:
            raise InvalidArgumentError(f"count must be at least 1, got {self.count}")


@dataclasses.dataclass
class ReadResult:
    """What ``run_reads`` measured; latencies are per batch read."""

    ledger_id: int
    entries: int
    bytes: int
    seconds: float
    entries_per_s: float
    mb_per_s: float
    batch_latency_ms: dict[str, float]
    per_second: list[int]
    written_first: bool
    options: dict[str, Any]
    latency: LatencyRecorder = dataclasses.field(repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "latency"}
        d["mode"] = "reads"
        return d


class _Acks:
    """Bookkeeping of outstanding adds, updated by the acknowledgement callbacks."""

    def __init__(self, throttle: int) -> None:
        self.throttle = throttle
        self.outstanding = 0
        self.space = asyncio.Event()
        self.space.set()
        self.drained = asyncio.Event()
        self.drained.set()
        self.latency = LatencyRecorder()
        self.measured = 0
        self.warm = 0
        self.errors = 0
        self.first_error: BaseException | None = None
        self.measure_from = 0.0
        self.last_ack = 0.0
        self.per_second: list[int] = []

    def issued(self, n: int = 1) -> None:
        self.outstanding += n
        self.drained.clear()

    def done(self, t0: float, measured: bool, fut: asyncio.Future[int], n: int = 1) -> None:
        """``n`` adds (one call) ended; a batch's latency is recorded once, since all of its
        entries share it and every batch has the same size."""
        now = time.perf_counter()
        self.outstanding -= n
        if self.outstanding < self.throttle:
            self.space.set()
        if self.outstanding == 0:
            self.drained.set()
        exc = fut.exception() if not fut.cancelled() else asyncio.CancelledError()
        if exc is not None:
            self.errors += n
            if self.first_error is None:
                self.first_error = exc
            return
        if not measured:
            self.warm += n
            return
        self.latency.record(now - t0)
        self.measured += n
        self.last_ack = now
        sec = int(now - self.measure_from)
        while len(self.per_second) <= sec:
            self.per_second.append(0)
        self.per_second[sec] += n


class _InOrder:
    """``batch == 1``: every add's future, awaited in issue order by one consumer task that
    updates ``acks`` (cheaper per add than a done-callback each, and what an application that
    awaits its adds does)."""

    def __init__(self, acks: _Acks) -> None:
        self.acks = acks
        self.times: collections.deque[float] = collections.deque()
        self.futs: collections.deque[asyncio.Future[int]] = collections.deque()
        self.more = asyncio.Event()
        #: index (in issue order) of the first measured add; adds before it are the warm-up
        self.first_measured: float = float("inf")
        self.consumed = 0

    async def consume(self) -> None:
        acks, times, futs = self.acks, self.times, self.futs
        while True:
            if not futs:
                self.more.clear()
                await self.more.wait()
                continue
            if not futs[0].done():
                await asyncio.wait((futs[0],))
            now = time.perf_counter()
            lats: list[float] = []
            n = 0
            idx = self.consumed
            while futs and futs[0].done():
                fut = futs.popleft()
                t0 = times.popleft()
                exc = fut.exception() if not fut.cancelled() else asyncio.CancelledError()
                n += 1
                if exc is not None:
                    acks.errors += 1
                    if acks.first_error is None:
                        acks.first_error = exc
                elif idx + n > self.first_measured:
                    lats.append(now - t0)
                else:
                    acks.warm += 1
            self.consumed = idx + n
            acks.outstanding -= n
            if acks.outstanding < acks.throttle:
                acks.space.set()
            if acks.outstanding == 0:
                acks.drained.set()
            if lats:
                acks.latency.record_many(lats)
                acks.measured += len(lats)
                acks.last_ack = now
                sec = int(now - acks.measure_from)
                while len(acks.per_second) <= sec:
                    acks.per_second.append(0)
                acks.per_second[sec] += len(lats)

    def issue(self, handles: list[Any], payload: bytes, first: int, count: int, measuring: bool) -> None:
        """Issue ``count`` adds, round-robin over ``handles`` from add number ``first``."""
        if measuring and self.first_measured == float("inf"):
            self.first_measured = first
        times, futs = self.times, self.futs
        perf = time.perf_counter
        if len(handles) == 1:
            append = handles[0].append_async
            for _ in range(count):
                times.append(perf())
                futs.append(append(payload))
        else:
            nh = len(handles)
            for i in range(first, first + count):
                times.append(perf())
                futs.append(handles[i % nh].append_async(payload))
        self.acks.issued(count)
        self.more.set()


async def _ticker(on_tick: TickCallback, started: float, done: Callable[[], int]) -> None:
    while True:
        await asyncio.sleep(_TICK_S)
        on_tick(time.perf_counter() - started, done())


async def run_writes(client: Any, opts: WriteOptions, on_tick: TickCallback | None = None) -> WriteResult:
    """Run the write benchmark with an open :class:`ledgerstore.aio.Client`."""
    opts.validate()
    handles = [
        await client.create_ledger(opts.ensemble, opts.write_quorum, opts.ack_quorum, digest=opts.digest,
                                   password=opts.password)
        for _ in range(opts.ledgers)
    ]
    payload = os.urandom(opts.entry_size)
    batch = opts.batch
    payloads = [payload] * batch
    acks = _Acks(opts.throttle)
    start = time.perf_counter()
    measuring = opts.warmup <= 0
    if measuring:
        acks.measure_from = start
    warm_end = start + opts.warmup
    issued_measured = 0
    i = 0
    ticker = asyncio.create_task(_ticker(on_tick, start, lambda: acks.measured)) if on_tick else None
    in_order = _InOrder(acks) if batch == 1 else None
    consumer = asyncio.create_task(in_order.consume()) if in_order is not None else None
    try:
        while acks.first_error is None:
            now = time.perf_counter()
            if not measuring and now >= warm_end:
                measuring = True
                acks.measure_from = now
            if measuring:
                if opts.count is not None and issued_measured >= opts.count:
                    break
                if opts.duration is not None and now - acks.measure_from >= opts.duration:
                    break
            if acks.outstanding >= opts.throttle:
                acks.space.clear()
                await acks.space.wait()
                continue
            if in_order is not None:
                # a turn's worth of adds at once: the client sends each turn's adds as one batch
                n = min(opts.throttle - acks.outstanding, _YIELD_EVERY)
                if measuring and opts.count is not None:
                    n = min(n, opts.count - issued_measured)
                in_order.issue(handles, payload, i, n, measuring)
                i += n
                if measuring:
                    issued_measured += n
                await asyncio.sleep(0)
                continue
            lh = handles[i % len(handles)]
            i += 1
            t0 = time.perf_counter()
            fut = lh.append_many_async(payloads)
            acks.issued(batch)
            fut.add_done_callback(functools.partial(acks.done, t0, measuring, n=batch))
            if measuring:
                issued_measured += batch
            if (i * batch) % _YIELD_EVERY < batch:
                await asyncio.sleep(0)
        await acks.drained.wait()
    finally:
        for task in (ticker, consumer):
            if task is not None:
                task.cancel()
    if on_tick is not None:
        on_tick(time.perf_counter() - start, acks.measured)
    for lh in handles:
        try:
            await lh.close()
        except LedgerStoreError:
            if acks.first_error is None:
                raise
    if not opts.keep_ledgers:
        for lh in handles:
            await client.delete_ledger(lh.ledger_id)
    seconds = max(acks.last_ack - acks.measure_from, 0.0) if acks.measured else 0.0
    nbytes = acks.measured * opts.entry_size
    options = dataclasses.asdict(opts)
    options.pop("password")
    return WriteResult(
        entries=acks.measured,
        bytes=nbytes,
        seconds=round(seconds, 3),
        entries_per_s=round(acks.measured / seconds, 1) if seconds else 0.0,
        mb_per_s=round(nbytes / 1e6 / seconds, 3) if seconds else 0.0,
        latency_ms=acks.latency.summary_ms(),
        per_second=acks.per_second,
        warmup_entries=acks.warm,
        errors=acks.errors,
        first_error=f"{type(acks.first_error).__name__}: {acks.first_error}" if acks.first_error else None,
        ledger_ids=[lh.ledger_id for lh in handles],
        options=options,
        latency=acks.latency,
    )


async def run_reads(client: Any, opts: ReadOptions, on_tick: TickCallback | None = None) -> ReadResult:
    """Run the sequential-read benchmark with an open :class:`ledgerstore.aio.Client`."""
    opts.validate()
    lid = opts.ledger_id
    written_first = lid is None
    if lid is None:
        wrote = await run_writes(client, WriteOptions(
            ensemble=opts.ensemble, write_quorum=opts.write_quorum, ack_quorum=opts.ack_quorum,
            entry_size=opts.entry_size, count=opts.count, password=opts.password, keep_ledgers=True))
        if wrote.errors:
            raise LedgerStoreError(f"writing the ledger to read failed: {wrote.first_error}")
        lid = wrote.ledger_ids[0]
    try:
        # no recovery: reading a ledger someone still writes must not fence them
        handle = await client.open_ledger(lid, password=opts.password, recovery=False)
        last = handle.last_add_confirmed
        if last < 0:
            raise NoSuchEntryError(f"ledger {lid} has no confirmed entries to read")
        rec = LatencyRecorder()
        per_second: list[int] = []
        entries = nbytes = 0
        start = time.perf_counter()
        ticker = asyncio.create_task(_ticker(on_tick, start, lambda: entries)) if on_tick else None
        inflight: collections.deque[tuple[float, asyncio.Task[list[Any]]]] = collections.deque()
        try:
            first = 0
            while first <= last or inflight:
                while first <= last and len(inflight) < opts.window:
                    hi = min(last, first + opts.batch - 1)
                    inflight.append((time.perf_counter(), asyncio.ensure_future(handle.read(first, hi))))
                    first = hi + 1
                t0, task = inflight.popleft()
                got = await task
                now = time.perf_counter()
                rec.record(now - t0)
                entries += len(got)
                nbytes += sum(len(e.payload) for e in got)
                sec = int(now - start)
                while len(per_second) <= sec:
                    per_second.append(0)
                per_second[sec] += len(got)
        finally:
            for _, task in inflight:
                task.cancel()
            if ticker is not None:
                ticker.cancel()
        seconds = time.perf_counter() - start
        if on_tick is not None:
            on_tick(seconds, entries)
    finally:
        if written_first and not opts.keep_ledgers:
            await client.delete_ledger(lid)
    options = dataclasses.asdict(opts)
    options.pop("password")
    return ReadResult(
        ledger_id=lid,
        entries=entries,
        bytes=nbytes,
        seconds=round(seconds, 3),
        entries_per_s=round(entries / seconds, 1) if seconds else 0.0,
        mb_per_s=round(nbytes / 1e6 / seconds, 3) if seconds else 0.0,
        batch_latency_ms=rec.summary_ms(),
        per_second=per_second,
        written_first=written_first,
        options=options,
        latency=rec,
    )
