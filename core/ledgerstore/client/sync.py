"""The synchronous API: ``ledgerstore.Client`` and its handles, for scripts, notebooks and Spark
executors.

Every class here is generated from its asyncio counterpart (:mod:`ledgerstore.client._mirror`):
each coroutine method becomes a blocking method of the same name, signature and docstring,
running on the process's one ledgerstore loop thread, so the two APIs cannot drift. Written by
hand is only what must differ: building and closing a client, and the append inbox that lets many
blocking adds from any number of threads reach the loop in one wake-up and share one batch.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ledgerstore.client import client as aio_client
from ledgerstore.client import ledger as aio_ledger
from ledgerstore.client import log as aio_log
from ledgerstore.client import read as aio_read
from ledgerstore.client._mirror import (
    SyncWrapper,
    acquire,
    call_timeout,
    iterate,
    relay,
    release,
    run,
    wait_future,
)
from ledgerstore.config import load_client_config
from ledgerstore.errors import LedgerStoreError
from ledgerstore.meta.logs import Position
from ledgerstore.proto.digest import Entry


class _Inbox:
    """Adds handed from any thread to the loop: one wake-up per burst, not one per entry, so
    adds queued while the loop is busy leave in one batch."""

    def __init__(self, loop: asyncio.AbstractEventLoop, submit: Callable[[Any], asyncio.Future[Any]]) -> None:
        self._loop = loop
        self._submit = submit  # called on the loop
        self._items: list[tuple[Any, concurrent.futures.Future[Any]]] = []
        self._lock = threading.Lock()
        self._scheduled = False

    def put(self, item: Any) -> concurrent.futures.Future[Any]:
        out: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._lock:
            self._items.append((item, out))
            wake = not self._scheduled
            self._scheduled = True
        if wake:
            try:
                self._loop.call_soon_threadsafe(self._drain)
            except RuntimeError:  # the loop is closed: so is the client
                with self._lock:
                    items, self._items = self._items, []
                    self._scheduled = False
                for _, refused in items:
                    refused.set_exception(LedgerStoreError("the ledgerstore client this handle belongs to is closed"))
        return out

    def _drain(self) -> None:
        with self._lock:
            items, self._items = self._items, []
            self._scheduled = False
        submit = self._submit
        for item, out in items:
            submit(item).add_done_callback(functools.partial(relay, out=out))


class ReadHandle(SyncWrapper, mirrors=aio_read.ReadHandle):
    """Synchronous view of :class:`ledgerstore.aio.ReadHandle` (methods generated from it)."""

    _attributes = ("ledger_id",)

    # sync-only conveniences kept from the hand-written facade
    def __iter__(self) -> Iterator[Entry]:
        """Every entry up to the last add confirmed, read in batches."""
        entries: Iterator[Entry] = self.iter_entries()  # generated from the async one
        return entries

    def __enter__(self) -> ReadHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LedgerHandle(ReadHandle, mirrors=aio_ledger.LedgerHandle):
    """Synchronous view of :class:`ledgerstore.aio.LedgerHandle` (methods generated from it, the
    appends written by hand: they go through one inbox per handle)."""

    def __init__(self, obj: aio_ledger.LedgerHandle, loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(obj, loop)
        self._inbox = _Inbox(self.loop, self._submit)

    def _submit(self, item: tuple[bool, Any]) -> asyncio.Future[int]:
        many, what = item
        ledger: aio_ledger.LedgerHandle = self.aio
        return ledger.append_many_async(what) if many else ledger.append_async(what)

    def append(self, payload: bytes) -> int:
        """Add an entry; blocks until it is acknowledged and returns its entry id."""
        return wait_future(self.append_async(payload))

    def append_async(self, payload: bytes) -> concurrent.futures.Future[int]:
        """Queue an add; the future resolves to the entry id (acks complete in entry order).

        Adds queued from any thread while the client's loop is busy are handed over in one
        wake-up, not one per entry."""
        return self._inbox.put((False, payload))

    def append_many(self, payloads: Sequence[bytes]) -> int:
        """Add many entries (consecutive ids); blocks until all are acknowledged and returns the
        last one's entry id."""
        return wait_future(self.append_many_async(payloads))

    def append_many_async(self, payloads: Sequence[bytes]) -> concurrent.futures.Future[int]:
        """Queue many adds; the future resolves to the last one's entry id once all of them are
        acknowledged. One future per batch instead of one per entry."""
        return self._inbox.put((True, list(payloads)))


class LogWriter(SyncWrapper, mirrors=aio_log.LogWriter):
    """Synchronous view of :class:`ledgerstore.aio.LogWriter` (methods generated from it, the
    appends written by hand: they go through one inbox per writer)."""

    _attributes = ("name",)

    def __init__(self, obj: aio_log.LogWriter, loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(obj, loop)
        self._inbox = _Inbox(self.loop, self._submit)

    def _submit(self, item: tuple[bool, Any, int | None, str | None]) -> asyncio.Future[Position]:
        many, what, seq, producer_id = item
        writer: aio_log.LogWriter = self.aio
        if many:
            return writer.append_many_async(what, first_seq=seq, producer_id=producer_id)
        return writer.append_async(what, seq=seq, producer_id=producer_id)

    def append(self, payload: bytes, *, seq: int | None = None, producer_id: str | None = None) -> Position:
        """Add an entry; blocks until it is acknowledged and returns its position (with ``seq``:
        of the entry holding that sequence, which a duplicate does not write again)."""
        return wait_future(self.append_async(payload, seq=seq, producer_id=producer_id))

    def append_async(self, payload: bytes, *, seq: int | None = None,
                     producer_id: str | None = None) -> concurrent.futures.Future[Position]:
        """Queue an add; the future resolves to its position (in position order)."""
        return self._inbox.put((False, payload, seq, producer_id))

    def append_many(self, payloads: Sequence[bytes], *, first_seq: int | None = None,
                    producer_id: str | None = None) -> Position:
        """Add many entries; blocks until all are acknowledged and returns the last one's position."""
        return wait_future(self.append_many_async(payloads, first_seq=first_seq, producer_id=producer_id))

    def append_many_async(self, payloads: Sequence[bytes], *, first_seq: int | None = None,
                          producer_id: str | None = None) -> concurrent.futures.Future[Position]:
        """Queue many adds; the future resolves to the last one's position once all are acknowledged."""
        return self._inbox.put((True, list(payloads), first_seq, producer_id))


def _pairs(records: Iterator[aio_log.LogRecord]) -> Iterator[tuple[Position, bytes]]:
    for rec in records:
        yield rec[0], rec[1]


class LogReader(SyncWrapper, mirrors=aio_log.LogReader):
    """Synchronous view of :class:`ledgerstore.aio.LogReader`: ``for position, payload in reader``
    reads what is in the log now; ``tail()`` keeps following it; ``records()`` yields
    :class:`~ledgerstore.aio.LogRecord` s.

    Iterators read ahead of the caller without a loop round trip per entry; what a ``for`` loop
    left early had read ahead is returned first by the next ``for`` loop or :meth:`read_batch`,
    and :attr:`position` counts it as not read yet. Written by hand: every iterator reads
    records into that one cursor, and the plain ones hand out ``(position, payload)`` from it, so
    a ``records()`` loop and a ``for`` loop can follow each other without losing anything."""

    _attributes = ("name", "follow", "poll_interval_s", "batch_size", "open_ledger_grace_s")
    _shared_cursor = True

    def _records(self, follow: bool | None) -> Iterator[aio_log.LogRecord]:
        reader: aio_log.LogReader = self.aio
        return iterate(self.loop, lambda: reader.records(follow), self._unconsumed)

    def __iter__(self) -> Iterator[tuple[Position, bytes]]:
        """Every entry from the reader's position on, as ``(position, payload)``."""
        return _pairs(self._records(None))

    def tail(self) -> Iterator[tuple[Position, bytes]]:
        """Iterate forever: every entry from the reader's position on, waiting for new ones."""
        return _pairs(self._records(True))

    def records(self, follow: bool | None = None) -> Iterator[aio_log.LogRecord]:
        """Iterate as ``for`` does (``follow``: as :meth:`tail` does), yielding records with the
        producer and sequence each entry was appended with."""
        return self._records(follow)

    @property
    def position(self) -> Position | None:
        """Position of the next entry this reader returns (None when it waits for a new ledger)."""
        reader: aio_log.LogReader = self.aio
        if self._unconsumed:
            first: aio_log.LogRecord = self._unconsumed[0]
            return first.position
        return reader.position

    def read_batch(self, max_entries: int = 1000) -> list[tuple[Position, bytes]]:
        """Up to ``max_entries`` next entries in log order; ``[]`` if none is available right now."""
        if not self._unconsumed:
            return run(self.aio.read_batch(max_entries), self.loop)
        n = min(max_entries, len(self._unconsumed))
        pop = self._unconsumed.popleft
        return [pop()[:2] for _ in range(n)]

    def wait(self, timeout: float | None = None) -> bool:
        """Block until more entries may be available (or ``timeout``); True if :meth:`read_batch`
        now has something."""
        return bool(self._unconsumed) or run(self.aio.wait(timeout), self.loop)


class Client(SyncWrapper, mirrors=aio_client.Client):
    """Synchronous ledgerstore client (methods generated from :class:`ledgerstore.aio.Client`).

    >>> client = Client(metadata="sqlite:///tmp/cluster/metadata.db")   # doctest: +SKIP
    >>> lh = client.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, password=b"pw")  # doctest: +SKIP
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(aio_client.Client(*args, **kwargs), acquire())
        self._closed = False
        try:
            run(self.aio.start(), self.loop)
        except BaseException:
            self._closed = True
            release()
            raise

    # a function's attributes live in its __dict__ (inspect.signature reads __signature__ there)
    vars(__init__)["__signature__"] = inspect.signature(aio_client.Client.__init__)

    @classmethod
    def from_config(cls, path: str, **overrides: Any) -> Client:
        """A client configured by the ``[client]`` table of the TOML file at ``path``."""
        return cls(config=load_client_config(path, **overrides))

    def close(self) -> None:
        """Close the client's connections and metadata session (the loop thread stops with the
        last open client)."""
        if self._closed:
            return
        self._closed = True
        try:
            run(self.aio.close(), self.loop)
        finally:
            release()

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["Client", "LedgerHandle", "LogReader", "LogWriter", "Position", "ReadHandle", "call_timeout"]
