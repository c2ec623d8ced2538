"""The synchronous facade: ``ledgerstore.Client`` runs an asyncio client on a private loop thread
so scripts, notebooks and Spark executors can call it without async code."""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import threading
from collections.abc import Coroutine, Iterator, Sequence
from typing import Any, TypeVar

from ledgerstore.client import client as aio_client
from ledgerstore.client import ledger as aio_ledger
from ledgerstore.config import ClientConfig
from ledgerstore.meta.ledgers import LedgerMetadata
from ledgerstore.proto.digest import Entry

T = TypeVar("T")


class _LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="ledgerstore-client", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        if threading.current_thread() is self._thread:
            raise RuntimeError("synchronous ledgerstore calls cannot be made from the client's own loop thread")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        if not self.loop.is_running():
            self.loop.close()


class ReadHandle:
    """Synchronous view of :class:`ledgerstore.aio.ReadHandle`."""

    def __init__(self, owner: Client, handle: aio_ledger.ReadHandle) -> None:
        self._owner = owner
        self._h = handle

    @property
    def ledger_id(self) -> int:
        return self._h.ledger_id

    @property
    def last_add_confirmed(self) -> int:
        return self._h.last_add_confirmed

    @property
    def is_closed(self) -> bool:
        return self._h.is_closed

    @property
    def metadata(self) -> LedgerMetadata:
        return self._h.md

    def read(self, first: int, last: int | None = None, *, allow_beyond_lac: bool = False) -> list[Entry]:
        return self._owner._run(self._h.read(first, last, allow_beyond_lac=allow_beyond_lac))

    def __iter__(self) -> Iterator[Entry]:
        return self.iter_entries()

    def iter_entries(self, first: int = 0, last: int | None = None, batch: int = 1000,
                     read_ahead: int = 1) -> Iterator[Entry]:
        """Iterate entries in batches; ``read_ahead`` more batches are read while one is consumed."""
        end = self._h.last_add_confirmed if last is None else last
        loop = self._owner._lt.loop
        ahead: collections.deque[concurrent.futures.Future[list[Entry]]] = collections.deque()
        try:
            for lo in range(first, end + 1, batch):
                ahead.append(asyncio.run_coroutine_threadsafe(self._h.read(lo, min(end, lo + batch - 1)), loop))
                if len(ahead) > read_ahead:
                    yield from ahead.popleft().result()
            while ahead:
                yield from ahead.popleft().result()
        finally:
            for f in ahead:
                f.cancel()

    def read_last_add_confirmed(self) -> int:
        return self._owner._run(self._h.read_last_add_confirmed())

    def wait_for_lac(self, known: int, timeout: float = 10.0) -> int:
        return self._owner._run(self._h.wait_for_lac(known, timeout))

    def close(self) -> None:
        self._owner._run(self._h.close())

    def __enter__(self) -> ReadHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LedgerHandle(ReadHandle):
    """Synchronous view of :class:`ledgerstore.aio.LedgerHandle`."""

    _h: aio_ledger.LedgerHandle

    def __init__(self, owner: Client, handle: aio_ledger.LedgerHandle) -> None:
        super().__init__(owner, handle)
        self._inbox: list[tuple[Any, concurrent.futures.Future[int], bool]] = []
        self._inbox_lock = threading.Lock()
        self._drain_scheduled = False

    def append(self, payload: bytes) -> int:
        """Add an entry; blocks until it is acknowledged and returns its entry id."""
        return self.append_async(payload).result()

    def append_async(self, payload: bytes) -> concurrent.futures.Future[int]:
        """Queue an add; the future resolves to the entry id (acks complete in entry order).

        Adds queued from this thread while the client's loop is busy are handed over in one
        wake-up, not one per entry."""
        return self._queue(payload, False)

    def append_many(self, payloads: Sequence[bytes]) -> int:
        """Add many entries (consecutive ids); blocks until all are acknowledged and returns the
        last one's entry id."""
        return self.append_many_async(payloads).result()

    def append_many_async(self, payloads: Sequence[bytes]) -> concurrent.futures.Future[int]:
        """Queue many adds; the future resolves to the last one's entry id once all of them are
        acknowledged. One future per batch instead of one per entry."""
        return self._queue(list(payloads), True)

    def _queue(self, what: Any, many: bool) -> concurrent.futures.Future[int]:
        out: concurrent.futures.Future[int] = concurrent.futures.Future()
        with self._inbox_lock:
            self._inbox.append((what, out, many))
            wake = not self._drain_scheduled
            self._drain_scheduled = True
        if wake:
            self._owner._lt.loop.call_soon_threadsafe(self._drain)
        return out

    def _drain(self) -> None:
        with self._inbox_lock:
            items = self._inbox
            self._inbox = []
            self._drain_scheduled = False
        h = self._h
        for what, out, many in items:
            fut = h.append_many_async(what) if many else h.append_async(what)
            fut.add_done_callback(lambda f, out=out: _relay(f, out))


def _relay(f: asyncio.Future[int], out: concurrent.futures.Future[int]) -> None:
    if f.cancelled():
        out.cancel()
    elif f.exception() is not None:
        out.set_exception(f.exception())  # type: ignore[arg-type]
    else:
        out.set_result(f.result())


class Client:
    """Synchronous ledgerstore client.

    >>> client = Client(metadata="sqlite:///tmp/cluster/metadata.db")   # doctest: +SKIP
    >>> lh = client.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, password=b"pw")  # doctest: +SKIP
    """

    def __init__(self, metadata: str | None = None, *, config: ClientConfig | None = None, **overrides: Any) -> None:
        self._lt = _LoopThread()
        try:
            self._aio = aio_client.Client(metadata, config=config, **overrides)
            self._run(self._aio.start())
        except BaseException:
            self._lt.stop()
            raise

    @classmethod
    def from_config(cls, path: str, **overrides: Any) -> Client:
        from ledgerstore.config import load_client_config

        return cls(config=load_client_config(path, **overrides))

    @property
    def aio(self) -> aio_client.Client:
        """The underlying asyncio client (its coroutines must run on :attr:`loop`)."""
        return self._aio

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._lt.loop

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._lt.run(coro)

    def create_ledger(self, ensemble: int | None = None, write_quorum: int | None = None,
                      ack_quorum: int | None = None, digest: str | None = None, password: bytes = b"",
                      custom_metadata: dict[str, str] | None = None) -> LedgerHandle:
        h = self._run(self._aio.create_ledger(ensemble, write_quorum, ack_quorum, digest, password, custom_metadata))
        return LedgerHandle(self, h)

    def open_ledger(self, ledger_id: int, password: bytes = b"", recovery: bool = True) -> ReadHandle:
        return ReadHandle(self, self._run(self._aio.open_ledger(ledger_id, password, recovery)))

    def delete_ledger(self, ledger_id: int) -> None:
        self._run(self._aio.delete_ledger(ledger_id))

    def list_ledgers(self) -> list[int]:
        return self._run(self._aio.list_ledgers())

    def ledger_metadata(self, ledger_id: int) -> LedgerMetadata:
        return self._run(self._aio.ledger_metadata(ledger_id))

    def list_bookies(self, read_only: bool | None = None) -> list[Any]:
        return self._run(self._aio.list_bookies(read_only))

    def close(self) -> None:
        try:
            self._run(self._aio.close())
        finally:
            self._lt.stop()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- logs ----------------------------------------------------------------------------------

    def open_log(self, name: str, *, ensemble: int | None = None, write_quorum: int | None = None,
                 ack_quorum: int | None = None, digest: str | None = None, password: bytes = b"",
                 roll_size_bytes: int | None = None, roll_interval_s: float | None = None,
                 create: bool = True) -> LogWriter:
        """Become the leader of log ``name`` (see :meth:`ledgerstore.aio.Client.open_log`)."""
        w = self._run(self._aio.open_log(
            name, ensemble=ensemble, write_quorum=write_quorum, ack_quorum=ack_quorum, digest=digest,
            password=password, roll_size_bytes=roll_size_bytes, roll_interval_s=roll_interval_s, create=create))
        return LogWriter(self, w)

    def open_log_reader(self, name: str, start: Position | tuple[int, int] | str = "earliest", *,
                        password: bytes = b"", follow: bool = False, poll_interval_s: float = 0.5,
                        batch_size: int = 1000) -> LogReader:
        """Read log ``name`` from ``start`` without fencing (see :meth:`ledgerstore.aio.Client.open_log_reader`)."""
        r = self._run(self._aio.open_log_reader(name, start, password=password, follow=follow,
                                                poll_interval_s=poll_interval_s, batch_size=batch_size))
        return LogReader(self, r)

    def list_logs(self) -> list[str]:
        return self._run(self._aio.list_logs())

    def delete_log(self, name: str, password: bytes = b"") -> None:
        self._run(self._aio.delete_log(name, password))

    def truncate_log(self, name: str, before: Position | tuple[int, int] | str) -> list[int]:
        return self._run(self._aio.truncate_log(name, before))


from ledgerstore.client.log_sync import LogReader, LogWriter  # noqa: E402  (needs Client defined first)
from ledgerstore.meta.logs import Position  # noqa: E402
