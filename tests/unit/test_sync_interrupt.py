"""A synchronous call interrupted at any point after its coroutine reached the loop cancels it
there (a signal handler runs at whichever bytecode the main thread is at)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from ledgerstore.client import _mirror


def test_an_interrupt_right_after_the_hand_over_still_cancels_the_coroutine_on_the_loop() -> None:
    lt = _mirror._LoopThread()
    started, cancelled = threading.Event(), threading.Event()

    async def forever() -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    original = lt.loop.call_soon_threadsafe

    def hand_over_then_interrupt(cb: Any, *args: Any, **kw: Any) -> Any:
        lt.loop.call_soon_threadsafe = original  # type: ignore[method-assign]  # once
        original(cb, *args, **kw)
        assert started.wait(10), "the coroutine never started on the loop"
        raise KeyboardInterrupt  # as if Ctrl-C landed the moment the loop had the call

    lt.loop.call_soon_threadsafe = hand_over_then_interrupt  # type: ignore[method-assign]
    try:
        with pytest.raises(KeyboardInterrupt):
            _mirror.run(forever(), loop=lt.loop)
        assert cancelled.is_set(), "the interrupted call kept running on the loop"
    finally:
        lt.stop()


def test_an_interrupt_before_the_hand_over_closes_the_coroutine_without_waiting() -> None:
    lt = _mirror._LoopThread()
    ran = threading.Event()

    async def never() -> None:
        ran.set()

    coro = never()
    call = _mirror._Call(lt.loop, coro)
    try:
        call.cancel_and_wait()  # returns at once: the loop never saw it
        assert call.ended.is_set() and call.result.cancelled()
        assert coro.cr_frame is None, "the coroutine was not closed"
        assert not ran.is_set()
    finally:
        lt.stop()
