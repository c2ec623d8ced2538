"""An asyncio event loop whose clock is virtual.

:class:`VirtualTimeLoop` is a selector event loop whose selector never waits: when no callback
is ready, ``select(timeout)`` moves the clock forward by ``timeout``, straight to the next timer.
An hour of timeouts passes in as long as it takes to run the callbacks. Nothing runs in a thread:
``run_in_executor`` (and so :func:`asyncio.to_thread`) calls the function at once on the loop and
returns a finished future, which keeps the order of events a function of the program alone.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, TypeVarTuple, Unpack

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


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


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """The simulation's event loop: virtual ``time()``, no waiting, no threads."""

    def __init__(self, clock: VirtualClock | None = None) -> None:
        self.clock = clock or VirtualClock()
        super().__init__(_VirtualSelector(self.clock))

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
