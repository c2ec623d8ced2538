"""Running a directed scenario in a fresh simulated world (for the simulation's tests)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

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


async def closed_ledger(world: World, entries: int, payload: str = "{}") -> Any:
    """With the world's bookies started: a ``writer`` client writes ``entries`` entries
    (``payload.format(i)``) to a new E3 Qw3 Qa2 ledger and closes it; returns its handle."""
    writer = await world.client("writer").start()
    lh = await writer.create_ledger(3, 3, 2, password=b"sim")
    for i in range(entries):
        await lh.append(payload.format(i).encode())
    await lh.close()
    return lh
