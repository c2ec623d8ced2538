"""Running a directed scenario in a fresh simulated world (for the simulation's tests)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from ledgerstore.sim import VirtualTimeLoop
from ledgerstore.sim.world import World

T = TypeVar("T")


def in_world(seed: int, bookies: int, scenario: Callable[[World], Awaitable[T]]) -> T:
    """Run ``scenario(world)`` on a new world's virtual-time loop; the world is closed after."""
    loop = VirtualTimeLoop()
    world = World(seed, loop, bookies=bookies)
    try:
        with asyncio.Runner(loop_factory=lambda: loop) as runner:
            return runner.run(scenario(world))
    finally:
        world.close()
