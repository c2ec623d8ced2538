"""Synchronous views of the log writer and reader, for scripts and Spark executors.

They run the asyncio objects of :mod:`ledgerstore.client.log` on the sync client's loop thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Iterator
from typing import TYPE_CHECKING

from ledgerstore.client import log as aio_log
from ledgerstore.errors import LedgerStoreError
from ledgerstore.meta.logs import Position

if TYPE_CHECKING:
    from ledgerstore.client.sync import Client


class LogWriter:
    """Synchronous view of :class:`ledgerstore.aio.LogWriter`."""

    def __init__(self, owner: Client, writer: aio_log.LogWriter) -> None:
        self._owner = owner
        self._w = writer

    @property
    def name(self) -> str:
        return self._w.name

    @property
    def ledger_id(self) -> int:
        """The ledger new entries go to."""
        return self._w.ledger_id

    @property
    def ledger_ids(self) -> list[int]:
        return self._w.ledger_ids

    @property
    def last_position(self) -> Position | None:
        return self._w.last_position

    @property
    def error(self) -> LedgerStoreError | None:
        return self._w.error

    def append(self, payload: bytes) -> Position:
        """Add an entry; blocks until it is acknowledged and returns its position."""
        return self.append_async(payload).result()

    def append_async(self, payload: bytes) -> concurrent.futures.Future[Position]:
        """Queue an add; the future resolves to its position (in position order)."""
        out: concurrent.futures.Future[Position] = concurrent.futures.Future()
        w = self._w

        def start() -> None:
            def relay(f: asyncio.Future[Position]) -> None:
                exc = f.exception()
                if exc is not None:
                    out.set_exception(exc)
                else:
                    out.set_result(f.result())

            w.append_async(payload).add_done_callback(relay)

        self._owner.loop.call_soon_threadsafe(start)
        return out

    def roll(self) -> int:
        """Roll to a new ledger now; returns its id."""
        return self._owner._run(self._w.roll())

    def close(self) -> None:
        self._owner._run(self._w.close())

    def __enter__(self) -> LogWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LogReader:
    """Synchronous view of :class:`ledgerstore.aio.LogReader`: ``for position, payload in reader``
    reads what is in the log now; :meth:`tail` keeps following it."""

    def __init__(self, owner: Client, reader: aio_log.LogReader) -> None:
        self._owner = owner
        self._r = reader

    @property
    def name(self) -> str:
        return self._r.name

    @property
    def position(self) -> Position | None:
        """Position of the next entry this reader returns."""
        return self._r.position

    @property
    def blocked_at(self) -> Position | None:
        """Where this reader waits at an OPEN ledger that later ledgers follow (None otherwise)."""
        return self._r.blocked_at

    def read_batch(self, max_entries: int = 1000) -> list[tuple[Position, bytes]]:
        """Up to ``max_entries`` next entries; ``[]`` if none is available right now."""
        return self._owner._run(self._r.read_batch(max_entries))

    def wait(self, timeout: float | None = None) -> bool:
        """Block until more entries may be available (or ``timeout``)."""
        return self._owner._run(self._r.wait(timeout))

    def __iter__(self) -> Iterator[tuple[Position, bytes]]:
        return self._iterate(self._r.follow)

    def tail(self) -> Iterator[tuple[Position, bytes]]:
        """Iterate forever, waiting for new entries."""
        return self._iterate(True)

    def _iterate(self, follow: bool) -> Iterator[tuple[Position, bytes]]:
        # one batch per loop-thread round trip: per-entry round trips would dominate
        while True:
            batch = self._owner._run(self._r._next_batch(follow))
            if batch is None:
                return
            for i, item in enumerate(batch):
                try:
                    yield item
                except GeneratorExit:  # a caller that stops mid-batch keeps the rest for later
                    self._r._unread(batch[i + 1:])
                    raise

    def close(self) -> None:
        self._owner._run(self._r.close())

    def __enter__(self) -> LogReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["LogReader", "LogWriter", "Position"]
