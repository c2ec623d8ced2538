"""An asyncio event loop whose clock is virtual.

:class:`VirtualTimeLoop` is a selector event loop whose selector never waits: when no callback
is ready, ``select(timeout)`` moves the clock forward by ``timeout``, straight to the next timer.
An hour of timeouts passes in as long as it takes to run the callbacks. Nothing runs in a thread:
``run_in_executor`` (and so :func:`asyncio.to_thread`) calls the function at once on the loop and
returns a finished future, which keeps the order of events a function of the program alone.
"""

from __future__ import annotations

import asyncio
import heapq
import selectors
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, TypeVarTuple, Unpack

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


# asyncio's constants of its iteration (asyncio.base_events), which the virtual one repeats
_MIN_SCHEDULED_TIMER_HANDLES = 100
_MIN_CANCELLED_TIMER_HANDLES_FRACTION = 0.5
_MAXIMUM_SELECT_TIMEOUT = 24 * 3600


class SimulationStuck(RuntimeError):
    """Nothing is ready and no timer is set: every task waits for something that cannot happen."""


class VirtualClock:
    """The simulated time in seconds; only the loop's selector moves it."""

    def __init__(self) -> None:
        self.now = 0.0

    def advance(self, seconds: float) -> None:
        """Move forward by ``seconds`` (never backwards)."""
        if seconds > 0:
            self.now += seconds


class _VirtualSelector(selectors.BaseSelector):
    """Registers file objects (the loop's self-pipe) but never polls them."""

    def __init__(self, clock: VirtualClock) -> None:
        self._clock = clock
        self._keys: dict[int, selectors.SelectorKey] = {}

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        key = selectors.SelectorKey(fileobj, fd, events, data)
        self._keys[fd] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        return self._keys.pop(fd)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise SimulationStuck("no callback is ready and no timer is set")
        self._clock.advance(timeout)
        return []

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._keys

    def close(self) -> None:
        self._keys.clear()


class _TimerHandle(asyncio.TimerHandle):
    """A timer of the virtual loop: ordered by its time alone, as every timer of its heap is one
    of these (asyncio's own checks the other operand's type at each of the heap's comparisons)."""

    __slots__ = ()

    def __lt__(self, other: asyncio.TimerHandle) -> bool:
        return self._when < other._when  # type: ignore[attr-defined, no-any-return]


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """The simulation's event loop: virtual ``time()``, no waiting, no threads.

    Its iteration (:meth:`_run_once`) is asyncio's, step for step, with the selector's virtual
    wait done in place and no I/O events to process: the same callbacks run in the same order
    at the same virtual times, for less CPU per iteration (a seed runs about 70,000 of them).
    In asyncio's debug mode it runs asyncio's own iteration."""

    def __init__(self, clock: VirtualClock | None = None) -> None:
        self.clock = clock or VirtualClock()
        super().__init__(_VirtualSelector(self.clock))

    def call_at(self, when: float, callback: Callable[[Unpack[Ts]], object], *args: *Ts,
                context: Any = None) -> asyncio.TimerHandle:
        """asyncio's ``call_at`` with the loop's own timer handle (outside debug mode)."""
        loop: Any = self  # asyncio's state, which its typing does not show
        if loop._debug:
            return super().call_at(when, callback, *args, context=context)
        if when is None:
            raise TypeError("when cannot be None")
        loop._check_closed()
        timer = _TimerHandle(when, callback, args, self, context)
        heapq.heappush(loop._scheduled, timer)
        handle: Any = timer
        handle._scheduled = True
        return timer

    def _run_once(self) -> None:
        """One iteration: asyncio's ``BaseEventLoop._run_once`` (3.11), the selector's
        ``select(timeout)`` being the clock's move by ``timeout``."""
        loop: Any = self  # asyncio's state, which its typing does not show
        if loop._debug:
            super()._run_once()  # type: ignore[misc]
            return
        scheduled: list[Any] = loop._scheduled
        sched_count = len(scheduled)
        if (sched_count > _MIN_SCHEDULED_TIMER_HANDLES
                and loop._timer_cancelled_count / sched_count > _MIN_CANCELLED_TIMER_HANDLES_FRACTION):
            # drop the cancelled timers when they are too many
            kept: list[Any] = []
            for handle in scheduled:
                if handle._cancelled:
                    handle._scheduled = False
                else:
                    kept.append(handle)
            heapq.heapify(kept)
            loop._scheduled = scheduled = kept
            loop._timer_cancelled_count = 0
        else:  # drop the cancelled timers at the head of the heap
            while scheduled and scheduled[0]._cancelled:
                loop._timer_cancelled_count -= 1
                handle = heapq.heappop(scheduled)
                handle._scheduled = False
        ready = loop._ready
        clock = self.clock
        if not (ready or loop._stopping):
            if not scheduled:
                raise SimulationStuck("no callback is ready and no timer is set")
            timeout = min(max(0, scheduled[0]._when - clock.now), _MAXIMUM_SELECT_TIMEOUT)
            if timeout > 0:
                clock.now += timeout
        end_time = clock.now + loop._clock_resolution
        while scheduled:
            handle = scheduled[0]
            if handle._when >= end_time:
                break
            handle = heapq.heappop(scheduled)
            handle._scheduled = False
            ready.append(handle)
        # the callbacks ready now; those they make ready run in the next iteration
        for _ in range(len(ready)):
            handle = ready.popleft()
            if handle._cancelled:
                continue
            handle._run()
        handle = None  # breaks a cycle when a callback raised

    def time(self) -> float:
        """The virtual time, in seconds since the simulation began."""
        return self.clock.now

    def run_in_executor(self, executor: Any, func: Callable[[Unpack[Ts]], T], *args: *Ts) -> asyncio.Future[T]:
        """Run ``func`` now, on the loop (a simulated process has no threads)."""
        fut: asyncio.Future[T] = self.create_future()
        try:
            fut.set_result(func(*args))
        except Exception as exc:  # handed to whoever awaits, as an executor would
            fut.set_exception(exc)
        return fut
