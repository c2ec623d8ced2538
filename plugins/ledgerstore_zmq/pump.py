"""Drives a ZeroMQ socket from the asyncio loop.

A ZMQ socket's file descriptor is edge-triggered and signals "something changed", not
"readable": any send or receive on the socket may consume the edge while messages wait. So the
descriptor only wakes :meth:`EventPump.check`, which asks ``ZMQ_EVENTS`` (level-triggered) what the
socket can do, and whoever sends on the socket outside ``check`` calls :meth:`EventPump.schedule`
so the state is looked at again on the next loop iteration.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

import zmq

__all__ = ["EventPump"]


class EventPump:
    """Calls ``on_readable`` while the socket has messages and ``on_writable`` while it can take
    more and ``want_write`` is set. ``on_readable`` should read one bounded batch: the pump comes
    back on the next loop iteration if more is waiting, so one busy peer cannot starve the loop."""

    def __init__(self, sock: zmq.Socket[Any], on_readable: Callable[[], None],
                 on_writable: Callable[[], None] | None = None) -> None:
        self._sock = sock
        self._on_readable = on_readable
        self._on_writable = on_writable
        self._loop = asyncio.get_running_loop()
        self._fd = cast(int, sock.getsockopt(zmq.FD))
        self._events = cast(Callable[[int], int], sock.getsockopt)
        self._scheduled = False
        self._closed = False
        self.want_write = False
        self._loop.add_reader(self._fd, self.check)
        self.schedule()

    def schedule(self) -> None:
        """Look at the socket's state again on the next loop iteration."""
        if not self._scheduled and not self._closed:
            self._scheduled = True
            self._loop.call_soon(self.check)

    def check(self) -> None:
        """Serve what the socket can do now (called by the loop)."""
        self._scheduled = False
        if self._closed:
            return
        events = self._events(zmq.EVENTS)
        if events & zmq.POLLOUT and self.want_write and self._on_writable is not None:
            self._on_writable()
        if events & zmq.POLLIN and not self._closed:
            self._on_readable()
        if self._closed:
            return
        events = self._events(zmq.EVENTS)
        if events & zmq.POLLIN or (events & zmq.POLLOUT and self.want_write):
            self.schedule()

    def close(self) -> None:
        """Stop watching; call before closing the socket."""
        if not self._closed:
            self._closed = True
            self._loop.remove_reader(self._fd)
