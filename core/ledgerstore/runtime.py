"""Process-level runtime choices."""

from __future__ import annotations

import asyncio


def install_fast_loop() -> bool:
    """Use uvloop's event loop when it is installed (the ``fast`` extra). Returns whether it is."""
    try:
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True
